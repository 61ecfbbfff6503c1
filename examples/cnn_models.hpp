#pragma once
// The three convolutional models of examples/fashion_mnist_cnn.cpp, for [N, 1, 28, 28] images and
// 10 classes. Their PyTorch twins, with the same state_dict names, are in tests/cnn_models.py.
//
//   lenet   LeNet-5 as in the PyTorch tutorials: two 5x5 convolutions with max pooling, three
//           fully connected layers (61,706 parameters)
//   convbn  three 3x3 convolutions with BatchNorm2d, two max poolings, a 128-unit hidden layer
//           with dropout (431,146 parameters)
//   resnet  a CIFAR-style ResNet: stem, 3 stages of 2 BasicBlocks (16, 32, 64 channels, strides
//           1, 2, 2), global average pooling, a linear classifier

#include <xtrain/xtrain.hpp>

namespace cnn_models {

namespace nn = xtrain::layers;

inline auto lenet() {
  return nn::Sequential{nn::Conv2d{1, 6, 5, 1, 2},
                        nn::ReLU{},
                        nn::MaxPool2d{2},
                        nn::Conv2d{6, 16, 5},
                        nn::ReLU{},
                        nn::MaxPool2d{2},
                        nn::Flatten{},
                        nn::Linear{400, 120},
                        nn::ReLU{},
                        nn::Linear{120, 84},
                        nn::ReLU{},
                        nn::Linear{84, 10}};
}

inline auto convbn(bool sync_bn = false) {
  return nn::Sequential{nn::Conv2d{1, 32, 3, 1, 1},
                        nn::BatchNorm2d{32}.sync_stats(sync_bn),
                        nn::ReLU{},
                        nn::Conv2d{32, 32, 3, 1, 1},
                        nn::BatchNorm2d{32}.sync_stats(sync_bn),
                        nn::ReLU{},
                        nn::MaxPool2d{2},
                        nn::Conv2d{32, 64, 3, 1, 1},
                        nn::BatchNorm2d{64}.sync_stats(sync_bn),
                        nn::ReLU{},
                        nn::MaxPool2d{2},
                        nn::Flatten{},
                        nn::Linear{3136, 128},
                        nn::ReLU{},
                        nn::Dropout{0.25f},
                        nn::Linear{128, 10}};
}

inline auto resnet(bool sync_bn = false) {
  return nn::Sequential{nn::Conv2d{1, 16, 3, 1, 1, 1, 1, false},
                        nn::BatchNorm2d{16}.sync_stats(sync_bn),
                        nn::ReLU{},
                        nn::BasicBlock{16, 16}.sync_stats(sync_bn),
                        nn::BasicBlock{16, 16}.sync_stats(sync_bn),
                        nn::BasicBlock{16, 32, 2}.sync_stats(sync_bn),
                        nn::BasicBlock{32, 32}.sync_stats(sync_bn),
                        nn::BasicBlock{32, 64, 2}.sync_stats(sync_bn),
                        nn::BasicBlock{64, 64}.sync_stats(sync_bn),
                        nn::AdaptiveAvgPool2d{1},
                        nn::Flatten{},
                        nn::Linear{64, 10}};
}

}  // namespace cnn_models

// core/concepts.hpp: modules, losses and optimizers satisfy their concepts and other types do not.
#include <catch2/catch.hpp>

#include "xtrain/xtrain.hpp"

using namespace xtrain;
namespace nn = xtrain::layers;

TEST_CASE("Concepts: modules, losses and optimizers are recognised and other types are not", "[concepts]") {
  static_assert(Module<nn::Linear> && Module<nn::BatchNorm1d> && Module<nn::ReLU> && Module<nn::GELU> &&
                Module<nn::Dropout> && Module<nn::Sequential<nn::Linear, nn::ReLU>> &&
                Module<nn::Residual<nn::Sequential<nn::Linear, nn::ReLU>>>);
  static_assert(!Module<int> && !Module<optim::Adam>);
  static_assert(loss::Loss<loss::CrossEntropyLoss> && loss::Loss<loss::MSELoss> && !loss::Loss<nn::Linear>);
  static_assert(Optimizer<optim::SGD> && Optimizer<optim::Adam> && Optimizer<optim::AdamW>);
  static_assert(!Optimizer<nn::Linear>);
  static_assert(ModuleFor<nn::Linear, bf16> && ModuleFor<nn::BatchNorm1d, fp16> && ModuleFor<nn::SiLU, bf16> &&
                ModuleFor<nn::Dropout, fp16> && ModuleFor<nn::Sequential<nn::Linear, nn::ReLU>, bf16>);
  SUCCEED();
}

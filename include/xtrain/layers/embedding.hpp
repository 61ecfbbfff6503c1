#pragma once
/// \file embedding.hpp
/// Embedding(num, dim): row `id` of a [num, dim] table for every int32 id, PyTorch's nn.Embedding
/// (weight [num, dim], initialised N(0, 1)). The gradient adds each id's output gradient into
/// its row, in the order of the ids (rows no id used stay zero: the optimizer's update is the
/// dense one, as PyTorch's AdamW on a dense gradient).

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "xtrain/core/context.hpp"
#include "xtrain/core/error.hpp"
#include "xtrain/core/module.hpp"
#include "xtrain/core/param.hpp"
#include "xtrain/core/rng.hpp"
#include "xtrain/core/saved_input.hpp"
#include "xtrain/core/tensor.hpp"
#include "xtrain/kernels/convert.hpp"

namespace xtrain::layers {

class Embedding {
 public:
  /// Requires num > 0, dim > 0. Draws the table from `default_generator()`.
  Embedding(std::size_t num_embeddings, std::size_t embedding_dim)
      : num_(num_embeddings), dim_(embedding_dim), weight_({num_embeddings, embedding_dim}) {
    XTRAIN_CHECK(num_embeddings > 0 && embedding_dim > 0, ValueError, "Embedding(", num_embeddings, ", ", embedding_dim,
                 "): both sizes must be positive");
    reset_parameters(default_generator());
  }

  /// Re-draws the table N(0, 1), as PyTorch's `reset_parameters`.
  void reset_parameters(Generator& gen) {
    for (float& w : weight_.values()) w = gen.normal();
  }

  /// y[..., :] = weight[ids[...], :]: ids of any shape, y of shape ids.shape + [dim], stored as T.
  /// Throws ValueError naming the first id outside [0, num). Keeps a pointer to ids for backward.
  template <ActivationType T>
  const Tensor<T>& forward(Context&, const Tensor<std::int32_t>& ids) {
    const std::size_t n = ids.size();
    for (std::size_t i = 0; i < n; ++i)
      XTRAIN_CHECK(ids.data()[i] >= 0 && static_cast<std::size_t>(ids.data()[i]) < num_, ValueError, describe(),
                   ": id ", ids.data()[i], " at position ", i, " is outside [0, ", num_, ")");
    Tensor<T>& y = y_.get<T>();
    y.resize(ids.shape().appended(dim_));
    const float* w = weight_.data();
    for (std::size_t i = 0; i < n; ++i)
      kernels::from_float(w + static_cast<std::size_t>(ids.data()[i]) * dim_, y.data() + i * dim_, dim_);
    ids_ = &ids;
    type_.save_type<T>();
    return y;
  }

  /// weight.grad[ids[i]] += dy[i] for every position i, in order. Returns an empty tensor (ids
  /// have no gradient).
  template <ActivationType T>
  const Tensor<T>& backward(Context&, const Tensor<T>& dy) {
    type_.check<T>(*this);  // (and so ids_ is set)
    const std::size_t n = ids_->size();
    XTRAIN_CHECK(dy.size() == n * dim_ && dy.cols() == dim_, ShapeError, describe(), ": gradient has shape ",
                 dy.shape().str(), ", expected ", y_.get<T>().shape().str());
    float* g = weight_.grad();
    float row[256];
    for (std::size_t i = 0; i < n; ++i) {
      float* gr = g + static_cast<std::size_t>(ids_->data()[i]) * dim_;
      const T* d = dy.data() + i * dim_;
      if constexpr (std::is_same_v<T, float>) {
        for (std::size_t j = 0; j < dim_; ++j) gr[j] += d[j];
      } else {
        for (std::size_t j0 = 0; j0 < dim_; j0 += 256) {
          const std::size_t len = std::min<std::size_t>(256, dim_ - j0);
          kernels::to_float(d + j0, row, len);
          for (std::size_t j = 0; j < len; ++j) gr[j0 + j] += row[j];
        }
      }
    }
    Tensor<T>& dx = dx_.get<T>();
    dx.resize({0});
    return dx;
  }

  template <class V>
  void visit(V& v) {
    v.param("weight", weight_, ParamKind::embedding);
  }

  Param& weight() noexcept { return weight_; }
  std::size_t num_embeddings() const noexcept { return num_; }
  std::size_t embedding_dim() const noexcept { return dim_; }
  std::string describe() const { return "Embedding(" + std::to_string(num_) + ", " + std::to_string(dim_) + ")"; }

 private:
  std::size_t num_, dim_;
  Param weight_;
  const Tensor<std::int32_t>* ids_ = nullptr;
  SavedInput type_;  // the output's type (the ids are not activations)
  ActivationBuffers y_, dx_;
};

}  // namespace xtrain::layers

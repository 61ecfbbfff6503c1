#pragma once
/// \file saved_input.hpp
/// SavedInput: what a module keeps of its forward for backward, and the checks that go with it.
/// A module saves its input tensor (or only its activation type, when it keeps what it needs in
/// buffers of its own), and backward gets it back through `get<T>(module)`, which throws
/// ValueError naming the module when no forward ran or when backward runs in another type than
/// the forward did. The input is kept by address: the caller keeps it alive and unchanged until
/// backward, which containers and the engine guarantee.

#include "xtrain/core/error.hpp"
#include "xtrain/core/tensor.hpp"

namespace xtrain {

class SavedInput {
 public:
  /// Keeps `x` (by address) and its activation type.
  template <ActivationType T>
  void save(const Tensor<T>& x) noexcept {
    x_ = &x;
    type_ = activation_type_index<T>;
  }
  /// Keeps only the activation type of a forward in T (the module keeps its own tensors).
  template <ActivationType T>
  void save_type() noexcept {
    x_ = nullptr;
    type_ = activation_type_index<T>;
  }

  /// Throws ValueError naming `who` (a module: name_of) unless a forward ran and it ran in T.
  template <ActivationType T, class Who>
  void check(const Who& who) const {
    XTRAIN_CHECK(type_ >= 0, ValueError, name_of(who), ": backward called before forward");
    XTRAIN_CHECK(type_ == activation_type_index<T>, ValueError, name_of(who), ": backward in ",
                 activation_type_name(activation_type_index<T>), " after a forward in ", activation_type_name(type_));
  }
  /// The saved input, after check<T>(who).
  template <ActivationType T, class Who>
  const Tensor<T>& get(const Who& who) const {
    check<T>(who);
    XTRAIN_CHECK(x_ != nullptr, ValueError, name_of(who), ": its forward kept no input");
    return *static_cast<const Tensor<T>*>(x_);
  }
  /// Whether a forward ran.
  bool saved() const noexcept { return type_ >= 0; }

 private:
  const void* x_ = nullptr;  // the Tensor<T> of the last forward
  int type_ = -1;            // its activation_type_index; -1: no forward yet
};

}  // namespace xtrain

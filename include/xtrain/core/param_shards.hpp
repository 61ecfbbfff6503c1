#pragma once
/// \file param_shards.hpp
/// The seam between a unit of sharded parameters (layers::ShardedUnit) and what keeps them sharded
/// over the ranks (ZeRO-3, parallel::ShardedSync): the unit asks for its parameters before its
/// forward and its backward and gives them back after. Type-erased, so that layers do not depend
/// on the communicator.

#include <cstddef>

namespace xtrain {

class ParamShards {
 public:
  /// Makes unit `unit`'s parameters whole on this rank for its forward or, `backward`, its
  /// backward (collective: every rank calls it for the same unit in the same order; the pass
  /// says which unit runs next, for prefetching). Calls nest: the parameters stay until the
  /// matching release().
  virtual void gather(std::size_t unit, bool backward) = 0;
  /// Gives back what gather() brought, once its last gather() is released (this rank's shard stays).
  virtual void release(std::size_t unit) = 0;

 protected:
  ParamShards() = default;
  ParamShards(const ParamShards&) = default;
  ParamShards& operator=(const ParamShards&) = default;
  ~ParamShards() = default;
};

}  // namespace xtrain

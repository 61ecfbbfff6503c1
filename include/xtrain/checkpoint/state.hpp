#pragma once
/// \file state.hpp
/// The training state a checkpoint holds, independent of the number of ranks: parameters and
/// buffers by name and shape, the optimizer state, the LR schedule, the step, the epoch and the
/// position in it, the epoch's running metric sums, the RNG counters, the data order seed, user
/// objects registered for checkpointing, and signatures of the model and of the configuration.

#include <cstdint>
#include <functional>
#include <span>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <boost/archive/binary_iarchive.hpp>
#include <boost/archive/binary_oarchive.hpp>
#include <boost/serialization/nvp.hpp>
#include <boost/serialization/string.hpp>
#include <boost/serialization/utility.hpp>
#include <boost/serialization/vector.hpp>

#include "xtrain/checkpoint/archive.hpp"
#include "xtrain/core/module.hpp"
#include "xtrain/core/param_arena.hpp"
#include "xtrain/core/rng.hpp"
#include "xtrain/optim/param_groups.hpp"
#include "xtrain/optim/schedule.hpp"
#include "xtrain/precision/policy.hpp"
#include "xtrain/version.hpp"

namespace xtrain::checkpoint {

using boost::serialization::make_nvp;

/// A float tensor by name (parameters, float buffers).
struct NamedTensor {
  std::string name;
  std::vector<std::uint64_t> shape;
  std::vector<float> values;
  template <class Archive>
  void serialize(Archive& ar, unsigned) {
    ar& make_nvp("name", name);
    ar& make_nvp("shape", shape);
    ar& make_nvp("values", values);
  }
};

/// Where training stands (its position: step, epoch, samples into the epoch, and the counters
/// that go with them): enough to continue bit-exactly.
struct Position {
  std::uint64_t step = 0;                  ///< optimizer steps taken
  std::uint64_t epoch = 0;                 ///< completed epochs
  std::uint64_t samples_in_epoch = 0;      ///< samples of the current epoch already trained on
  std::uint64_t global_batch = 0;          ///< samples per global step when saved
  std::uint64_t data_seed = 0;             ///< seed of the data order and dropout
  double epoch_sums[4] = {0, 0, 0, 0};     ///< loss sum, correct, terms, samples of the current epoch (all ranks)
  float loss_scale = 0.0f;                 ///< dynamic loss scale (fp16); 0: the run did not scale
  std::uint64_t loss_scale_tracker = 0;    ///< clean steps since the scale last changed
  std::uint64_t skipped_steps = 0;         ///< steps skipped for Inf/NaN gradients
  std::vector<optim::GroupScales> groups;  ///< parameter groups (default first) and their multipliers
  std::vector<std::uint64_t> param_group;  ///< each arena slot's group

  /// Records the loss scaler (`scaling`: the run scales the loss, fp16) and the parameter groups
  /// of `arena` (their multipliers `groups`).
  void record(const DynamicLossScaler& scaler, bool scaling, const std::vector<optim::GroupScales>& scale_groups,
              const ParamArena& arena) {
    loss_scale = scaling ? scaler.scale() : 0.0f;
    loss_scale_tracker = scaler.growth_tracker();
    skipped_steps = scaler.skipped_steps();
    groups = scale_groups;
    param_group.clear();
    for (const auto& e : arena.entries()) param_group.push_back(e.group);
  }
  /// Restores `scaler`: fp16 to fp16 it continues where it was; a run that did not scale (or does
  /// not now) starts at `configured` scale. Skipped steps count either way: the schedule's
  /// position depends on them.
  void restore(DynamicLossScaler& scaler, bool scaling, float configured) const {
    const bool scaled = loss_scale > 0.0f;
    scaler.restore(scaled && scaling ? loss_scale : configured, scaled ? loss_scale_tracker : 0, skipped_steps);
  }
  template <class Archive>
  void serialize(Archive& ar, unsigned) {
    ar& make_nvp("step", step);
    ar& make_nvp("epoch", epoch);
    ar& make_nvp("samples_in_epoch", samples_in_epoch);
    ar& make_nvp("global_batch", global_batch);
    ar& make_nvp("data_seed", data_seed);
    ar& make_nvp("epoch_sums", epoch_sums);
    ar& make_nvp("loss_scale", loss_scale);
    ar& make_nvp("loss_scale_tracker", loss_scale_tracker);
    ar& make_nvp("skipped_steps", skipped_steps);
    ar& make_nvp("groups", groups);
    ar& make_nvp("param_group", param_group);
  }
};

/// How a training state is split (format 4): not at all (`count` 0: everything in state.xtrain),
/// or into `count` shard files (checkpoint/sharded.hpp) written by the ranks of a sharded run
/// (ZeRO), each holding a piece of the parameter values and of every optimizer state vector in the
/// checkpoint's rank-count-independent layout: `ranges[i]` lists shard i's pieces (start, count:
/// in elements of `elems` bytes), values first; `id` ties the shard files to their state file.
struct ShardInfo {
  std::uint64_t count = 0;
  std::string id;
  std::vector<std::uint64_t> elems;
  std::vector<std::vector<std::uint64_t>> ranges;
  template <class Archive>
  void serialize(Archive& ar, unsigned) {
    ar& make_nvp("count", count);
    ar& make_nvp("id", id);
    ar& make_nvp("elems", elems);
    ar& make_nvp("ranges", ranges);
  }
};

/// An object saved with the training state: anything with `serialize(Archive&, unsigned)`.
struct Registered {
  std::function<void(boost::archive::binary_oarchive&)> save;
  std::function<void(boost::archive::binary_iarchive&)> load;
};

/// "name shape" per parameter, then per buffer: what a checkpoint must match to be loaded.
template <class Model>
std::vector<std::string> model_signature(Model& model, const ParamArena& arena) {
  std::vector<std::string> sig;
  for (const auto& e : arena.entries()) {
    sig.push_back(e.name + " f32 " + shape_string(e.shape));
    for (const auto& alias : e.aliases) sig.push_back(alias + " tied to " + e.name);
  }
  xtrain::visit_buffers(model, [&](const std::string& name, auto&& buffer) {
    if constexpr (std::is_same_v<std::remove_cvref_t<decltype(buffer)>, Tensor<float>>)
      sig.push_back(name + " f32 " + buffer.shape().str());
    else
      sig.push_back(name + " i64 []");
  });
  return sig;
}

/// Serialises the state. Requires: called identically on every rank (the bytes are rank 0's).
/// With `shards.count` > 0 the parameters' values and `state` are in the shard files: the
/// parameters are written without values, `state` should be empty.
template <class Model, class Optimizer>
std::string encode(Model& model, ParamArena& arena, const Optimizer& optimizer, typename Optimizer::State& state,
                   const optim::LrSchedule& schedule, const Position& position, const std::vector<Registered>& objects,
                   const ShardInfo& shards = {}) {
  std::ostringstream os(std::ios::binary);
  {
    boost::archive::binary_oarchive ar(os, boost::archive::no_header);
    ShardInfo split = shards;
    ar << make_nvp("shards", split);
    std::string library = version_string, optimizer_name = Optimizer::name;
    ar << make_nvp("library", library);
    std::vector<std::string> signature = model_signature(model, arena);
    ar << make_nvp("model", signature);
    ar << make_nvp("optimizer", optimizer_name);
    float lr = optimizer.learning_rate();
    ar << make_nvp("base_lr", lr);
    std::vector<NamedTensor> params;
    for (const auto& e : arena.entries()) {
      auto v = shards.count ? std::span<float>() : arena.values(e);
      params.push_back({e.name, {e.shape.begin(), e.shape.end()}, {v.begin(), v.end()}});
    }
    ar << make_nvp("params", params);
    std::vector<NamedTensor> buffers;
    std::vector<std::pair<std::string, std::int64_t>> counters;
    xtrain::visit_buffers(model, [&](const std::string& name, auto&& buffer) {
      if constexpr (std::is_same_v<std::remove_cvref_t<decltype(buffer)>, Tensor<float>>)
        buffers.push_back({name, {buffer.shape().begin(), buffer.shape().end()}, {buffer.begin(), buffer.end()}});
      else
        counters.emplace_back(name, buffer);
    });
    ar << make_nvp("buffers", buffers);
    ar << make_nvp("counters", counters);
    ar << make_nvp("optimizer_state", state);
    optim::LrSchedule s = schedule;
    ar << make_nvp("schedule", s);
    Position p = position;
    ar << make_nvp("progress", p);
    Generator g = default_generator();
    ar << make_nvp("default_generator", g);
    for (const auto& o : objects) o.save(ar);
  }
  return os.str();
}

/// How the state in `payload` (of format `version`) is split; `source` names the file in errors.
inline ShardInfo shard_info(const std::string& payload, std::uint32_t version, const std::string& source) {
  ShardInfo shards;
  if (version < 4) return shards;
  std::istringstream is(payload, std::ios::binary);
  try {
    boost::archive::binary_iarchive ar(is, boost::archive::no_header);
    ar >> make_nvp("shards", shards);
  } catch (const boost::archive::archive_exception& e) {
    throw CheckpointError(source + ": unreadable training state (" + e.what() + ")");
  }
  XTRAIN_CHECK(shards.ranges.size() == shards.count, CheckpointError, source, ": lists ", shards.ranges.size(),
               " shards of ", shards.count);
  for (const auto& r : shards.ranges)
    XTRAIN_CHECK(r.size() == 2 * shards.elems.size(), CheckpointError, source, ": a shard lists ", r.size() / 2,
                 " pieces of ", shards.elems.size(), " state vectors");
  return shards;
}

/// Restores the state from `payload` (of format `version`); `source` names the file in errors.
/// A sharded state (shard_info(...).count > 0) restores all but the parameters' values and the
/// optimizer state (`state` left empty): they are in the shard files. Throws CheckpointError
/// when the checkpoint belongs to another model or optimizer.
template <class Model, class Optimizer>
Position decode(const std::string& payload, std::uint32_t version, const std::string& source, Model& model,
                ParamArena& arena, typename Optimizer::State& state, optim::LrSchedule& schedule,
                const std::vector<Registered>& objects) {
  std::istringstream is(payload, std::ios::binary);
  Position position;
  try {
    boost::archive::binary_iarchive ar(is, boost::archive::no_header);
    ShardInfo shards;
    if (version >= 4) ar >> make_nvp("shards", shards);
    std::string library, optimizer_name;
    std::vector<std::string> signature;
    float base_lr = 0;
    ar >> make_nvp("library", library);
    ar >> make_nvp("model", signature);
    const std::vector<std::string> mine = model_signature(model, arena);
    for (std::size_t i = 0; i < std::max(signature.size(), mine.size()); ++i) {
      const std::string a = i < signature.size() ? signature[i] : "(nothing)",
                        b = i < mine.size() ? mine[i] : "(nothing)";
      XTRAIN_CHECK(a == b, CheckpointError, source, ": saved for another model: the checkpoint has '", a,
                   "' where this model has '", b, "'");
    }
    ar >> make_nvp("optimizer", optimizer_name);
    XTRAIN_CHECK(optimizer_name == Optimizer::name, CheckpointError, source, ": saved with optimizer ", optimizer_name,
                 ", this trainer uses ", Optimizer::name);
    ar >> make_nvp("base_lr", base_lr);
    std::vector<NamedTensor> params, buffers;
    std::vector<std::pair<std::string, std::int64_t>> counters;
    ar >> make_nvp("params", params);
    ar >> make_nvp("buffers", buffers);
    ar >> make_nvp("counters", counters);
    for (std::size_t i = 0; i < params.size() && !shards.count; ++i) {  // names, shapes checked by the signature
      const std::vector<float>& saved = params[i].values;
      std::copy(saved.begin(), saved.end(), arena.values(arena.entries()[i]).begin());
    }
    std::size_t fi = 0, ci = 0;
    xtrain::visit_buffers(model, [&](const std::string&, auto&& buffer) {
      if constexpr (std::is_same_v<std::remove_cvref_t<decltype(buffer)>, Tensor<float>>) {
        const std::vector<float>& saved = buffers[fi++].values;  // sizes checked by the signature
        std::copy(saved.begin(), saved.end(), buffer.begin());
      } else {
        buffer = counters[ci++].second;
      }
    });
    typename Optimizer::State loaded;
    ar >> make_nvp("optimizer_state", loaded);
    state = std::move(loaded);
    ar >> make_nvp("schedule", schedule);
    ar >> make_nvp("progress", position);
    Generator g;
    ar >> make_nvp("default_generator", g);
    default_generator() = g;
    for (const auto& o : objects) o.load(ar);
  } catch (const boost::archive::archive_exception& e) {
    throw CheckpointError(source + ": unreadable training state (" + e.what() +
                          "); was it saved with other registered objects?");
  }
  return position;
}

}  // namespace xtrain::checkpoint

#pragma once
/// \file collective.hpp
/// How every rank saves and loads together: rank 0 does the file work, broadcasts its outcome,
/// and every rank throws the same CheckpointError when it failed, so that no rank trains on
/// alone and none waits in a collective for a rank that stopped. The Trainer, the Engine and the
/// Accelerator save and load through these functions only; the training state's file and the
/// numbered checkpoint folders of a project (`project_dir/checkpoints/checkpoint_N`) are managed
/// here too.

#include <fcntl.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <filesystem>
#include <span>
#include <string>
#include <system_error>
#include <vector>

#include "xtrain/checkpoint/archive.hpp"
#include "xtrain/checkpoint/state.hpp"
#include "xtrain/core/error.hpp"
#include "xtrain/core/param_arena.hpp"
#include "xtrain/optim/schedule.hpp"
#include "xtrain/parallel/communicator.hpp"

namespace xtrain::checkpoint {

/// Runs `work()` on rank 0 only; then every rank throws CheckpointError with rank 0's message if
/// `work` threw. `what` names the collective (it appears in timeout reports). Collective.
template <parallel::Communicator C, class F>
void on_main_rank(C& comm, const char* what, F&& work) {
  std::string error;
  if (comm.rank() == 0) try {
      work();
    } catch (const std::exception& e) {
      error = e.what();
      if (error.empty()) error = std::string(what) + " failed";
    }
  comm.broadcast(error, what);
  if (!error.empty()) throw CheckpointError(error);
}

/// Runs `work()` on every rank; then every rank throws CheckpointError when `work` threw on any
/// rank (with its own message, or naming the ranks that failed). Collective. `work` must not
/// throw between collectives of its own (a rank that skips one leaves the others waiting in it).
template <parallel::Communicator C, class F>
void on_every_rank(C& comm, const char* what, F&& work) {
  std::string error;
  try {
    work();
  } catch (const std::exception& e) {
    error = e.what();
    if (error.empty()) error = std::string(what) + " failed";
  }
  std::vector<double> failed(comm.size(), 0.0);
  failed[comm.rank()] = error.empty() ? 0.0 : 1.0;
  comm.allreduce_sum(std::span<double>(failed), what);
  if (!error.empty()) throw CheckpointError(error);
  std::string ranks;
  for (std::size_t r = 0; r < failed.size(); ++r)
    if (failed[r] > 0.0) ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
  XTRAIN_CHECK(ranks.empty(), CheckpointError, what, ": failed on rank(s) ", ranks, " (their error says why)");
}

/// Runs `read()` (which returns a std::string: a file's payload) on rank 0 and returns its result
/// on every rank; every rank throws CheckpointError with rank 0's message if `read` threw.
/// Collective.
template <parallel::Communicator C, class F>
std::string read_on_main_rank(C& comm, const char* what, F&& read) {
  std::string payload;
  if (comm.rank() == 0) try {
      payload = "ok" + read();
    } catch (const std::exception& e) {
      payload = std::string("error") + e.what();
    }
  comm.broadcast(payload, what);
  if (payload.rfind("error", 0) == 0) throw CheckpointError(payload.substr(5));
  return payload.substr(2);
}

/// Saves a training state to `dir`/state.xtrain atomically, written by rank 0 (checkpoint::encode):
/// parameters, buffers, the optimizer's `state` (in the full, rank-count-independent layout), the
/// schedule, `position` and the registered `objects`. Collective.
template <parallel::Communicator C, class Model, class Optimizer>
void save_training_state(C& comm, const std::string& dir, Model& model, ParamArena& arena, const Optimizer& optimizer,
                         typename Optimizer::State& state, const optim::LrSchedule& schedule, const Position& position,
                         const std::vector<Registered>& objects) {
  on_main_rank(comm, "checkpoint save status", [&] {
    std::filesystem::create_directories(dir);
    write_atomic(dir + "/" + state_file_name, encode(model, arena, optimizer, state, schedule, position, objects));
  });
}

/// A training state's file as read by rank 0, on every rank: its path, payload and format
/// version, and how the state is split (ShardInfo: count 0 when everything is in this file).
struct StateFile {
  std::string path, payload;
  std::uint32_t version = 0;
  ShardInfo shards;
};

/// Reads and verifies `dir`/state.xtrain on rank 0 and gives it to every rank. Collective.
template <parallel::Communicator C>
StateFile read_training_state(C& comm, const std::string& dir) {
  StateFile f;
  f.path = dir + "/" + state_file_name;
  f.payload = read_on_main_rank(comm, "checkpoint load", [&] {
    std::uint32_t version = 0;
    std::string payload = read_verified(f.path, &version);
    payload.push_back(static_cast<char>(version));  // (versions < 256)
    return payload;
  });
  f.version = static_cast<unsigned char>(f.payload.back());
  f.payload.pop_back();
  f.shards = shard_info(f.payload, f.version, f.path);
  return f;
}

/// Restores what save_training_state saved in `file` on every rank (parameters, buffers, `state` in
/// the full layout, `schedule`, the `objects`) and returns its position; a sharded state restores
/// all but the values and the optimizer state (checkpoint/sharded.hpp loads those).
template <class Model, class Optimizer>
Position load_training_state(const StateFile& file, Model& model, ParamArena& arena, typename Optimizer::State& state,
                             optim::LrSchedule& schedule, const std::vector<Registered>& objects) {
  return decode<Model, Optimizer>(file.payload, file.version, file.path, model, arena, state, schedule, objects);
}

/// The complete numbered checkpoints under `root` (folders checkpoint_N holding a state file;
/// checkpoint_N.tmp and other names skipped), by N.
inline std::vector<std::size_t> numbered_checkpoints(const std::filesystem::path& root,
                                                     const char* state_file = state_file_name) {
  std::vector<std::size_t> n;
  if (!std::filesystem::exists(root)) return n;
  for (const auto& entry : std::filesystem::directory_iterator(root)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("checkpoint_", 0) != 0 || name.find_first_not_of("0123456789", 11) != std::string::npos ||
        name.size() == 11 || !std::filesystem::exists(entry.path() / state_file))
      continue;
    n.push_back(std::stoul(name.substr(11)));
  }
  std::sort(n.begin(), n.end());
  return n;
}

/// The newest complete checkpoint folder under `root`. Throws CheckpointError when there is none.
inline std::string latest_checkpoint(const std::filesystem::path& root) {
  const auto existing = numbered_checkpoints(root);
  XTRAIN_CHECK(!existing.empty(), CheckpointError, "resume latest: no checkpoint in ", root.string());
  return (root / ("checkpoint_" + std::to_string(existing.back()))).string();
}

/// Saves a new numbered checkpoint under `root`: checkpoint_N with N one more than the newest,
/// written by `save(folder)` (a collective save of the training state) into checkpoint_N.tmp and
/// renamed once complete, so a crash never leaves a checkpoint that looks complete; then deletes
/// the oldest beyond `total_limit` (0: keep all). A failed save removes its .tmp folder and keeps
/// the previous checkpoints. Returns the folder. Collective.
template <parallel::Communicator C, class Save>
std::string save_numbered(C& comm, const std::filesystem::path& root, std::size_t total_limit, Save&& save) {
  std::vector<std::size_t> existing = numbered_checkpoints(root);
  const std::size_t n = existing.empty() ? 0 : existing.back() + 1;
  const std::filesystem::path final_dir = root / ("checkpoint_" + std::to_string(n));
  const std::filesystem::path tmp_dir = root / ("checkpoint_" + std::to_string(n) + ".tmp");
  on_main_rank(comm, "checkpoint folder status", [&] {
    std::filesystem::create_directories(root);
    for (const auto& entry : std::filesystem::directory_iterator(root))  // leftovers of a crashed save
      if (entry.path().extension() == ".tmp") std::filesystem::remove_all(entry.path());
    XTRAIN_CHECK(!std::filesystem::exists(final_dir), CheckpointError, final_dir.string(),
                 " already exists; refusing to overwrite it");
  });
  try {
    save(tmp_dir.string());
  } catch (const CheckpointError&) {
    if (comm.rank() == 0) {  // give the space back (a full disk); the previous checkpoints stay
      std::error_code ignored;
      std::filesystem::remove_all(tmp_dir, ignored);
    }
    throw;
  }
  on_main_rank(comm, "checkpoint rename status", [&] {
    try {
      std::filesystem::rename(tmp_dir, final_dir);
    } catch (const std::exception&) {
      std::error_code ignored;
      std::filesystem::remove_all(tmp_dir, ignored);
      throw;
    }
    detail::fsync_path(root.string(), O_RDONLY | O_DIRECTORY);
    existing.push_back(n);
    while (total_limit > 0 && existing.size() > total_limit) {
      std::filesystem::remove_all(root / ("checkpoint_" + std::to_string(existing.front())));
      existing.erase(existing.begin());
    }
  });
  return final_dir.string();
}

}  // namespace xtrain::checkpoint

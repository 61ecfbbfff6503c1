#pragma once
/// \file replicas.hpp
/// Keeping the ranks' replicas of a model identical: the start-up check that every rank built
/// the same model (a line per parameter slot, "name [shape]", tied uses as "alias tied to name",
/// compared with rank 0's; the first line that differs becomes the error message) followed by
/// the broadcast of rank 0's parameters and buffers; the broadcast of rank 0's buffers before an
/// evaluation or a save (DDP's broadcast_buffers); and, under XTRAIN_DEBUG_COLLECTIVES, a
/// checksum of the parameters compared across ranks every few steps.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include <zlib.h>

#include "xtrain/core/error.hpp"
#include "xtrain/core/module.hpp"
#include "xtrain/core/param_arena.hpp"
#include "xtrain/core/tensor.hpp"
#include "xtrain/parallel/agreement.hpp"
#include "xtrain/parallel/communicator.hpp"

namespace xtrain::parallel {

/// The model's structure as text: one line per parameter (and per tied use).
inline std::string model_structure(const ParamArena& arena) {
  std::string s;
  for (const auto& e : arena.entries()) {
    s += e.name + " " + shape_string(e.shape) + "\n";
    for (const auto& alias : e.aliases) s += alias + " tied to " + e.name + "\n";
  }
  return s;
}

/// The message for a rank (`rank`) whose structure `mine` differs from rank 0's `root`.
inline std::string structure_mismatch(const std::string& root, const std::string& mine, std::size_t rank) {
  auto lines = [](const std::string& s) {
    std::vector<std::string> out;
    std::size_t a = 0;
    for (std::size_t b; (b = s.find('\n', a)) != std::string::npos; a = b + 1) out.push_back(s.substr(a, b - a));
    return out;
  };
  const auto r = lines(root), m = lines(mine);
  const std::string here = "rank " + std::to_string(rank);
  for (std::size_t i = 0; i < std::max(r.size(), m.size()); ++i) {
    const std::string a = i < r.size() ? r[i] : "(none)", b = i < m.size() ? m[i] : "(none)";
    if (a != b) {
      const std::string name = b.substr(0, b.find(' '));
      return "model differs across ranks: parameter '" + name + "' is '" + b + "' on " + here + " but '" + a +
             "' on rank 0 (build the same model on every rank)";
    }
  }
  return "model differs across ranks";
}

/// Copies rank 0's buffers (BatchNorm running statistics) to every rank, as DDP does before
/// evaluation and saving (ranks' per-rank statistics differ otherwise). Collective.
template <Communicator C, class Model>
void broadcast_buffers(C& comm, Model& model) {
  if (comm.size() == 1) return;
  visit_buffers(model, [&](const std::string&, auto&& buffer) {
    if constexpr (std::is_same_v<std::remove_cvref_t<decltype(buffer)>, Tensor<float>>) {
      comm.broadcast(std::span<float>(buffer.data(), buffer.size()), "broadcast buffers");
    } else {
      double v = static_cast<double>(buffer);
      comm.broadcast(std::span<double>(&v, 1), "broadcast buffers");
      buffer = static_cast<std::int64_t>(v);
    }
  });
}

/// Checks that every rank built the same model (throws ValueError naming the first parameter
/// that differs), then gives every rank rank 0's parameters and buffers. Collective.
template <Communicator C, class Model>
void synchronize_replicas(C& comm, ParamArena& arena, Model& model) {
  if (comm.size() == 1) return;
  const std::string mine = model_structure(arena);
  std::string root = mine;
  comm.broadcast(root, "model structure check");
  if (root != mine) throw ValueError(structure_mismatch(root, mine, comm.rank()));
  comm.broadcast(arena.values(), "broadcast initial parameters");
  broadcast_buffers(comm, model);
}

/// Throws ValueError on a rank whose parameters `values` differ from rank 0's (a CRC-32 of the
/// flat buffer), naming `step`: ranks that drift apart (a bug in a custom module, a bit flip)
/// stop there instead of training on silently. Collective.
template <Communicator C>
void check_replicas_agree(C& comm, std::span<const float> values, std::uint64_t step) {
  if (comm.size() == 1) return;
  std::string mine = field_text(crc32(crc32(0L, Z_NULL, 0), reinterpret_cast<const Bytef*>(values.data()),
                                      static_cast<uInt>(values.size() * sizeof(float))));
  std::string root = mine;
  comm.broadcast(root, "parameter checksum");
  XTRAIN_CHECK(root == mine, ValueError, "parameters differ across ranks after step ", step, ": CRC-32 ", mine,
               " on rank ", comm.rank(), " but ", root,
               " on rank 0 (ranks must stay identical: a module that changes its parameters on one rank only?)");
}

/// How often check_replicas_agree runs: every `XTRAIN_DEBUG_PARAMETERS_EVERY` steps (default 100)
/// when XTRAIN_DEBUG_COLLECTIVES is set and not "0", else never; set_every overrides it.
class ReplicaCheck {
 public:
  ReplicaCheck() {
    if (const char* d = std::getenv("XTRAIN_DEBUG_COLLECTIVES"); d && std::string(d) != "0") {
      const char* every = std::getenv("XTRAIN_DEBUG_PARAMETERS_EVERY");
      every_ = every ? std::strtoull(every, nullptr, 10) : 100;
    }
  }
  /// Every this many steps (0: never).
  void set_every(std::uint64_t steps) noexcept { every_ = steps; }
  /// After optimizer step `step`: compares the replicas when it is due. Collective.
  template <Communicator C>
  void after_step(C& comm, std::span<const float> values, std::uint64_t step) {
    if (every_ && step % every_ == 0) check_replicas_agree(comm, values, step);
  }

 private:
  std::uint64_t every_ = 0;
};

}  // namespace xtrain::parallel

#pragma once
/// \file sharded.hpp
/// Sharded training states (ZeRO): beside state.xtrain, each rank of the saving run writes
/// `shard-<id>-<i>-of-<N>.xtrain` (i from 1; `id` names the save) with its pieces of the
/// parameter values and of each optimizer state vector, each placed by where it starts in the
/// checkpoint's rank-count-independent layout (the ShardInfo in state.xtrain lists every shard's
/// pieces). A rank that loads reads only the shard files that overlap the pieces it holds, on any
/// number of ranks, sharded or not. No rank holds more than its own part of the state and one
/// shard file. Every rank reads and writes the folder: it must be on a filesystem they share.
///
/// A save into a folder that holds one keeps the old state loadable until the new state.xtrain
/// replaces it: the new shards have other names, and the old ones are removed after.
///
/// A shard file is a checkpoint file (archive.hpp: header with CRC-32, written atomically) whose
/// payload is the length of a small archive (8 bytes, little-endian), the archive (id, index,
/// count, the pieces' start and count, their element sizes), then the pieces' raw bytes in order.

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include <boost/archive/binary_iarchive.hpp>
#include <boost/archive/binary_oarchive.hpp>

#include "xtrain/checkpoint/archive.hpp"
#include "xtrain/checkpoint/collective.hpp"
#include "xtrain/checkpoint/state.hpp"
#include "xtrain/parallel/communicator.hpp"
#include "xtrain/parallel/gradient_sync.hpp"

namespace xtrain::checkpoint {

/// The name of shard `index` (from 0) of the `count` shards of save `info.id`, in its folder.
inline std::string shard_file_name(const ShardInfo& info, std::uint64_t index) {
  char name[64];
  std::snprintf(name, sizeof name, "-%05llu-of-%05llu.xtrain", static_cast<unsigned long long>(index) + 1,
                static_cast<unsigned long long>(info.count));
  return "shard-" + info.id + name;
}

/// The ShardInfo of a save by `comm`'s ranks, each holding `pieces` (the same vectors on every
/// rank): every rank's ranges and a fresh id drawn by rank 0. Collective.
template <parallel::Communicator C>
ShardInfo describe_shards(C& comm, std::span<const parallel::StatePiece> pieces) {
  ShardInfo info;
  info.count = comm.size();
  const std::size_t n = pieces.size(), width = 2 * n + 1;
  std::vector<double> all(comm.size() * width, 0.0);  // per rank: its piece count, then start and count per piece
  double* mine = all.data() + comm.rank() * width;
  mine[0] = static_cast<double>(n);
  for (std::size_t i = 0; i < n; ++i) {
    mine[1 + 2 * i] = static_cast<double>(pieces[i].start);
    mine[2 + 2 * i] = static_cast<double>(pieces[i].count);
    info.elems.push_back(pieces[i].elem);
  }
  comm.allreduce_sum(std::span<double>(all), "checkpoint shard layout");
  for (std::size_t r = 0; r < comm.size(); ++r) {
    const double* theirs = all.data() + r * width;
    XTRAIN_CHECK(theirs[0] == static_cast<double>(n), ValueError, "sharded checkpoint: rank ", r, " holds ", theirs[0],
                 " state vectors, rank ", comm.rank(), " ", n);
    std::vector<std::uint64_t> ranges;
    for (std::size_t k = 1; k < width; ++k) ranges.push_back(static_cast<std::uint64_t>(theirs[k]));
    info.ranges.push_back(std::move(ranges));
  }
  if (comm.rank() == 0) {  // 16 hex digits: the clock and the system's randomness
    std::random_device device;
    const auto now = static_cast<std::uint64_t>(std::chrono::system_clock::now().time_since_epoch().count());
    const std::uint64_t id = now ^ (static_cast<std::uint64_t>(device()) << 32 | device());
    char hex[17];
    std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(id));
    info.id = hex;
  }
  comm.broadcast(info.id, "checkpoint shard id");
  return info;
}

/// Writes shard `index` of the save `info` describes to `dir`: `pieces`, whose ranges must be
/// info.ranges[index].
inline void write_shard(const std::string& dir, const ShardInfo& info, std::uint64_t index,
                        std::span<const parallel::StatePiece> pieces) {
  std::ostringstream os(std::ios::binary);
  {
    boost::archive::binary_oarchive ar(os, boost::archive::no_header);
    std::string id = info.id;
    std::uint64_t i = index, count = info.count;
    std::vector<std::uint64_t> ranges = info.ranges.at(index), elems = info.elems;
    ar << make_nvp("id", id) << make_nvp("index", i) << make_nvp("count", count) << make_nvp("ranges", ranges)
       << make_nvp("elems", elems);
  }
  const std::string meta = os.str();
  std::string length;
  detail::put_u64(length, meta.size());
  std::vector<std::string_view> payload{length, meta};
  for (const parallel::StatePiece& p : pieces)
    payload.emplace_back(reinterpret_cast<const char*>(p.data), p.count * p.elem);
  write_atomic(dir + "/" + shard_file_name(info, index), payload);
}

namespace detail {
// Checks the small archive at the start of shard `index`'s payload (`payload`: its first bytes at
// least, or all of it) against `info`; returns where the pieces start in the payload.
inline std::size_t check_shard_meta(std::string_view payload, std::uint64_t payload_size, const ShardInfo& info,
                                    std::uint64_t index, const std::string& path, const std::string& dir) {
  XTRAIN_CHECK(payload.size() >= 8, CheckpointError, path, ": truncated shard");
  const std::uint64_t meta_size = get(payload.data(), 8);
  XTRAIN_CHECK(meta_size <= payload.size() - 8, CheckpointError, path, ": truncated shard");
  std::string id;
  std::uint64_t i = 0, count = 0;
  std::vector<std::uint64_t> ranges, elems;
  try {
    std::istringstream is(std::string(payload.substr(8, meta_size)), std::ios::binary);
    boost::archive::binary_iarchive ar(is, boost::archive::no_header);
    ar >> make_nvp("id", id) >> make_nvp("index", i) >> make_nvp("count", count) >> make_nvp("ranges", ranges) >>
        make_nvp("elems", elems);
  } catch (const boost::archive::archive_exception& e) {
    throw CheckpointError(path + ": unreadable shard (" + e.what() + ")");
  }
  XTRAIN_CHECK(id == info.id && i == index && count == info.count, CheckpointError, path,
               ": belongs to another save than ", dir, "/", state_file_name, "; use another checkpoint");
  XTRAIN_CHECK(ranges == info.ranges.at(index) && elems == info.elems, CheckpointError, path,
               ": its pieces differ from those ", state_file_name, " lists");
  std::uint64_t bytes = 8 + meta_size;
  for (std::size_t k = 0; k < elems.size(); ++k) {
    std::size_t piece = 0;
    XTRAIN_CHECK(checked_multiply(ranges[2 * k + 1], elems[k], piece) && piece <= payload_size - bytes, CheckpointError,
                 path, ": truncated shard (piece ", k, ")");
    bytes += piece;
  }
  XTRAIN_CHECK(bytes == payload_size, CheckpointError, path, ": ", payload_size - bytes, " bytes after the pieces");
  return 8 + meta_size;
}

// The shards of `info` that hold part of `pieces`, and for piece k of shard s, the overlap of its
// saved range with the range `pieces[k]` holds.
inline std::pair<std::uint64_t, std::uint64_t> overlap(const ShardInfo& info, std::uint64_t s, std::size_t k,
                                                       const parallel::StatePiece& want) {
  const std::vector<std::uint64_t>& saved = info.ranges.at(s);
  return {std::max<std::uint64_t>(saved[2 * k], want.start),
          std::min<std::uint64_t>(saved[2 * k] + saved[2 * k + 1], want.start + want.count)};
}
inline bool needed(const ShardInfo& info, std::uint64_t s, std::span<const parallel::StatePiece> pieces) {
  for (std::size_t k = 0; k < std::min(pieces.size(), info.elems.size()); ++k) {
    const auto [from, to] = overlap(info, s, k, pieces[k]);
    if (from < to) return true;
  }
  return false;
}
// Throws CheckpointError unless `info` lists `pieces`' vectors (their number and element sizes).
inline void check_vectors(const ShardInfo& info, std::span<const parallel::StatePiece> pieces, const std::string& dir) {
  XTRAIN_CHECK(info.elems.size() == pieces.size(), CheckpointError, dir, "/", state_file_name, ": holds ",
               info.elems.size(), " state vectors (parameters and optimizer state), this run ", pieces.size());
  for (std::size_t k = 0; k < pieces.size(); ++k)
    XTRAIN_CHECK(info.elems[k] == pieces[k].elem, CheckpointError, dir, "/", state_file_name, ": state vector ", k,
                 " has elements of ", info.elems[k], " bytes, this run's of ", pieces[k].elem);
}
}  // namespace detail

/// A shard file read and checked: its bytes and a view of each piece's.
struct ShardFile {
  std::string bytes;
  std::vector<std::string_view> pieces;
};

/// Reads shard `index` of the save `info` describes from `dir` and checks that it belongs to that
/// save, holds the pieces it lists and is intact (CRC-32). Throws CheckpointError otherwise.
inline ShardFile read_shard(const std::string& dir, const ShardInfo& info, std::uint64_t index) {
  const std::string path = dir + "/" + shard_file_name(info, index);
  ShardFile f;
  f.bytes = read_file(path);
  const std::string_view payload = verified_payload(f.bytes, path);
  std::size_t at = detail::check_shard_meta(payload, payload.size(), info, index, path, dir);
  for (std::size_t k = 0; k < info.elems.size(); ++k) {
    const std::size_t bytes = info.ranges[index][2 * k + 1] * info.elems[k];  // (checked above)
    f.pieces.push_back(payload.substr(at, bytes));
    at += bytes;
  }
  return f;
}

/// Checks, without reading the pieces, that shard `index` of the save `info` describes is in `dir`
/// with its header, length and list of pieces (the CRC-32 is checked when it is read). Throws
/// CheckpointError otherwise.
inline void check_shard(const std::string& dir, const ShardInfo& info, std::uint64_t index) {
  const std::string path = dir + "/" + shard_file_name(info, index);
  std::ifstream in(path, std::ios::binary);
  XTRAIN_CHECK(in.good(), CheckpointError, path, ": cannot open (", std::strerror(errno), ")");
  std::string start(header_size + 8, '\0');
  in.read(start.data(), static_cast<std::streamsize>(start.size()));
  XTRAIN_CHECK(in.gcount() == static_cast<std::streamsize>(start.size()), CheckpointError, path, ": truncated shard");
  const std::uint64_t file_size = std::filesystem::file_size(path),
                      payload_size = detail::check_header(start, path).payload_size,
                      meta_size = detail::get(start.data() + header_size, 8);
  XTRAIN_CHECK(file_size - header_size == payload_size, CheckpointError, path, ": truncated: the header announces ",
               payload_size, " payload bytes, the file holds ", file_size - header_size);
  XTRAIN_CHECK(meta_size < (std::uint64_t{1} << 30) && meta_size <= payload_size - 8, CheckpointError, path,
               ": truncated shard");
  start.resize(header_size + 8 + meta_size);
  in.read(start.data() + header_size + 8, static_cast<std::streamsize>(meta_size));
  XTRAIN_CHECK(in.gcount() == static_cast<std::streamsize>(meta_size), CheckpointError, path, ": truncated shard");
  detail::check_shard_meta(std::string_view(start).substr(header_size), payload_size, info, index, path, dir);
}

/// Saves a sharded training state to `dir` (on a filesystem every rank reaches): every rank
/// writes its shard (`pieces`: its block of the parameter values, then its parts of the optimizer
/// state's vectors), then rank 0 writes state.xtrain with the rest (parameters without values,
/// the ShardInfo) and removes the shard files of other saves. A save that fails leaves the
/// previous state (its state.xtrain and its shards) loadable. Collective.
template <parallel::Communicator C, class Model, class Optimizer>
void save_sharded_training_state(C& comm, const std::string& dir, Model& model, ParamArena& arena,
                                 const Optimizer& optimizer, std::span<const parallel::StatePiece> pieces,
                                 const optim::LrSchedule& schedule, const Position& position,
                                 const std::vector<Registered>& objects) {
  const ShardInfo info = describe_shards(comm, pieces);
  on_main_rank(comm, "checkpoint folder status", [&] { std::filesystem::create_directories(dir); });
  on_every_rank(comm, "checkpoint shard save", [&] {
    XTRAIN_CHECK(std::filesystem::is_directory(dir), CheckpointError, dir, ": rank 0 made this folder, rank ",
                 comm.rank(),
                 " does not see it: a sharded checkpoint (ZeRO) is written by every rank, so it must "
                 "be on a filesystem all ranks share");
    write_shard(dir, info, comm.rank(), pieces);
  });
  on_main_rank(comm, "checkpoint save status", [&] {
    typename Optimizer::State none{};
    write_atomic(dir + "/" + state_file_name, encode(model, arena, optimizer, none, schedule, position, objects, info));
    for (const auto& entry : std::filesystem::directory_iterator(dir)) {  // the shards of earlier saves
      const std::string name = entry.path().filename().string();
      std::error_code ignored;  // (the state is saved: a shard left over takes space, nothing else)
      if (name.rfind("shard-", 0) == 0 && name.rfind("shard-" + info.id + "-", 0) != 0)
        std::filesystem::remove(entry.path(), ignored);
    }
  });
}

/// Checks that every shard file this rank's `pieces` overlap is in `dir`, with the pieces the
/// state `info` describes lists (check_shard): before anything is restored. Collective: every
/// rank throws CheckpointError when a shard is missing or wrong on any rank.
template <parallel::Communicator C>
void check_shards(C& comm, const std::string& dir, const ShardInfo& info,
                  std::span<const parallel::StatePiece> pieces) {
  on_every_rank(comm, "checkpoint shard check", [&] {  // (the vectors are checked after the optimizer's name)
    for (std::uint64_t s = 0; s < info.count; ++s)
      if (detail::needed(info, s, pieces)) check_shard(dir, info, s);
  });
}

/// Fills this rank's `pieces` (zeroed first: what no shard holds is padding) from the shard files
/// of the state `info` describes in `dir`, reading only the files that overlap them. Throws
/// CheckpointError on every rank when a file is missing or bad on any rank, or when the state's
/// vectors are not those of this run (another optimizer layout). Collective.
template <parallel::Communicator C>
void load_shards(C& comm, const std::string& dir, const ShardInfo& info, std::span<const parallel::StatePiece> pieces) {
  on_every_rank(comm, "checkpoint shard load", [&] {
    detail::check_vectors(info, pieces, dir);
    for (const parallel::StatePiece& p : pieces)
      if (p.count) std::memset(p.data, 0, p.count * p.elem);
    for (std::uint64_t s = 0; s < info.count; ++s) {
      if (!detail::needed(info, s, pieces)) continue;
      const ShardFile f = read_shard(dir, info, s);
      for (std::size_t k = 0; k < pieces.size(); ++k) {
        const auto [from, to] = detail::overlap(info, s, k, pieces[k]);
        if (from >= to) continue;
        const std::size_t elem = pieces[k].elem;
        std::memcpy(pieces[k].data + (from - pieces[k].start) * elem,
                    f.pieces[k].data() + (from - info.ranges[s][2 * k]) * elem, (to - from) * elem);
      }
    }
  });
}

}  // namespace xtrain::checkpoint

#pragma once
/// \file agreement.hpp
/// What every rank must share before the first step, checked at once: a rank whose epochs,
/// batch, seed, optimizer, data set size or content (or any other field) differs from rank 0's
/// would otherwise hang in a collective until the timeout, or train silently wrong. Rank 0's
/// fields are broadcast; a rank that differs throws ValueError naming the first field and both
/// values (under MPI the job then ends with that message).

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <zlib.h>

#include "xtrain/core/error.hpp"
#include "xtrain/core/memory.hpp"

namespace xtrain::parallel {

/// One field every rank must agree on: a name and its value as text.
struct RunField {
  std::string name, value;
};

/// `size N, crc32 C`: the sample count and a CRC-32 of up to 256 evenly spaced samples (inputs
/// and targets as gathered): the same data on every rank, cheaply. The samples are gathered in
/// `memory` (null: the current resource).
template <class Dataset>
std::string data_fingerprint(const Dataset& data, memory::Resource* memory = nullptr) {
  const std::size_t n = data.size(), picks = std::min<std::size_t>(n, 256);
  std::vector<std::uint32_t> indices(picks);
  for (std::size_t i = 0; i < picks; ++i) indices[i] = static_cast<std::uint32_t>(i * n / picks);
  const memory::Use use(memory);
  typename Dataset::input_type x;
  typename Dataset::target_type y;
  uLong crc = crc32(0L, Z_NULL, 0);
  if (picks > 0) {
    data.gather(indices, x, y);
    crc = crc32(crc, reinterpret_cast<const Bytef*>(x.data()), static_cast<uInt>(x.size() * sizeof(*x.data())));
    crc = crc32(crc, reinterpret_cast<const Bytef*>(y.data()), static_cast<uInt>(y.size() * sizeof(*y.data())));
  }
  std::ostringstream os;
  os << "size " << n << ", crc32 " << std::hex << crc;
  return os.str();
}

/// `object.describe()` when it has one, else `fallback`.
template <class T>
std::string describe_or(const T& object, std::string fallback) {
  if constexpr (requires { object.describe(); })
    return object.describe();
  else
    return fallback;
}

/// A value as text (for RunField).
template <class T>
std::string field_text(const T& v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

/// Throws ValueError on a rank whose `fields` differ from rank 0's, naming the first field that
/// differs and its value on both ranks. Collective (one broadcast); nothing on one rank.
template <class Communicator>
void check_agreement(Communicator& comm, const std::vector<RunField>& fields) {
  if (comm.size() == 1) return;
  std::string mine;
  for (const auto& f : fields) mine += f.name + '\t' + f.value + '\n';
  std::string root = mine;
  comm.broadcast(root, "run agreement check");
  if (root == mine) return;
  std::size_t a = 0;
  for (const auto& f : fields) {
    const std::size_t b = root.find('\n', a);
    const std::string line = root.substr(a, b == std::string::npos ? std::string::npos : b - a);
    const std::size_t tab = line.find('\t');
    const std::string name = line.substr(0, tab), value = tab == std::string::npos ? "" : line.substr(tab + 1);
    XTRAIN_CHECK(name == f.name && value == f.value, ValueError, "ranks disagree: ", f.name, " is '", f.value,
                 "' on rank ", comm.rank(), " but '", name == f.name ? value : "(another field)",
                 "' on rank 0 (every rank must run the same configuration on the same data)");
    if (b == std::string::npos) break;
    a = b + 1;
  }
  throw ValueError("ranks disagree on the run's configuration (rank " + std::to_string(comm.rank()) +
                   " has other fields than rank 0)");
}

}  // namespace xtrain::parallel

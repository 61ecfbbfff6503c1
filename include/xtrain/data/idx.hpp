#pragma once
/// \file idx.hpp
/// IDX reader (the MNIST / Fashion-MNIST format; LeCun et al.), plain or gzip-compressed,
/// unsigned-byte data. Errors name the file and the problem.

#include <cstdint>
#include <string>
#include <vector>

#include "xtrain/core/error.hpp"
#include "xtrain/data/file.hpp"

namespace xtrain::data {

/// A parsed IDX file of unsigned bytes.
struct IdxArray {
  std::vector<std::size_t> shape;
  std::vector<unsigned char> data;
};

/// Parses the (decompressed) bytes of an IDX file; `path` names it in errors. Throws DataError for:
/// wrong magic, an element type other than unsigned byte, and data shorter than the header says.
inline IdxArray parse_idx(const std::vector<unsigned char>& b, const std::string& path) {
  XTRAIN_CHECK(b.size() >= 4 && b[0] == 0 && b[1] == 0, DataError, path,
               ": not an IDX file (wrong magic; expected 0x0000 then type and rank)");
  XTRAIN_CHECK(b[2] == 0x08, DataError, path, ": IDX element type 0x", std::hex, +b[2],
               " is not supported (only 0x08, unsigned byte)");
  const std::size_t rank = b[3];
  XTRAIN_CHECK(rank >= 1 && rank <= 4, DataError, path, ": IDX rank ", rank, " is not supported (1 to 4)");
  XTRAIN_CHECK(b.size() >= 4 + 4 * rank, DataError, path, ": truncated IDX header");
  IdxArray a;
  std::size_t count = 1;
  for (std::size_t d = 0; d < rank; ++d) {
    const unsigned char* p = b.data() + 4 + 4 * d;
    const std::size_t dim = (std::size_t{p[0]} << 24) | (std::size_t{p[1]} << 16) | (std::size_t{p[2]} << 8) | p[3];
    a.shape.push_back(dim);
    XTRAIN_CHECK(checked_multiply(count, dim, count), DataError, path, ": IDX shape is too large");
  }
  const std::size_t header = 4 + 4 * rank;
  XTRAIN_CHECK(b.size() - header >= count, DataError, path, ": truncated: shape ", shape_string(a.shape), " needs ",
               count, " bytes of data, the file has ", b.size() - header);
  a.data.assign(b.begin() + static_cast<std::ptrdiff_t>(header),
                b.begin() + static_cast<std::ptrdiff_t>(header + count));
  return a;
}

/// Reads `path` (".gz" or not; a missing file or corrupt gzip is a DataError naming it) and parses it.
inline IdxArray read_idx(const std::string& path) { return parse_idx(read_file_bytes(path), path); }

}  // namespace xtrain::data

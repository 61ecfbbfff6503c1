#pragma once
/// \file file.hpp
/// Reading a whole file, gzip-compressed or not (zlib reads plain files transparently), with
/// errors that name the file.

#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

#include <zlib.h>

#include "xtrain/core/error.hpp"

namespace xtrain::data {

/// The bytes of `path`, decompressed if it is gzip. Throws DataError naming the file when it is
/// missing, unreadable or a corrupt/truncated gzip stream.
inline std::vector<unsigned char> read_file_bytes(const std::string& path) {
  gzFile f = gzopen(path.c_str(), "rb");
  XTRAIN_CHECK(f != nullptr, DataError, path, ": cannot open (", std::strerror(errno), ")");
  std::vector<unsigned char> bytes;
  constexpr unsigned chunk = 1u << 20;
  for (;;) {
    const std::size_t old = bytes.size();
    bytes.resize(old + chunk);
    const int got = gzread(f, bytes.data() + old, chunk);
    if (got < 0) {
      int code = 0;
      std::string msg = gzerror(f, &code);
      gzclose(f);
      throw DataError(path + ": corrupt or truncated compressed data (" + msg + ")");
    }
    bytes.resize(old + static_cast<std::size_t>(got));
    if (got < static_cast<int>(chunk)) break;
  }
  int code = 0;
  const char* msg = gzerror(f, &code);
  const std::string message = msg ? msg : "";
  gzclose(f);
  XTRAIN_CHECK(code == Z_OK || code == Z_STREAM_END, DataError, path, ": corrupt or truncated compressed data (",
               message, ")");
  return bytes;
}

/// True if `path` names an existing regular file.
inline bool file_exists(const std::string& path) {
  if (FILE* f = std::fopen(path.c_str(), "rb")) {
    std::fclose(f);
    return true;
  }
  return false;
}

}  // namespace xtrain::data

#pragma once
/// \file archive.hpp
/// The checkpoint file: a fixed header (magic, format version, byte order, type sizes, payload
/// length, CRC-32 of the payload) in front of a Boost.Serialization binary archive. Boost's binary
/// archive is not portable across architectures, so the header refuses, with a clear message, a
/// file from another byte order or type sizes, a truncated or corrupt file, or another version.
/// Files are written atomically: `path.tmp`, fsync, rename, fsync of the directory.

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <string>
#include <string_view>

#include <zlib.h>

#include "xtrain/core/error.hpp"

namespace xtrain::checkpoint {

using xtrain::CheckpointError;

/// The file a training state is saved in, inside its folder.
inline constexpr const char* state_file_name = "state.xtrain";

inline constexpr char file_magic[8] = {'X', 'T', 'R', 'A', 'I', 'N', 'C', 'K'};
inline constexpr std::uint32_t format_version = 3;  // 2: loss-scaler state; 3: parameter groups, tied names
inline constexpr std::size_t header_size = 8 + 4 + 4 + 4 + 8 + 4;

namespace detail {
inline void put_u32(std::string& s, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) s += static_cast<char>((v >> (8 * i)) & 0xFF);
}
inline void put_u64(std::string& s, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) s += static_cast<char>((v >> (8 * i)) & 0xFF);
}
inline std::uint64_t get(const char* p, int bytes) {
  std::uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= static_cast<std::uint64_t>(static_cast<unsigned char>(p[i])) << (8 * i);
  return v;
}
/// Byte order and type sizes of this build: 4 bytes (little-endian bytes of 0x01020304 as written
/// in memory order) and sizeof float, double, size_t, long packed in one word.
inline std::uint32_t byte_order_probe() {
  const std::uint32_t probe = 0x01020304u;
  std::uint32_t in_memory;
  std::memcpy(&in_memory, &probe, 4);
  return in_memory;
}
inline std::uint32_t type_sizes() {
  return static_cast<std::uint32_t>(sizeof(float) | sizeof(double) << 8 | sizeof(std::size_t) << 16 |
                                    sizeof(long) << 24);
}
inline std::uint32_t crc32_of(const std::string& payload) {
  uLong crc = crc32(0L, Z_NULL, 0);
  std::size_t done = 0;
  while (done < payload.size()) {  // zlib takes uInt lengths
    const auto n = static_cast<uInt>(std::min<std::size_t>(payload.size() - done, 1u << 30));
    crc = crc32(crc, reinterpret_cast<const Bytef*>(payload.data() + done), n);
    done += n;
  }
  return static_cast<std::uint32_t>(crc);
}
inline void fsync_path(const std::string& path, int flags) {
  const int fd = ::open(path.c_str(), flags);
  XTRAIN_CHECK(fd >= 0, CheckpointError, path, ": cannot open to sync (", std::strerror(errno), ")");
  const int rc = ::fsync(fd);
  ::close(fd);
  XTRAIN_CHECK(rc == 0, CheckpointError, path, ": fsync failed (", std::strerror(errno), ")");
}
}  // namespace detail

/// Writes `parts` one after the other to `path` so that a crash leaves either the old file or the
/// new one, never a torn one: writes `path.tmp`, fsyncs it, renames it over `path`, fsyncs the
/// directory.
inline void write_file_atomic(const std::string& path, std::initializer_list<std::string_view> parts) {
  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  XTRAIN_CHECK(fd >= 0, CheckpointError, tmp, ": cannot create (", std::strerror(errno), ")");
  auto fail = [&](const char* what) {  // the half-written file goes: a full disk gets its space back
    const int error = errno;
    ::close(fd);
    ::unlink(tmp.c_str());
    throw CheckpointError(xtrain::detail::concat(tmp, ": ", what, " (", std::strerror(error), ")"));
  };
  for (const auto part : parts)
    for (std::size_t done = 0; done < part.size();) {
      const ::ssize_t n = ::write(fd, part.data() + done, part.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n == 0) errno = EIO;  // no progress and no error code: do not print a stale one
      if (n <= 0) fail("write failed");
      done += static_cast<std::size_t>(n);
    }
  if (::fsync(fd) != 0) fail("fsync failed");
  if (::close(fd) != 0) {
    const int error = errno;
    ::unlink(tmp.c_str());
    throw CheckpointError(xtrain::detail::concat(tmp, ": close failed (", std::strerror(error), ")"));
  }
  XTRAIN_CHECK(std::rename(tmp.c_str(), path.c_str()) == 0, CheckpointError, "cannot rename ", tmp, " to ", path, " (",
               std::strerror(errno), ")");
  const std::string dir = std::filesystem::path(path).parent_path().string();
  detail::fsync_path(dir.empty() ? "." : dir, O_RDONLY | O_DIRECTORY);
}

/// Writes a checkpoint file: the header (with the payload's CRC-32) and the payload, atomically.
inline void write_atomic(const std::string& path, const std::string& payload) {
  std::string header(file_magic, 8);
  detail::put_u32(header, format_version);
  detail::put_u32(header, detail::byte_order_probe());
  detail::put_u32(header, detail::type_sizes());
  detail::put_u64(header, payload.size());
  detail::put_u32(header, detail::crc32_of(payload));
  write_file_atomic(path, {header, payload});
}

/// The payload of the checkpoint file `bytes` after checking every header field and the CRC-32;
/// `path` names the file in errors.
inline std::string verify(const std::string& bytes, const std::string& path) {
  XTRAIN_CHECK(bytes.size() >= 8 && std::memcmp(bytes.data(), file_magic, 8) == 0, CheckpointError, path,
               ": not an xtrain checkpoint (wrong magic)");
  XTRAIN_CHECK(bytes.size() >= header_size, CheckpointError, path, ": truncated header (", bytes.size(), " bytes)");
  const char* h = bytes.data() + 8;
  const auto version = static_cast<std::uint32_t>(detail::get(h, 4));
  XTRAIN_CHECK(version == format_version, CheckpointError, path, ": checkpoint format version ", version,
               ", this build of xtrain reads version ", format_version);
  XTRAIN_CHECK(static_cast<std::uint32_t>(detail::get(h + 4, 4)) == detail::byte_order_probe(), CheckpointError, path,
               ": written on a machine of another byte order; convert it there with save_model (safetensors)");
  XTRAIN_CHECK(static_cast<std::uint32_t>(detail::get(h + 8, 4)) == detail::type_sizes(), CheckpointError, path,
               ": written on a machine with other type sizes (float/double/size_t/long); convert it there with "
               "save_model (safetensors)");
  const std::uint64_t payload_size = detail::get(h + 12, 8);
  const auto crc = static_cast<std::uint32_t>(detail::get(h + 20, 4));
  XTRAIN_CHECK(bytes.size() - header_size == payload_size, CheckpointError, path, ": truncated: the header announces ",
               payload_size, " payload bytes, the file holds ", bytes.size() - header_size);
  std::string payload = bytes.substr(header_size);
  XTRAIN_CHECK(detail::crc32_of(payload) == crc, CheckpointError, path,
               ": corrupt: CRC-32 of the payload does not match the header");
  return payload;
}

/// Reads `path` and returns its verified payload (see verify).
inline std::string read_verified(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  XTRAIN_CHECK(in.good(), CheckpointError, path, ": cannot open (", std::strerror(errno), ")");
  return verify(std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>()), path);
}

}  // namespace xtrain::checkpoint

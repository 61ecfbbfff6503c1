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
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <zlib.h>

#include "xtrain/core/error.hpp"

namespace xtrain::checkpoint {

using xtrain::CheckpointError;

/// The file a training state is saved in, inside its folder.
inline constexpr const char* state_file_name = "state.xtrain";

inline constexpr char file_magic[8] = {'X', 'T', 'R', 'A', 'I', 'N', 'C', 'K'};
/// 2: loss-scaler state; 3: parameter groups, tied names; 4: sharded states (ShardInfo first).
inline constexpr std::uint32_t format_version = 4;
/// The oldest version this build reads.
inline constexpr std::uint32_t oldest_format_version = 3;
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
inline std::uint32_t crc32_of(std::string_view payload, std::uint32_t start = 0) {
  uLong crc = start;
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

/// A file written so that a crash leaves either the old file at `path` or the new one, never a
/// torn one: the bytes go to `path.tmp`; commit() fsyncs it, renames it over `path` and fsyncs the
/// directory. Destroyed uncommitted (an error on the way), it removes `path.tmp`: a full disk gets
/// its space back. Throws CheckpointError when a step fails.
class AtomicFile {
 public:
  explicit AtomicFile(std::string path) : path_(std::move(path)), tmp_(path_ + ".tmp") {
    fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    XTRAIN_CHECK(fd_ >= 0, CheckpointError, tmp_, ": cannot create (", std::strerror(errno), ")");
  }
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;
  ~AtomicFile() {
    if (fd_ < 0) return;
    ::close(fd_);
    ::unlink(tmp_.c_str());
  }

  void write(std::string_view bytes) {
    for (std::size_t done = 0; done < bytes.size();) {
      const ::ssize_t n = ::write(fd_, bytes.data() + done, bytes.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n == 0) errno = EIO;  // no progress and no error code: do not print a stale one
      if (n <= 0) fail("write failed");
      done += static_cast<std::size_t>(n);
    }
  }
  void commit() {
    if (::fsync(fd_) != 0) fail("fsync failed");
    const int fd = std::exchange(fd_, -1);
    if (::close(fd) != 0) {
      const int error = errno;
      ::unlink(tmp_.c_str());
      throw CheckpointError(xtrain::detail::concat(tmp_, ": close failed (", std::strerror(error), ")"));
    }
    if (std::rename(tmp_.c_str(), path_.c_str()) != 0) {
      const int error = errno;
      ::unlink(tmp_.c_str());
      throw CheckpointError(
          xtrain::detail::concat("cannot rename ", tmp_, " to ", path_, " (", std::strerror(error), ")"));
    }
    const std::string dir = std::filesystem::path(path_).parent_path().string();
    detail::fsync_path(dir.empty() ? "." : dir, O_RDONLY | O_DIRECTORY);
  }

 private:
  [[noreturn]] void fail(const char* what) {
    const int error = errno;
    ::close(std::exchange(fd_, -1));
    ::unlink(tmp_.c_str());
    throw CheckpointError(xtrain::detail::concat(tmp_, ": ", what, " (", std::strerror(error), ")"));
  }
  std::string path_, tmp_;
  int fd_ = -1;
};

/// Writes `parts` one after the other to `path` atomically (AtomicFile).
inline void write_file_atomic(const std::string& path, std::span<const std::string_view> parts) {
  AtomicFile file(path);
  for (const std::string_view part : parts) file.write(part);
  file.commit();
}
inline void write_file_atomic(const std::string& path, std::initializer_list<std::string_view> parts) {
  write_file_atomic(path, std::span<const std::string_view>(parts.begin(), parts.size()));
}

/// Writes a checkpoint file: the header (with the payload's CRC-32) and the payload, the
/// concatenation of `payload` (written as they are, never copied into one), atomically.
inline void write_atomic(const std::string& path, std::span<const std::string_view> payload) {
  std::uint64_t size = 0;
  std::uint32_t crc = 0;
  for (const std::string_view part : payload) {
    size += part.size();
    crc = detail::crc32_of(part, crc);
  }
  std::string header(file_magic, 8);
  detail::put_u32(header, format_version);
  detail::put_u32(header, detail::byte_order_probe());
  detail::put_u32(header, detail::type_sizes());
  detail::put_u64(header, size);
  detail::put_u32(header, crc);
  std::vector<std::string_view> parts{header};
  parts.insert(parts.end(), payload.begin(), payload.end());
  write_file_atomic(path, parts);
}
inline void write_atomic(const std::string& path, const std::string& payload) {
  const std::string_view part = payload;
  write_atomic(path, std::span<const std::string_view>(&part, 1));
}

namespace detail {
/// What a checkpoint file's header says: its format version, payload length and CRC-32.
struct Header {
  std::uint32_t version = 0;
  std::uint64_t payload_size = 0;
  std::uint32_t crc = 0;
};
/// Checks the header at the start of `bytes` (magic, a version this build reads, byte order, type
/// sizes) and returns it; `path` names the file in errors.
inline Header check_header(std::string_view bytes, const std::string& path) {
  XTRAIN_CHECK(bytes.size() >= 8 && std::memcmp(bytes.data(), file_magic, 8) == 0, CheckpointError, path,
               ": not an xtrain checkpoint (wrong magic)");
  XTRAIN_CHECK(bytes.size() >= header_size, CheckpointError, path, ": truncated header (", bytes.size(), " bytes)");
  const char* h = bytes.data() + 8;
  Header header;
  header.version = static_cast<std::uint32_t>(get(h, 4));
  XTRAIN_CHECK(header.version >= oldest_format_version && header.version <= format_version, CheckpointError, path,
               ": checkpoint format version ", header.version, ", this build of xtrain reads versions ",
               oldest_format_version, " to ", format_version);
  XTRAIN_CHECK(static_cast<std::uint32_t>(get(h + 4, 4)) == byte_order_probe(), CheckpointError, path,
               ": written on a machine of another byte order; convert it there with save_model (safetensors)");
  XTRAIN_CHECK(static_cast<std::uint32_t>(get(h + 8, 4)) == type_sizes(), CheckpointError, path,
               ": written on a machine with other type sizes (float/double/size_t/long); convert it there with "
               "save_model (safetensors)");
  header.payload_size = get(h + 12, 8);
  header.crc = static_cast<std::uint32_t>(get(h + 20, 4));
  return header;
}
}  // namespace detail

/// The payload of the checkpoint file `bytes` (a view into it) after checking every header field
/// and the CRC-32; `path` names the file in errors; the format version goes to `*version`.
inline std::string_view verified_payload(const std::string& bytes, const std::string& path,
                                         std::uint32_t* version = nullptr) {
  const detail::Header h = detail::check_header(bytes, path);
  if (version) *version = h.version;
  XTRAIN_CHECK(bytes.size() - header_size == h.payload_size, CheckpointError, path,
               ": truncated: the header announces ", h.payload_size, " payload bytes, the file holds ",
               bytes.size() - header_size);
  const std::string_view payload = std::string_view(bytes).substr(header_size);
  XTRAIN_CHECK(detail::crc32_of(payload) == h.crc, CheckpointError, path,
               ": corrupt: CRC-32 of the payload does not match the header");
  return payload;
}
/// The payload of the checkpoint file `bytes`, checked (see verified_payload).
inline std::string verify(const std::string& bytes, const std::string& path, std::uint32_t* version = nullptr) {
  return std::string(verified_payload(bytes, path, version));
}

/// The bytes of the file at `path`.
inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  XTRAIN_CHECK(in.good(), CheckpointError, path, ": cannot open (", std::strerror(errno), ")");
  std::string bytes(static_cast<std::size_t>(in.tellg()), '\0');
  in.seekg(0);
  in.read(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  XTRAIN_CHECK(in.gcount() == static_cast<std::streamsize>(bytes.size()), CheckpointError, path, ": read failed (",
               std::strerror(errno), ")");
  return bytes;
}

/// Reads `path` and returns its verified payload (see verify).
inline std::string read_verified(const std::string& path, std::uint32_t* version = nullptr) {
  return verify(read_file(path), path, version);
}

}  // namespace xtrain::checkpoint

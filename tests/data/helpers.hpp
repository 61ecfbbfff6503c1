#pragma once
// Helpers of the data tests: a fresh folder per test, and NPY, IDX and gzip files written byte by
// byte as NumPy and the MNIST distribution write them.

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <zlib.h>

namespace xtrain::test {

/// A fresh directory for one test's files.
inline std::filesystem::path temp_dir(const std::string& name) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / ("xtrain_test_" + name);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

inline void write_bytes(const std::filesystem::path& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

template <class T>
std::string raw(const std::vector<T>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

/// A .npy file as NumPy writes it (header padded to 64 bytes).
inline std::string npy(const std::string& descr, const std::string& shape, const std::string& data, int version = 1,
                       const std::string& fortran = "False") {
  std::string header = "{'descr': '" + descr + "', 'fortran_order': " + fortran + ", 'shape': " + shape + ", }";
  const std::size_t prefix = version == 1 ? 10 : 12;
  while ((prefix + header.size() + 1) % 64) header += ' ';
  header += '\n';
  std::string out = "\x93NUMPY";
  out += static_cast<char>(version);
  out += '\0';
  const auto len = static_cast<std::uint32_t>(header.size());
  out += static_cast<char>(len & 0xFF);
  out += static_cast<char>((len >> 8) & 0xFF);
  if (version > 1) {
    out += static_cast<char>((len >> 16) & 0xFF);
    out += static_cast<char>(len >> 24);
  }
  return out + header + data;
}

inline std::string idx(const std::vector<std::uint32_t>& dims, const std::vector<unsigned char>& data,
                       unsigned char type = 8) {
  std::string out{'\0', '\0', static_cast<char>(type), static_cast<char>(dims.size())};
  for (auto d : dims)
    for (int s = 24; s >= 0; s -= 8) out += static_cast<char>((d >> s) & 0xFF);
  return out + std::string(data.begin(), data.end());
}

inline void write_gz(const std::filesystem::path& path, const std::string& bytes) {
  gzFile f = gzopen(path.c_str(), "wb");
  gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size()));
  gzclose(f);
}

/// A small valid Fashion-MNIST-style folder: `n` 2x2 images, labels i % 10.
inline void write_idx_folder(const std::filesystem::path& dir, std::size_t n, bool gz) {
  std::vector<unsigned char> pixels(n * 4), labels(n);
  for (std::size_t i = 0; i < pixels.size(); ++i) pixels[i] = static_cast<unsigned char>(i * 7);
  for (std::size_t i = 0; i < n; ++i) labels[i] = static_cast<unsigned char>(i % 10);
  const auto n32 = static_cast<std::uint32_t>(n);
  for (std::string split : {"train", "t10k"}) {
    const std::string images = idx({n32, 2, 2}, pixels), labs = idx({n32}, labels);
    if (gz) {
      write_gz(dir / (split + "-images-idx3-ubyte.gz"), images);
      write_gz(dir / (split + "-labels-idx1-ubyte.gz"), labs);
    } else {
      write_bytes(dir / (split + "-images-idx3-ubyte"), images);
      write_bytes(dir / (split + "-labels-idx1-ubyte"), labs);
    }
  }
}

}  // namespace xtrain::test

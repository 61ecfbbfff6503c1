#pragma once
/// \file npy.hpp
/// NumPy .npy reader (format versions 1, 2, 3): float32, float64, uint8, int32, int64, little-endian,
/// C order. Anything else is refused with a message naming the file and the problem.

#include <bit>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "xtrain/core/error.hpp"
#include "xtrain/core/tensor.hpp"
#include "xtrain/data/file.hpp"

namespace xtrain::data {

/// Element types the reader accepts.
enum class NpyType { float32, float64, uint8, int32, int64 };

/// A parsed .npy file: shape, element type and the raw little-endian data.
struct NpyArray {
  std::string path;
  std::vector<std::size_t> shape;
  NpyType type = NpyType::float32;
  std::vector<unsigned char> bytes;  ///< the whole file; data starts at `offset`
  std::size_t offset = 0;

  std::size_t count() const {
    std::size_t n = 1;
    for (auto d : shape) n *= d;
    return n;
  }
  /// Element i converted to double.
  double at(std::size_t i) const {
    const unsigned char* p = bytes.data() + offset;
    switch (type) {
      case NpyType::float32:
        return load<float>(p, i);
      case NpyType::float64:
        return load<double>(p, i);
      case NpyType::uint8:
        return p[i];
      case NpyType::int32:
        return load<std::int32_t>(p, i);
      case NpyType::int64:
        return static_cast<double>(load<std::int64_t>(p, i));
    }
    return 0.0;
  }
  bool is_integer() const { return type != NpyType::float32 && type != NpyType::float64; }

 private:
  template <class T>
  static T load(const unsigned char* p, std::size_t i) {
    T v;
    std::memcpy(&v, p + i * sizeof(T), sizeof(T));
    return v;
  }
};

namespace detail {
inline std::string npy_header_value(const std::string& header, const std::string& key, const std::string& path) {
  const auto k = header.find("'" + key + "'");
  XTRAIN_CHECK(k != std::string::npos, DataError, path, ": .npy header has no '", key, "' entry: ", header);
  auto colon = header.find(':', k);
  XTRAIN_CHECK(colon != std::string::npos, DataError, path, ": malformed .npy header: ", header);
  ++colon;
  while (colon < header.size() && header[colon] == ' ') ++colon;
  std::size_t end = colon;
  if (end < header.size() && header[end] == '(') {
    end = header.find(')', end);
    XTRAIN_CHECK(end != std::string::npos, DataError, path, ": malformed shape in .npy header: ", header);
    return header.substr(colon, end - colon + 1);
  }
  if (end < header.size() && header[end] == '\'') {
    end = header.find('\'', end + 1);
    XTRAIN_CHECK(end != std::string::npos, DataError, path, ": malformed .npy header: ", header);
    return header.substr(colon + 1, end - colon - 1);
  }
  end = header.find_first_of(",}", colon);
  return header.substr(colon, end - colon);
}
}  // namespace detail

/// Parses the bytes of a .npy file; `path` names it in errors. Throws DataError naming the file for:
/// bad magic, unsupported version, malformed header, big-endian or unsupported dtype,
/// Fortran order, and data shorter than the shape says (truncated).
inline NpyArray parse_npy(std::vector<unsigned char> bytes, const std::string& path) {
  static_assert(std::endian::native == std::endian::little, "xtrain's .npy reader assumes a little-endian host");
  NpyArray a;
  a.path = path;
  a.bytes = std::move(bytes);
  const auto& b = a.bytes;
  XTRAIN_CHECK(b.size() >= 10 && std::memcmp(b.data(), "\x93NUMPY", 6) == 0, DataError, path,
               ": not a .npy file (wrong magic; expected \\x93NUMPY)");
  const unsigned major = b[6];
  XTRAIN_CHECK(major >= 1 && major <= 3, DataError, path, ": unsupported .npy format version ", major, ".", +b[7]);
  std::size_t header_len = 0, start = 0;
  if (major == 1) {
    header_len = static_cast<std::size_t>(b[8]) | (static_cast<std::size_t>(b[9]) << 8);
    start = 10;
  } else {
    XTRAIN_CHECK(b.size() >= 12, DataError, path, ": truncated .npy header");
    header_len = static_cast<std::size_t>(b[8]) | (static_cast<std::size_t>(b[9]) << 8) |
                 (static_cast<std::size_t>(b[10]) << 16) | (static_cast<std::size_t>(b[11]) << 24);
    start = 12;
  }
  XTRAIN_CHECK(start + header_len <= b.size(), DataError, path, ": truncated .npy header (", header_len,
               " bytes announced, ", b.size() - start, " present)");
  const std::string header(reinterpret_cast<const char*>(b.data() + start), header_len);
  a.offset = start + header_len;

  const std::string descr = detail::npy_header_value(header, "descr", path);
  XTRAIN_CHECK(descr.size() >= 2, DataError, path, ": malformed dtype '", descr, "'");
  XTRAIN_CHECK(descr[0] != '>', DataError, path, ": big-endian data (dtype '", descr,
               "') is not supported; convert with arr.astype(arr.dtype.newbyteorder('<'))");
  const std::string kind = descr.substr(1);
  std::size_t item = 0;
  if (kind == "f4")
    a.type = NpyType::float32, item = 4;
  else if (kind == "f8")
    a.type = NpyType::float64, item = 8;
  else if (kind == "u1")
    a.type = NpyType::uint8, item = 1;
  else if (kind == "i4")
    a.type = NpyType::int32, item = 4;
  else if (kind == "i8")
    a.type = NpyType::int64, item = 8;
  else
    throw DataError(path + ": unsupported dtype '" + descr + "' (supported: float32, float64, uint8, int32, int64)");

  const std::string fortran = detail::npy_header_value(header, "fortran_order", path);
  XTRAIN_CHECK(fortran.find("False") != std::string::npos, DataError, path,
               ": Fortran-order arrays are not supported; save with np.ascontiguousarray(arr)");

  const std::string shape = detail::npy_header_value(header, "shape", path);
  std::size_t i = 1;
  while (i < shape.size()) {
    while (i < shape.size() && (shape[i] == ' ' || shape[i] == ',')) ++i;
    if (i >= shape.size() || shape[i] == ')') break;
    XTRAIN_CHECK(shape[i] >= '0' && shape[i] <= '9', DataError, path, ": malformed shape ", shape);
    std::size_t d = 0;
    while (i < shape.size() && shape[i] >= '0' && shape[i] <= '9') {
      XTRAIN_CHECK(d < (std::size_t{1} << 48), DataError, path, ": dimension too large in shape ", shape);
      d = d * 10 + static_cast<std::size_t>(shape[i++] - '0');
    }
    a.shape.push_back(d);
  }
  std::size_t need = item;
  for (const auto d : a.shape)
    XTRAIN_CHECK(checked_multiply(need, d, need), DataError, path, ": shape ", shape_string(a.shape), " is too large");
  const std::size_t have = b.size() - a.offset;
  XTRAIN_CHECK(have >= need, DataError, path, ": truncated: shape ", shape_string(a.shape), " needs ", need,
               " bytes of data, the file has ", have);
  return a;
}

/// Reads and parses the .npy file at `path` (see parse_npy).
inline NpyArray read_npy(const std::string& path) { return parse_npy(read_file_bytes(path), path); }

/// Loads a .npy array of samples of any numeric dtype and rank as an fp32 tensor of its shape
/// (`[N, 784]`, `[N, 1, 28, 28]`, ...). Throws DataError naming the file for a scalar.
inline Tensor<float> load_npy_tensor(const std::string& path) {
  const NpyArray a = read_npy(path);
  XTRAIN_CHECK(!a.shape.empty(), DataError, path, ": expected an array of samples, found a scalar");
  XTRAIN_CHECK(a.shape.size() <= Shape::max_rank, DataError, path, ": ", a.shape.size(), " dimensions; at most ",
               Shape::max_rank, " are supported");
  Tensor<float> m{Shape(a.shape)};
  const std::size_t n = a.count();
  if (a.type == NpyType::float32)
    std::memcpy(m.data(), a.bytes.data() + a.offset, n * sizeof(float));
  else
    for (std::size_t i = 0; i < n; ++i) m.data()[i] = static_cast<float>(a.at(i));
  return m;
}

/// Loads a .npy array of any numeric dtype as fp32 rows `[shape[0], product of the rest]`.
inline Tensor<float> load_npy_features(const std::string& path) {
  Tensor<float> m = load_npy_tensor(path);
  const std::size_t rows = m.shape(0);
  m.resize({rows, rows ? m.size() / rows : 0});  // the same elements, viewed as rows
  return m;
}

/// Loads a 1-D integer .npy array as class labels. Throws DataError naming the file for a float
/// dtype, a rank other than 1, or a negative label.
inline std::vector<std::int32_t> load_npy_labels(const std::string& path) {
  const NpyArray a = read_npy(path);
  XTRAIN_CHECK(a.is_integer(), DataError, path, ": labels must have an integer dtype (uint8, int32, int64)");
  XTRAIN_CHECK(a.shape.size() == 1, DataError, path, ": labels must be 1-D, found shape ", shape_string(a.shape));
  std::vector<std::int32_t> y(a.count());
  for (std::size_t i = 0; i < y.size(); ++i) {
    const double v = a.at(i);
    XTRAIN_CHECK(v >= 0 && v < 2147483647.0, DataError, path, ": label ", static_cast<long long>(v), " of sample ", i,
                 " is negative or too large");
    y[i] = static_cast<std::int32_t>(v);
  }
  return y;
}

}  // namespace xtrain::data

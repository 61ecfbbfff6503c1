// Data: NPY and IDX readers (good files and every bad-file case), the two folder layouts, the
// real Fashion-MNIST, and the global-permutation sampler and loader.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include <zlib.h>

#include "support.hpp"
#include "xtrain/xtrain.hpp"

using namespace xtrain;
namespace fs = std::filesystem;

namespace {
/// A fresh directory for one test's files.
fs::path temp_dir(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / ("xtrain_test_" + name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

void write_bytes(const fs::path& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

template <class T>
std::string raw(const std::vector<T>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

/// A .npy file as NumPy writes it (header padded to 64 bytes).
std::string npy(const std::string& descr, const std::string& shape, const std::string& data, int version = 1,
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

std::string idx(const std::vector<std::uint32_t>& dims, const std::vector<unsigned char>& data,
                unsigned char type = 8) {
  std::string out{'\0', '\0', static_cast<char>(type), static_cast<char>(dims.size())};
  for (auto d : dims)
    for (int s = 24; s >= 0; s -= 8) out += static_cast<char>((d >> s) & 0xFF);
  return out + std::string(data.begin(), data.end());
}

void write_gz(const fs::path& path, const std::string& bytes) {
  gzFile f = gzopen(path.c_str(), "wb");
  gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size()));
  gzclose(f);
}

/// A small valid Fashion-MNIST-style folder: `n` 2x2 images, labels i % 10.
void write_idx_folder(const fs::path& dir, std::size_t n, bool gz) {
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

void write_npy_folder(const fs::path& dir, std::vector<float> train_x, std::vector<std::int64_t> train_y) {
  const std::string n = std::to_string(train_y.size());
  const std::string d = std::to_string(train_x.size() / train_y.size());
  write_bytes(dir / "train_x.npy", npy("<f4", "(" + n + ", " + d + ")", raw(train_x)));
  write_bytes(dir / "train_y.npy", npy("<i8", "(" + n + ",)", raw(train_y)));
  write_bytes(dir / "test_x.npy", npy("<f4", "(" + n + ", " + d + ")", raw(train_x)));
  write_bytes(dir / "test_y.npy", npy("<i8", "(" + n + ",)", raw(train_y)));
}
}  // namespace

TEST_CASE("NPY: every supported dtype, format versions 1 and 2, trailing dims flattened", "[data][npy]") {
  const fs::path dir = temp_dir("npy_good");
  write_bytes(dir / "f4.npy", npy("<f4", "(2, 3)", raw(std::vector<float>{1, 2, 3, 4, 5, 6.5f})));
  write_bytes(dir / "f8.npy", npy("<f8", "(2, 1, 3)", raw(std::vector<double>{1, 2, 3, 4, 5, -6}), 2));
  write_bytes(dir / "u1.npy", npy("|u1", "(3,)", raw(std::vector<unsigned char>{0, 7, 255})));
  write_bytes(dir / "i4.npy", npy("<i4", "(3,)", raw(std::vector<std::int32_t>{3, 0, 19})));
  write_bytes(dir / "i8.npy", npy("<i8", "(3,)", raw(std::vector<std::int64_t>{1, 2, 3}), 3));
  const Matrix a = data::load_npy_features((dir / "f4.npy").string());
  REQUIRE(a.shape(0) == 2);
  REQUIRE(a(1, 2) == 6.5f);
  const Matrix b = data::load_npy_features((dir / "f8.npy").string());
  REQUIRE(b.shape(1) == 3);
  REQUIRE(b(1, 2) == -6.0f);
  REQUIRE(data::load_npy_labels((dir / "u1.npy").string()) == std::vector<std::int32_t>{0, 7, 255});
  REQUIRE(data::load_npy_labels((dir / "i4.npy").string()) == std::vector<std::int32_t>{3, 0, 19});
  REQUIRE(data::load_npy_labels((dir / "i8.npy").string()) == std::vector<std::int32_t>{1, 2, 3});
}

TEST_CASE("NPY: bad files get an error naming the file and the problem", "[data][npy][errors]") {
  const fs::path dir = temp_dir("npy_bad");
  const std::string six = raw(std::vector<float>{1, 2, 3, 4, 5, 6});
  auto expect = [&](const std::string& name, const std::string& bytes, const std::string& problem) {
    const std::string path = (dir / name).string();
    if (!bytes.empty()) write_bytes(path, bytes);
    INFO(name);
    REQUIRE_THROWS_AS(data::load_npy_features(path), DataError);
    REQUIRE_THROWS_WITH(data::load_npy_features(path), Catch::Contains(path) && Catch::Contains(problem));
  };
  expect("missing.npy", "", "cannot open");
  expect("magic.npy", "PK\x03\x04 this is a zip", "wrong magic");
  expect("truncated.npy", npy("<f4", "(2, 3)", six.substr(0, 10)), "truncated");
  expect("header.npy", npy("<f4", "(2, 3)", six).substr(0, 30), "truncated .npy header");
  expect("fortran.npy", npy("<f4", "(2, 3)", six, 1, "True"), "Fortran-order");
  expect("bigendian.npy", npy(">f4", "(2, 3)", six), "big-endian");
  expect("complex.npy", npy("<c8", "(3,)", six), "unsupported dtype '<c8'");
  const std::string labels = (dir / "float_labels.npy").string();
  write_bytes(labels, npy("<f4", "(6,)", six));
  REQUIRE_THROWS_WITH(data::load_npy_labels(labels), Catch::Contains(labels) && Catch::Contains("integer dtype"));
}

TEST_CASE("Homework .npy folder: any feature and class count and bad contents are named", "[data][npy][errors]") {
  const fs::path dir = temp_dir("npy_folder");
  write_npy_folder(dir, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}, {0, 4, 2, 1});
  const auto [train, test] = data::load_folder(dir.string());
  REQUIRE(train.size() == 4);
  REQUIRE(train.feature_count() == 3);
  REQUIRE(train.num_classes() == 5);
  REQUIRE(test.labels()[1] == 4);

  SECTION("NaN feature") {
    std::vector<float> x(12, 1.0f);
    x[7] = std::numeric_limits<float>::quiet_NaN();
    write_npy_folder(dir, x, {0, 1, 2, 3});
    REQUIRE_THROWS_WITH(data::load_folder(dir.string()),
                        Catch::Contains("train_{x,y}.npy") && Catch::Contains("sample 2, feature 1 is nan"));
  }
  SECTION("feature and label counts differ") {
    write_bytes(dir / "train_y.npy", npy("<i8", "(3,)", raw(std::vector<std::int64_t>{0, 1, 2})));
    REQUIRE_THROWS_WITH(data::load_folder(dir.string()), Catch::Contains("4 samples but 3 labels"));
  }
  SECTION("negative label") {
    write_bytes(dir / "test_y.npy", npy("<i8", "(4,)", raw(std::vector<std::int64_t>{0, -1, 2, 3})));
    REQUIRE_THROWS_WITH(data::load_folder(dir.string()),
                        Catch::Contains("test_y.npy") && Catch::Contains("label -1 of sample 1"));
  }
  SECTION("test features of another width") {
    write_bytes(dir / "test_x.npy", npy("<f4", "(4, 2)", raw(std::vector<float>(8, 0.0f))));
    REQUIRE_THROWS_WITH(data::load_folder(dir.string()), Catch::Contains("test_x.npy has 2 features"));
  }
}

TEST_CASE("IDX: plain and gzip folders load and bad files are named", "[data][idx][errors]") {
  for (bool gz : {false, true}) {
    const fs::path dir = temp_dir(gz ? "idx_gz" : "idx_plain");
    write_idx_folder(dir, 12, gz);
    const auto [train, test] = data::fashion_mnist(dir.string());
    REQUIRE(train.size() == 12);
    REQUIRE(train.feature_count() == 4);
    REQUIRE(train.features()(1, 3) == Approx(((4 + 3) * 7 % 256) / 255.0));
    REQUIRE(test.labels()[11] == 1);
  }
  const fs::path dir = temp_dir("idx_bad");
  auto expect = [&](const std::string& problem) {
    INFO(problem);
    REQUIRE_THROWS_AS(data::fashion_mnist(dir.string()), DataError);
    REQUIRE_THROWS_WITH(data::fashion_mnist(dir.string()), Catch::Contains(dir.string()) && Catch::Contains(problem));
  };
  expect("missing train-images-idx3-ubyte");
  write_idx_folder(dir, 12, false);
  SECTION("wrong magic") {
    write_bytes(dir / "train-images-idx3-ubyte", "\x12\x34\x08\x03 not idx");
    expect("wrong magic");
  }
  SECTION("element type") {
    write_bytes(dir / "train-images-idx3-ubyte", idx({1, 1, 1}, {0, 0, 0, 0}, 0x0D));
    expect("element type 0xd");
  }
  SECTION("truncated data") {
    write_bytes(dir / "train-images-idx3-ubyte", idx({12, 2, 2}, std::vector<unsigned char>(40)));
    expect("truncated");
  }
  SECTION("truncated gzip stream") {
    fs::remove(dir / "train-images-idx3-ubyte");
    write_gz(dir / "train-images-idx3-ubyte.gz", idx({12, 2, 2}, std::vector<unsigned char>(48)));
    std::string bytes;
    {
      std::ifstream in(dir / "train-images-idx3-ubyte.gz", std::ios::binary);
      bytes.assign(std::istreambuf_iterator<char>(in), {});
    }
    write_bytes(dir / "train-images-idx3-ubyte.gz", bytes.substr(0, bytes.size() / 2));
    expect("corrupt or truncated compressed data");
  }
  SECTION("image and label counts differ") {
    write_bytes(dir / "train-labels-idx1-ubyte", idx({11}, std::vector<unsigned char>(11)));
    expect("has 12 images but");
  }
  SECTION("label >= classes") {
    std::vector<unsigned char> labels(12, 3);
    labels[5] = 12;
    write_bytes(dir / "t10k-labels-idx1-ubyte", idx({12}, labels));
    expect("label 12 of sample 5 is outside [0, 10)");
  }
}

TEST_CASE("The real Fashion-MNIST from Debian's dataset-fashion-mnist", "[data][fashion]") {
  const auto [train, test] = data::fashion_mnist(test::fashion_dir());
  REQUIRE(train.size() == 60000);
  REQUIRE(test.size() == 10000);
  REQUIRE(train.feature_count() == 784);
  std::vector<std::size_t> per_class(10, 0);
  for (auto y : train.labels()) ++per_class[static_cast<std::size_t>(y)];
  for (auto c : per_class) REQUIRE(c == 6000);  // Fashion-MNIST is balanced
  float lo = 1, hi = 0;
  for (float v : train.features()) lo = std::min(lo, v), hi = std::max(hi, v);
  REQUIRE(lo == 0.0f);
  REQUIRE(hi == 1.0f);
}

TEST_CASE("Sampler: one permutation per (seed, epoch), whatever the rank count", "[data][sampler]") {
  const std::size_t n = 1003, batch = 64;
  parallel::GlobalSampler one(n, batch, 42);
  auto perm = std::vector<std::uint32_t>(one.permutation().begin(), one.permutation().end());
  std::vector<std::uint32_t> sorted = perm;
  std::sort(sorted.begin(), sorted.end());
  std::vector<std::uint32_t> iota(n);
  std::iota(iota.begin(), iota.end(), 0u);
  REQUIRE(sorted == iota);  // a permutation
  REQUIRE(perm != iota);    // shuffled
  parallel::GlobalSampler again(n, batch, 42);
  REQUIRE(std::equal(perm.begin(), perm.end(), again.permutation().begin()));
  again.set_epoch(1);
  REQUIRE_FALSE(std::equal(perm.begin(), perm.end(), again.permutation().begin()));
  REQUIRE(one.batches() == 16);  // 15 full + 1 partial of 43
  REQUIRE(parallel::GlobalSampler(n, batch, 42, true, true).batches() == 15);
  REQUIRE(parallel::GlobalSampler(n, batch, 42, false).permutation()[17] == 17);

  for (std::size_t world : {2u, 3u, 4u}) {
    for (std::size_t k = 0; k < one.batches(); ++k) {
      std::vector<std::uint32_t> joined;
      for (std::size_t r = 0; r < world; ++r) {
        parallel::GlobalSampler s(n, batch, 42, true, false, r, world);
        const auto shard = s.shard(k);
        REQUIRE(shard.global_offset == joined.size());
        REQUIRE(shard.global_count == one.shard(k).global_count);
        joined.insert(joined.end(), shard.indices.begin(), shard.indices.end());
      }
      const auto whole = one.shard(k).indices;
      REQUIRE(std::equal(joined.begin(), joined.end(), whole.begin(), whole.end()));
    }
  }
  REQUIRE_THROWS_WITH(parallel::GlobalSampler(n, 2, 1, true, false, 0, 4),
                      Catch::Contains("smaller than the number of ranks"));
}

TEST_CASE("Loader: batches gathered into a reused buffer", "[data][loader]") {
  const fs::path dir = temp_dir("loader");
  write_idx_folder(dir, 100, false);
  const auto split = data::fashion_mnist(dir.string());
  data::Loader loader(split.train, 32, 7);
  REQUIRE(loader.batches() == 4);
  const float* buffer = loader.batch(0).x.data();
  for (std::size_t k = 1; k < 3; ++k) REQUIRE(loader.batch(k).x.data() == buffer);  // no reallocation
  const auto last = loader.batch(3);
  REQUIRE(last.y.size() == 4);
  std::set<std::int32_t> seen;
  const auto perm = loader.sampler().permutation();
  const auto b = loader.batch(1);
  for (std::size_t i = 0; i < 32; ++i) {
    REQUIRE(b.y[i] == split.train.labels()[perm[32 + i]]);
    REQUIRE(b.x(i, 0) == split.train.features()(perm[32 + i], 0));
  }
}

// data/npy.hpp: every supported dtype, format versions 1 to 3, trailing dimensions flattened, and
// an error naming the file and the problem for every kind of bad file.
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "data/helpers.hpp"
#include "xtrain/xtrain.hpp"

using namespace xtrain;
using namespace xtrain::test;
namespace fs = std::filesystem;

TEST_CASE("NPY: every supported dtype, format versions 1 and 2, trailing dims flattened", "[data][npy]") {
  const fs::path dir = temp_dir("npy_good");
  write_bytes(dir / "f4.npy", npy("<f4", "(2, 3)", raw(std::vector<float>{1, 2, 3, 4, 5, 6.5f})));
  write_bytes(dir / "f8.npy", npy("<f8", "(2, 1, 3)", raw(std::vector<double>{1, 2, 3, 4, 5, -6}), 2));
  write_bytes(dir / "u1.npy", npy("|u1", "(3,)", raw(std::vector<unsigned char>{0, 7, 255})));
  write_bytes(dir / "i4.npy", npy("<i4", "(3,)", raw(std::vector<std::int32_t>{3, 0, 19})));
  write_bytes(dir / "i8.npy", npy("<i8", "(3,)", raw(std::vector<std::int64_t>{1, 2, 3}), 3));
  const Tensor<float> a = data::load_npy_features((dir / "f4.npy").string());
  REQUIRE(a.shape(0) == 2);
  REQUIRE(a(1, 2) == 6.5f);
  const Tensor<float> b = data::load_npy_features((dir / "f8.npy").string());
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

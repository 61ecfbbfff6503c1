// data/idx.hpp: plain and gzip IDX folders load, and every kind of bad file is named (magic,
// element type, truncated data or gzip stream, count mismatch, label out of range).
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "data/helpers.hpp"
#include "xtrain/xtrain.hpp"

using namespace xtrain;
using namespace xtrain::test;
namespace fs = std::filesystem;

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

// data/dataset.hpp: the homework's .npy folder (any feature and class count, bad contents named)
// and the real Fashion-MNIST from Debian's dataset-fashion-mnist.
#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "data/helpers.hpp"
#include "support.hpp"
#include "xtrain/xtrain.hpp"

using namespace xtrain;
using namespace xtrain::test;
namespace fs = std::filesystem;

namespace {
void write_npy_folder(const fs::path& dir, std::vector<float> train_x, std::vector<std::int64_t> train_y) {
  const std::string n = std::to_string(train_y.size());
  const std::string d = std::to_string(train_x.size() / train_y.size());
  write_bytes(dir / "train_x.npy", npy("<f4", "(" + n + ", " + d + ")", raw(train_x)));
  write_bytes(dir / "train_y.npy", npy("<i8", "(" + n + ",)", raw(train_y)));
  write_bytes(dir / "test_x.npy", npy("<f4", "(" + n + ", " + d + ")", raw(train_x)));
  write_bytes(dir / "test_y.npy", npy("<i8", "(" + n + ",)", raw(train_y)));
}
}  // namespace

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
    REQUIRE_THROWS_WITH(data::load_folder(dir.string()),
                        Catch::Contains("test_x.npy has samples of shape [2] but train_x.npy has [3]"));
  }
}

TEST_CASE("A .npy folder of images keeps their shape; with_sample_shape views them as rows", "[data][npy]") {
  const fs::path dir = temp_dir("npy_images");
  std::vector<float> x(4 * 2 * 3);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i);
  for (const char* name : {"train_x.npy", "test_x.npy"}) write_bytes(dir / name, npy("<f4", "(4, 1, 2, 3)", raw(x)));
  for (const char* name : {"train_y.npy", "test_y.npy"})
    write_bytes(dir / name, npy("<i8", "(4,)", raw(std::vector<std::int64_t>{0, 1, 1, 0})));
  auto [train, test] = data::load_folder(dir.string());
  REQUIRE(train.sample_shape() == Shape{1, 2, 3});
  REQUIRE(train.feature_count() == 6);
  REQUIRE(train.features()(2, 0, 1, 2) == 17.0f);
  train.with_sample_shape(Shape{6});
  REQUIRE(train.features().shape() == Shape{4, 6});
  REQUIRE(train.features()(2, 5) == 17.0f);
  test.truncate(3);
  REQUIRE(test.size() == 3);
  REQUIRE(test.labels().size() == 3);
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

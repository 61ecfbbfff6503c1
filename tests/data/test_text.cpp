// data/text.hpp: the text data set of the char GPT: file order, skipped files, vocabulary,
// windows, rank-invariant random batches.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "layers/helpers.hpp"
#include "parity.hpp"
#include "support.hpp"
#include "xtrain/kernels/reference/attention.hpp"
#include "xtrain/xtrain.hpp"

using namespace xtrain;
using namespace xtrain::test;
namespace nn = xtrain::layers;

TEST_CASE("Text corpus: file order, skipped files, vocabulary, windows and random batches", "[transformer][data]") {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("xtrain_text_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  auto write = [&](const std::string& name, const std::string& text) { std::ofstream(dir / name) << text; };
  write("b", "bca\n");
  write("a", "hello ");
  write("a.dat", "INDEX");
  fs::create_symlink(dir / "a", dir / "a.u8");
  fs::create_symlink(dir / "b", dir / "c_link");  // a link to a file counts
  fs::create_symlink(dir / "missing", dir / "d_dangling");
  fs::create_directories(dir / "e_folder");
  CHECK(data::read_corpus(dir.string()) == "hello bca\nbca\n");
  fs::remove(dir / "c_link");
  CHECK(data::read_corpus(dir.string()) == "hello bca\n");
  CHECK(data::read_corpus((dir / "b").string()) == "bca\n");

  const data::CharVocab vocab("hello bca\n");
  CHECK(vocab.chars() == "\n abcehlo");
  CHECK(vocab.encode('\n') == 0);
  CHECK(vocab.decode(vocab.encode("cab")) == "cab");
  CHECK_THROWS_WITH(vocab.encode('z'), Catch::Contains("not in the vocabulary"));

  write("c", std::string(200, 'x') + "0123456789");
  const data::TextSplit split = data::char_text(dir.string(), 4);
  const std::size_t n = 10 + 210;
  CHECK(split.train.tokens().size() == n * 9 / 10);
  CHECK(split.val.tokens().size() == n - n * 9 / 10);
  CHECK(split.train.size() == split.train.tokens().size() - 4);
  Tensor<std::int32_t> x, y;
  const std::uint32_t starts[] = {0, 3};
  split.train.gather(starts, x, y);
  REQUIRE(x.shape() == Shape{2, 4});
  CHECK(split.vocab.decode(std::span<const std::int32_t>(x.data(), 4)) == "hell");
  CHECK(split.vocab.decode(std::span<const std::int32_t>(y.data(), 4)) == "ello");
  CHECK(split.vocab.decode(std::span<const std::int32_t>(x.data() + 4, 4)) == "lo b");

  // Two ranks' shares of a global batch of 5 are the batch one rank draws, and differ per step.
  Tensor<std::int32_t> whole_x, whole_y, a_x, a_y, b_x, b_y;
  split.train.draw(7, 12, 0, 5, whole_x, whole_y);
  split.train.draw(7, 12, 0, 3, a_x, a_y);
  split.train.draw(7, 12, 3, 2, b_x, b_y);
  CHECK(std::equal(a_x.begin(), a_x.end(), whole_x.begin()));
  CHECK(std::equal(b_x.begin(), b_x.end(), whole_x.begin() + 12));
  CHECK(std::equal(b_y.begin(), b_y.end(), whole_y.begin() + 12));
  std::size_t same = 0;
  for (std::size_t i = 0; i < 5; ++i) same += split.train.random_start(7, 12, i) == split.train.random_start(7, 13, i);
  CHECK(same < 5);

  CHECK_THROWS_WITH(data::char_text(dir.string(), 30), Catch::Contains("use a shorter block"));
  CHECK_THROWS_WITH(data::TokenWindows().random_start(1, 2, 3), Catch::Contains("no windows"));
  CHECK(!data::CharVocab().contains('a'));
  CHECK_THROWS_WITH(data::read_corpus((dir / "missing").string()), Catch::Contains("apt-get install fortunes"));
  fs::remove_all(dir);
}

#pragma once
/// \file text.hpp
/// Text for character-level language models: the bytes of a file or a folder, a character
/// vocabulary, and windows of `block` tokens as a Dataset (sample i: x = tokens[i, i + block),
/// y = tokens[i + 1, i + block + 1)). Random windows are drawn from a counter (seed, step,
/// sample), not from a generator's state: batch k is the same on any number of ranks and after a
/// resume at step k.

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "xtrain/core/error.hpp"
#include "xtrain/core/rng.hpp"
#include "xtrain/core/tensor.hpp"
#include "xtrain/data/file.hpp"

namespace xtrain::data {

/// Where char_gpt looks for text when given none: Debian's `fortunes` package.
inline constexpr const char* default_corpus = "/usr/share/games/fortunes";

/// The bytes of `path`: a file, or every regular file directly in a folder (a link to one counts),
/// in byte order of their names, concatenated. In a folder, names ending in `.dat` or `.u8` (the
/// fortune program's index files and its links to the texts) are skipped. Throws DataError when
/// there is nothing to read.
inline std::string read_corpus(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::file_status status = fs::status(path, ec);
  XTRAIN_CHECK(!ec && fs::exists(status), DataError, path,
               ": no such file or folder (char_gpt reads Debian's fortunes package by default: apt-get install "
               "fortunes, or give --corpus FILE_OR_FOLDER)");
  std::vector<std::string> files;
  std::size_t skipped = 0;
  if (fs::is_directory(status)) {
    for (const auto& entry : fs::directory_iterator(path)) {
      const std::string name = entry.path().filename().string();
      if (!entry.is_regular_file() || name.ends_with(".dat") || name.ends_with(".u8")) {
        ++skipped;
        continue;
      }
      files.push_back(entry.path().string());
    }
    std::sort(files.begin(), files.end());
  } else {
    files.push_back(path);
  }
  std::string text;
  for (const auto& f : files) {
    const std::vector<unsigned char> bytes = read_file_bytes(f);
    text.append(bytes.begin(), bytes.end());
  }
  XTRAIN_CHECK(!text.empty(), DataError, path, ": no text (", files.size(), " files read; ", skipped,
               " entries skipped: folders, *.dat, *.u8, links to nothing)");
  return text;
}

/// The distinct bytes of a text, sorted: token id i is the i-th of them.
class CharVocab {
 public:
  CharVocab() { ids_.fill(-1); }
  explicit CharVocab(std::string_view text) {
    std::array<bool, 256> seen{};
    for (const char c : text) seen[static_cast<unsigned char>(c)] = true;
    for (std::size_t b = 0; b < 256; ++b)
      if (seen[b]) chars_.push_back(static_cast<char>(b));
    rebuild();
  }
  /// From the characters themselves (a vocabulary saved as its chars()).
  static CharVocab from_chars(std::string chars) {
    CharVocab v;
    v.chars_ = std::move(chars);
    std::sort(v.chars_.begin(), v.chars_.end(),
              [](char a, char b) { return static_cast<unsigned char>(a) < static_cast<unsigned char>(b); });
    v.chars_.erase(std::unique(v.chars_.begin(), v.chars_.end()), v.chars_.end());
    v.rebuild();
    return v;
  }

  std::size_t size() const noexcept { return chars_.size(); }
  /// The vocabulary's characters in id order.
  const std::string& chars() const noexcept { return chars_; }
  /// Whether `c` is in the vocabulary.
  bool contains(char c) const noexcept { return ids_[static_cast<unsigned char>(c)] >= 0; }
  /// The id of `c`; throws ValueError if it is not in the vocabulary.
  std::int32_t encode(char c) const {
    const std::int32_t id = ids_[static_cast<unsigned char>(c)];
    XTRAIN_CHECK(id >= 0, ValueError, "character ", static_cast<int>(static_cast<unsigned char>(c)),
                 " is not in the vocabulary of ", size(), " characters");
    return id;
  }
  std::vector<std::int32_t> encode(std::string_view text) const {
    std::vector<std::int32_t> ids(text.size());
    for (std::size_t i = 0; i < text.size(); ++i) ids[i] = encode(text[i]);
    return ids;
  }
  char decode(std::int32_t id) const {
    XTRAIN_CHECK(id >= 0 && static_cast<std::size_t>(id) < size(), ValueError, "token id ", id,
                 " is outside the vocabulary of ", size(), " characters");
    return chars_[static_cast<std::size_t>(id)];
  }
  std::string decode(std::span<const std::int32_t> ids) const {
    std::string s(ids.size(), '\0');
    for (std::size_t i = 0; i < ids.size(); ++i) s[i] = decode(ids[i]);
    return s;
  }

 private:
  void rebuild() {
    ids_.fill(-1);
    for (std::size_t i = 0; i < chars_.size(); ++i)
      ids_[static_cast<unsigned char>(chars_[i])] = static_cast<std::int32_t>(i);
  }
  std::string chars_;
  std::array<std::int32_t, 256> ids_{};
};

/// The windows of `block` tokens of a token sequence, as a Dataset: sample i is x = tokens[i,
/// i + block) and y = tokens[i + 1, i + block + 1) (the next token at every position), for
/// i < tokens - block.
class TokenWindows {
 public:
  using input_type = Tensor<std::int32_t>;
  using target_type = Tensor<std::int32_t>;

  TokenWindows() = default;
  /// Requires more than `block` tokens (block > 0).
  TokenWindows(std::vector<std::int32_t> tokens, std::size_t block, std::string source)
      : tokens_(std::make_shared<const std::vector<std::int32_t>>(std::move(tokens))),
        block_(block),
        source_(std::move(source)) {
    XTRAIN_CHECK(block_ > 0, ValueError, source_, ": the window length must be positive");
    XTRAIN_CHECK(tokens_->size() > block_, DataError, source_, ": ", tokens_->size(),
                 " tokens are too few for windows of ", block_, " (and the token after them)");
    XTRAIN_CHECK(size() <= 0xFFFFFFFFu, DataError, source_, ": ", size(),
                 " windows; data sets index samples with 32 bits (split the text)");
  }

  /// Number of windows (start positions).
  std::size_t size() const noexcept { return tokens_ ? tokens_->size() - block_ : 0; }
  std::size_t block() const noexcept { return block_; }
  std::span<const std::int32_t> tokens() const noexcept {
    return tokens_ ? std::span<const std::int32_t>(*tokens_) : std::span<const std::int32_t>{};
  }
  const std::string& source() const noexcept { return source_; }

  /// x[r] and y[r]: the windows starting at indices[r] ([n, block] each).
  void gather(std::span<const std::uint32_t> indices, input_type& x, target_type& y) const {
    x.resize({indices.size(), block_});
    y.resize({indices.size(), block_});
    for (std::size_t r = 0; r < indices.size(); ++r)
      copy_window(indices[r], x.data() + r * block_, y.data() + r * block_);
  }

  /// The start of sample `sample` of random batch `key` under `seed`: uniform over the windows, a
  /// pure function of (seed, key, sample).
  std::size_t random_start(std::uint64_t seed, std::uint64_t key, std::size_t sample) const {
    XTRAIN_CHECK(size() > 0, ValueError, "TokenWindows: no windows to draw from (a default-constructed set?)");
    const auto w = random_block(seed, streams::text | key, sample);
    const std::uint64_t r = (static_cast<std::uint64_t>(w[0]) << 32) | w[1];
    return static_cast<std::size_t>(r % size());
  }

  /// Fills x and y with samples [offset, offset + count) of random batch `key` (a training step, or
  /// an evaluation batch): the windows a global batch of any size would hold there, so ranks
  /// that each take their share of one global batch together see the batch one rank would.
  void draw(std::uint64_t seed, std::uint64_t key, std::size_t offset, std::size_t count, input_type& x,
            target_type& y) const {
    x.resize({count, block_});
    y.resize({count, block_});
    for (std::size_t r = 0; r < count; ++r)
      copy_window(random_start(seed, key, offset + r), x.data() + r * block_, y.data() + r * block_);
  }

 private:
  void copy_window(std::size_t start, std::int32_t* x, std::int32_t* y) const {
    XTRAIN_CHECK(start < size(), ValueError, source_, ": window ", start, " of ", size());
    const std::int32_t* t = tokens_->data() + start;
    std::copy_n(t, block_, x);
    std::copy_n(t + 1, block_, y);
  }

  std::shared_ptr<const std::vector<std::int32_t>> tokens_;
  std::size_t block_ = 0;
  std::string source_;
};

/// A fixed selection of the windows of a TokenWindows, as a Dataset: an evaluation set of random
/// windows that stays the same from one evaluation to the next (and on any number of ranks).
class WindowSubset {
 public:
  using input_type = TokenWindows::input_type;
  using target_type = TokenWindows::target_type;

  /// `count` windows of `windows` at random starts drawn from (seed, key) (TokenWindows::
  /// random_start). Keeps a copy of `windows` (its tokens are shared, not copied).
  WindowSubset(const TokenWindows& windows, std::uint64_t seed, std::uint64_t key, std::size_t count)
      : windows_(windows), starts_(count) {
    for (std::size_t i = 0; i < count; ++i) starts_[i] = static_cast<std::uint32_t>(windows.random_start(seed, key, i));
  }

  std::size_t size() const noexcept { return starts_.size(); }
  void gather(std::span<const std::uint32_t> indices, input_type& x, target_type& y) const {
    std::vector<std::uint32_t> starts(indices.size());
    for (std::size_t i = 0; i < indices.size(); ++i) starts[i] = starts_.at(indices[i]);
    windows_.gather(starts, x, y);
  }

 private:
  TokenWindows windows_;
  std::vector<std::uint32_t> starts_;
};

/// A text's vocabulary and its train and validation windows.
struct TextSplit {
  CharVocab vocab;
  TokenWindows train, val;
};

/// Reads `path` (read_corpus), builds its character vocabulary and splits the tokens by position:
/// the first floor(train_fraction * n) for training, the rest for validation, each as windows of
/// `block` tokens.
inline TextSplit char_text(const std::string& path, std::size_t block, double train_fraction = 0.9) {
  XTRAIN_CHECK(train_fraction > 0.0 && train_fraction < 1.0, ValueError, "train_fraction ", train_fraction,
               " must be in (0, 1)");
  const std::string text = read_corpus(path);
  CharVocab vocab(text);
  std::vector<std::int32_t> ids = vocab.encode(text);
  const auto cut = static_cast<std::size_t>(train_fraction * static_cast<double>(ids.size()));
  std::vector<std::int32_t> val(ids.begin() + static_cast<std::ptrdiff_t>(cut), ids.end());
  ids.resize(cut);
  XTRAIN_CHECK(val.size() > block && ids.size() > block, DataError, path, ": ", text.size(),
               " characters are too few for windows of ", block, " tokens: the validation part (the last ",
               static_cast<int>(std::lround((1.0 - train_fraction) * 100)), " %, ", val.size(),
               " characters) needs more than ", block, "; use a shorter block (--block) or more text");
  return {std::move(vocab), TokenWindows(std::move(ids), block, path + " (training part)"),
          TokenWindows(std::move(val), block, path + " (validation part)")};
}

}  // namespace xtrain::data

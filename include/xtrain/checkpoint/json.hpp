#pragma once
/// \file json.hpp
/// The little JSON safetensors needs: a reader for headers and index files (objects, arrays,
/// strings, numbers, true/false/null) with errors that name the file and the offset, and string
/// escaping for the writer.

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "xtrain/core/error.hpp"

namespace xtrain::checkpoint::json {

struct Value {
  enum class Kind { null, boolean, number, string, array, object } kind = Kind::null;
  double number = 0;
  bool boolean = false;
  std::string string;
  std::vector<Value> array;
  std::vector<std::string> keys;  ///< an object's member names, in order
  std::vector<Value> members;     ///< an object's member values (parallel to keys)

  /// The member `key` of an object, or nullptr.
  const Value* find(const std::string& key) const {
    for (std::size_t i = 0; i < keys.size(); ++i)
      if (keys[i] == key) return &members[i];
    return nullptr;
  }
};

class Parser {
 public:
  Parser(std::string_view text, std::string source) : s_(text), source_(std::move(source)) {}

  Value parse() {
    Value v = value();
    skip();
    if (i_ != s_.size()) fail("unexpected text after the JSON value");
    return v;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw CheckpointError(source_ + ": malformed JSON at byte " + std::to_string(i_) + ": " + what);
  }
  void skip() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\n' || s_[i_] == '\r' || s_[i_] == '\t')) ++i_;
  }
  char peek() {
    skip();
    if (i_ >= s_.size()) fail("unexpected end");
    return s_[i_];
  }
  void expect(char c) {
    if (peek() != c) fail(std::string("expected '") + c + "'");
    ++i_;
  }
  Value value() {
    const char c = peek();
    Value v;
    if (c == '{') {
      v.kind = Value::Kind::object;
      ++i_;
      if (peek() == '}') return ++i_, v;
      for (;;) {
        v.keys.push_back(string_literal());
        expect(':');
        v.members.push_back(value());
        if (peek() == ',') {
          ++i_;
          continue;
        }
        expect('}');
        return v;
      }
    }
    if (c == '[') {
      v.kind = Value::Kind::array;
      ++i_;
      if (peek() == ']') return ++i_, v;
      for (;;) {
        v.array.push_back(value());
        if (peek() == ',') {
          ++i_;
          continue;
        }
        expect(']');
        return v;
      }
    }
    if (c == '"') {
      v.kind = Value::Kind::string;
      v.string = string_literal();
      return v;
    }
    if (s_.compare(i_, 4, "true") == 0) return i_ += 4, v.kind = Value::Kind::boolean, v.boolean = true, v;
    if (s_.compare(i_, 5, "false") == 0) return i_ += 5, v.kind = Value::Kind::boolean, v;
    if (s_.compare(i_, 4, "null") == 0) return i_ += 4, v;
    const std::size_t start = i_;
    while (i_ < s_.size() && std::string_view("+-0123456789.eE").find(s_[i_]) != std::string_view::npos) ++i_;
    if (start == i_) fail("expected a value");
    v.kind = Value::Kind::number;
    const std::string text(s_.substr(start, i_ - start));
    char* end = nullptr;
    v.number = std::strtod(text.c_str(), &end);
    if (end != text.c_str() + text.size()) fail("malformed number '" + text + "'");
    return v;
  }
  std::string string_literal() {
    expect('"');
    std::string out;
    while (i_ < s_.size() && s_[i_] != '"') {
      char c = s_[i_++];
      if (c == '\\') {
        if (i_ >= s_.size()) fail("unterminated escape");
        c = s_[i_++];
        switch (c) {
          case 'n':
            out += '\n';
            break;
          case 't':
            out += '\t';
            break;
          case 'r':
            out += '\r';
            break;
          case 'b':
            out += '\b';
            break;
          case 'f':
            out += '\f';
            break;
          case 'u': {
            if (i_ + 4 > s_.size()) fail("short \\u escape");
            const std::string hex(s_.substr(i_, 4));
            char* end = nullptr;
            const unsigned code = static_cast<unsigned>(std::strtoul(hex.c_str(), &end, 16));
            if (end != hex.c_str() + 4) fail("bad \\u escape");
            i_ += 4;
            if (code < 0x80)
              out += static_cast<char>(code);
            else if (code < 0x800)
              out += static_cast<char>(0xC0 | (code >> 6)), out += static_cast<char>(0x80 | (code & 0x3F));
            else
              out += static_cast<char>(0xE0 | (code >> 12)), out += static_cast<char>(0x80 | ((code >> 6) & 0x3F)),
                  out += static_cast<char>(0x80 | (code & 0x3F));
            break;
          }
          default:
            out += c;  // \" \\ \/
        }
      } else {
        out += c;
      }
    }
    if (i_ >= s_.size()) fail("unterminated string");
    ++i_;
    return out;
  }

  std::string_view s_;
  std::string source_;
  std::size_t i_ = 0;
};

/// `s` as a JSON string literal.
inline std::string quote(const std::string& s) {
  std::string out = "\"";
  for (const char c : s) {
    if (c == '"' || c == '\\')
      out += '\\', out += c;
    else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else
      out += c;
  }
  return out + "\"";
}

}  // namespace xtrain::checkpoint::json

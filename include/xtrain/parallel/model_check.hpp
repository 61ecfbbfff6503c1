#pragma once
/// \file model_check.hpp
/// The start-up check that every rank built the same model: a line per parameter slot
/// ("name [shape]", tied uses as "alias tied to name"), compared with rank 0's; the first line
/// that differs becomes the error message.

#include <algorithm>
#include <cstddef>
#include <string>
#include <vector>

#include "xtrain/core/error.hpp"
#include "xtrain/core/param_arena.hpp"

namespace xtrain::parallel {

/// The model's structure as text: one line per parameter (and per tied use).
inline std::string model_structure(const ParamArena& arena) {
  std::string s;
  for (const auto& e : arena.entries()) {
    s += e.name + " " + shape_string(e.shape) + "\n";
    for (const auto& alias : e.aliases) s += alias + " tied to " + e.name + "\n";
  }
  return s;
}

/// The message for a rank (`rank`) whose structure `mine` differs from rank 0's `root`.
inline std::string structure_mismatch(const std::string& root, const std::string& mine, std::size_t rank) {
  auto lines = [](const std::string& s) {
    std::vector<std::string> out;
    std::size_t a = 0;
    for (std::size_t b; (b = s.find('\n', a)) != std::string::npos; a = b + 1) out.push_back(s.substr(a, b - a));
    return out;
  };
  const auto r = lines(root), m = lines(mine);
  const std::string here = "rank " + std::to_string(rank);
  for (std::size_t i = 0; i < std::max(r.size(), m.size()); ++i) {
    const std::string a = i < r.size() ? r[i] : "(none)", b = i < m.size() ? m[i] : "(none)";
    if (a != b) {
      const std::string name = b.substr(0, b.find(' '));
      return "model differs across ranks: parameter '" + name + "' is '" + b + "' on " + here + " but '" + a +
             "' on rank 0 (build the same model on every rank)";
    }
  }
  return "model differs across ranks";
}

}  // namespace xtrain::parallel

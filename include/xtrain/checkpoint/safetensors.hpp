#pragma once
/// \file safetensors.hpp
/// Model export and import in the safetensors format (8-byte little-endian header length, a JSON
/// header of {name: {dtype, shape, data_offsets}}, then the raw little-endian data), one file or
/// shards plus `<name>.index.json` as HuggingFace writes them. Names are those of PyTorch's
/// state_dict of the same nn.Sequential ("0.weight", "1.running_mean", ...), so PyTorch's
/// load_state_dict and NumPy read our files, and we read theirs.

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "xtrain/checkpoint/archive.hpp"
#include "xtrain/checkpoint/json.hpp"
#include "xtrain/core/concepts.hpp"
#include "xtrain/core/param_arena.hpp"

namespace xtrain::checkpoint {

/// One tensor to write: name, dtype ("F32" or "I64"), shape, raw little-endian bytes.
struct TensorBytes {
  std::string name, dtype;
  std::vector<std::uint64_t> shape;
  std::string bytes;
};

/// One tensor of an export as planned before any is written: its name, dtype, shape and size in
/// bytes, and either the parameter whose values it is (`param`, read when the tensor is written)
/// or its bytes (a buffer's).
struct ExportTensor {
  std::string name, dtype;
  std::vector<std::uint64_t> shape;
  std::uint64_t size = 0;
  const ParamEntry* param = nullptr;
  std::string bytes;
};

/// Every parameter (F32, a tied one under each of its names, as state_dict) and buffer (F32,
/// num_batches_tracked I64) of `model`, by state_dict name, in that order.
template <class Model>
std::vector<ExportTensor> export_plan(Model& model, ParamArena& arena) {
  static_assert(std::endian::native == std::endian::little, "safetensors export assumes a little-endian host");
  std::vector<ExportTensor> out;
  for (const auto& e : arena.entries()) {
    const std::vector<std::uint64_t> shape(e.shape.begin(), e.shape.end());
    out.push_back({e.name, "F32", shape, e.size * sizeof(float), &e, {}});
    for (const auto& alias : e.aliases) out.push_back({alias, "F32", shape, e.size * sizeof(float), &e, {}});
  }
  xtrain::visit_buffers(model, [&](const std::string& name, auto&& buffer) {
    if constexpr (std::is_same_v<std::remove_cvref_t<decltype(buffer)>, Tensor<float>>)
      out.push_back({name,
                     "F32",
                     {buffer.shape().begin(), buffer.shape().end()},
                     buffer.size() * sizeof(float),
                     nullptr,
                     std::string(reinterpret_cast<const char*>(buffer.data()), buffer.size() * sizeof(float))});
    else
      out.push_back({name,
                     "I64",
                     {},
                     sizeof(std::int64_t),
                     nullptr,
                     std::string(reinterpret_cast<const char*>(&buffer), sizeof(std::int64_t))});
  });
  return out;
}

/// Every parameter and buffer of `model` with its bytes, by state_dict name (export_plan's order).
template <class Model>
std::vector<TensorBytes> state_dict(Model& model, ParamArena& arena) {
  std::vector<TensorBytes> out;
  for (ExportTensor& t : export_plan(model, arena)) {
    if (t.param) {
      const std::span<const float> v = arena.values(*t.param);
      t.bytes.assign(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
    }
    out.push_back({std::move(t.name), std::move(t.dtype), std::move(t.shape), std::move(t.bytes)});
  }
  return out;
}

/// The start of a safetensors file holding `tensors` in order: the header's length (8 bytes) and
/// the JSON header, padded so that the data starts 8-byte aligned.
inline std::string safetensors_header(std::span<const ExportTensor> tensors) {
  std::string header = "{";
  std::uint64_t offset = 0;
  for (const auto& t : tensors) {
    header += json::quote(t.name) + ":{\"dtype\":\"" + t.dtype + "\",\"shape\":[";
    for (std::size_t i = 0; i < t.shape.size(); ++i) {
      if (i) header += ',';
      header += std::to_string(t.shape[i]);
    }
    header += "],\"data_offsets\":[" + std::to_string(offset) + "," + std::to_string(offset + t.size) + "]},";
    offset += t.size;
  }
  header += "\"__metadata__\":{\"format\":\"pt\"}}";
  while (header.size() % 8) header += ' ';
  std::string length(8, '\0');
  for (int i = 0; i < 8; ++i)
    length[static_cast<std::size_t>(i)] = static_cast<char>((header.size() >> (8 * i)) & 0xFF);
  return length + header;
}

/// Writes `tensors` as one safetensors file at `path` (atomically).
inline void write_safetensors(const std::string& path, const std::vector<TensorBytes>& tensors) {
  std::vector<ExportTensor> plan;
  plan.reserve(tensors.size());
  for (const TensorBytes& t : tensors) plan.push_back({t.name, t.dtype, t.shape, t.bytes.size(), nullptr, {}});
  AtomicFile file(path);
  file.write(safetensors_header(plan));
  for (const TensorBytes& t : tensors) file.write(t.bytes);
  file.commit();
}

/// Writes the model to `path` (".safetensors"). If max_shard_bytes > 0 and the model is larger,
/// writes shards `<stem>-00001-of-0000N.safetensors` beside it and `<path>.index.json` instead.
/// Streams: a parameter's bytes are `values(entry)` (a span of floats), asked for as the tensor is
/// written, in export_plan's order, never all at once. Every rank of a sharded run calls it with
/// `write` true on one rank only: `values` is then called on every rank in the same order (it may
/// gather), and an error on the writing rank is thrown after the last call. Returns the files.
template <class Model, class Values>
std::vector<std::string> save_model(Model& model, ParamArena& arena, const std::string& path,
                                    std::uint64_t max_shard_bytes, Values&& values, bool write = true) {
  const std::vector<ExportTensor> tensors = export_plan(model, arena);
  std::uint64_t total = 0;
  std::vector<std::size_t> first{0};  // each file's first tensor, then the end
  for (std::size_t i = 0, in_file = 0; i < tensors.size(); ++i) {
    if (max_shard_bytes > 0 && in_file > 0 && in_file + tensors[i].size > max_shard_bytes)
      first.push_back(i), in_file = 0;
    in_file += tensors[i].size;
    total += tensors[i].size;
  }
  if (max_shard_bytes == 0 || total <= max_shard_bytes) first.resize(1);
  first.push_back(tensors.size());
  const std::size_t files = first.size() - 1;
  const std::filesystem::path p(path);
  std::vector<std::string> names;
  std::string error;
  const auto attempt = [&](auto&& step) {
    if (!write || !error.empty()) return;
    try {
      step();
    } catch (const std::exception& e) {
      error = e.what();
    }
  };
  attempt([&] {
    if (!p.parent_path().empty()) std::filesystem::create_directories(p.parent_path());
  });
  std::string map;
  for (std::size_t f = 0; f < files; ++f) {
    char suffix[64];
    std::snprintf(suffix, sizeof suffix, "-%05zu-of-%05zu.safetensors", f + 1, files);
    const std::string name = files == 1 ? p.filename().string() : p.stem().string() + suffix;
    names.push_back(files == 1 ? path : (p.parent_path() / name).string());
    const std::span<const ExportTensor> in_file(tensors.data() + first[f], first[f + 1] - first[f]);
    std::optional<AtomicFile> file;
    attempt([&] {
      file.emplace(names.back());
      file->write(safetensors_header(in_file));
    });
    for (const ExportTensor& t : in_file) {
      std::string_view bytes = t.bytes;
      if (t.param) {
        const std::span<const float> v = values(*t.param);
        bytes = {reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float)};
      }
      attempt([&] { file->write(bytes); });
    }
    attempt([&] { file->commit(); });
    for (const ExportTensor& t : in_file) {
      if (!map.empty()) map += ',';
      map += json::quote(t.name);
      map += ':';
      map += json::quote(name);
    }
  }
  if (files > 1) {
    const std::string index =
        "{\"metadata\":{\"total_size\":" + std::to_string(total) + "},\"weight_map\":{" + map + "}}\n";
    attempt([&] { write_file_atomic(path + ".index.json", {index}); });
    names.push_back(path + ".index.json");
  }
  XTRAIN_CHECK(error.empty(), CheckpointError, error);
  return names;
}

/// Writes the model to `path` from `arena`'s values (see above).
template <class Model>
std::vector<std::string> save_model(Model& model, ParamArena& arena, const std::string& path,
                                    std::uint64_t max_shard_bytes = 0) {
  return save_model(model, arena, path, max_shard_bytes,
                    [&](const ParamEntry& e) { return std::span<const float>(arena.values(e)); });
}

/// A parsed safetensors file: the bytes and, per tensor, its dtype, shape and byte range.
struct SafetensorsFile {
  struct Entry {
    std::string name, dtype;
    std::vector<std::uint64_t> shape;
    std::uint64_t begin = 0, end = 0;  ///< in `bytes`
  };
  std::string path;
  std::string bytes;
  std::vector<Entry> entries;
};

/// Parses the bytes of a safetensors file; `path` names it in errors. Throws CheckpointError for a
/// short file, a bad header, or offsets outside the data or inconsistent with dtype and shape.
inline SafetensorsFile parse_safetensors(std::string bytes, const std::string& path) {
  SafetensorsFile f;
  f.path = path;
  f.bytes = std::move(bytes);
  XTRAIN_CHECK(f.bytes.size() >= 8, CheckpointError, path, ": not a safetensors file (shorter than 8 bytes)");
  std::uint64_t n = 0;
  for (int i = 0; i < 8; ++i)
    n |= static_cast<std::uint64_t>(static_cast<unsigned char>(f.bytes[static_cast<std::size_t>(i)])) << (8 * i);
  XTRAIN_CHECK(n <= f.bytes.size() - 8, CheckpointError, path, ": header length ", n, " exceeds the file (",
               f.bytes.size(), " bytes)");
  const json::Value header = json::Parser(std::string_view(f.bytes).substr(8, n), path).parse();
  XTRAIN_CHECK(header.kind == json::Value::Kind::object, CheckpointError, path, ": the header is not a JSON object");
  const std::uint64_t data_start = 8 + n, data_size = f.bytes.size() - data_start;
  for (std::size_t member = 0; member < header.keys.size(); ++member) {
    const std::string& name = header.keys[member];
    const json::Value& v = header.members[member];
    if (name == "__metadata__") continue;
    const json::Value *dtype = v.find("dtype"), *shape = v.find("shape"), *offsets = v.find("data_offsets");
    XTRAIN_CHECK(dtype && shape && offsets && dtype->kind == json::Value::Kind::string &&
                     shape->kind == json::Value::Kind::array && offsets->kind == json::Value::Kind::array &&
                     offsets->array.size() == 2,
                 CheckpointError, path, ": tensor '", name, "' lacks dtype, shape or data_offsets");
    SafetensorsFile::Entry e{name, dtype->string, {}, 0, 0};
    std::uint64_t count = 1;
    for (const auto& d : shape->array) {
      XTRAIN_CHECK(d.kind == json::Value::Kind::number && d.number >= 0, CheckpointError, path, ": tensor '", name,
                   "' has a bad shape");
      XTRAIN_CHECK(d.number < 1e15, CheckpointError, path, ": tensor '", name, "' has a bad shape");
      e.shape.push_back(static_cast<std::uint64_t>(d.number));
      XTRAIN_CHECK(checked_multiply(count, e.shape.back(), count), CheckpointError, path, ": tensor '", name,
                   "' is too large");
    }
    XTRAIN_CHECK(offsets->array[0].number >= 0 && offsets->array[1].number >= 0 && offsets->array[0].number < 1e18 &&
                     offsets->array[1].number < 1e18,
                 CheckpointError, path, ": tensor '", name, "' has bad data_offsets");
    const std::uint64_t b = static_cast<std::uint64_t>(offsets->array[0].number),
                        end = static_cast<std::uint64_t>(offsets->array[1].number);
    XTRAIN_CHECK(b <= end && end <= data_size, CheckpointError, path, ": tensor '", name, "' has data_offsets [", b,
                 ", ", end, "] outside the ", data_size, " data bytes (truncated file?)");
    const std::uint64_t item = e.dtype == "F64" || e.dtype == "I64"    ? 8
                               : e.dtype == "F32" || e.dtype == "I32"  ? 4
                               : e.dtype == "F16" || e.dtype == "BF16" ? 2
                                                                       : 1;
    std::size_t expected = 0;
    XTRAIN_CHECK(checked_multiply(count, item, expected) && end - b == expected, CheckpointError, path, ": tensor '",
                 name, "' has ", end - b, " bytes for ", e.dtype, " ", shape_string({e.shape.begin(), e.shape.end()}));
    e.begin = data_start + b;
    e.end = data_start + end;
    f.entries.push_back(std::move(e));
  }
  return f;
}

/// Reads and parses the safetensors file at `path`.
inline SafetensorsFile read_safetensors(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  XTRAIN_CHECK(in.good(), CheckpointError, path, ": cannot open (", std::strerror(errno), ")");
  return parse_safetensors(std::string(std::istreambuf_iterator<char>(in), {}), path);
}

/// Loads `path` (a .safetensors file, or the .index.json of shards) into the model, strictly:
/// every parameter and buffer must be present with its shape, and nothing else. F32 and F64
/// tensors load into fp32 parameters; I64 (num_batches_tracked) into counters.
template <class Model>
void load_model(Model& model, ParamArena& arena, const std::string& path) {
  std::vector<SafetensorsFile> files;
  if (path.size() > 11 && path.ends_with(".index.json")) {
    std::ifstream in(path);
    XTRAIN_CHECK(in.good(), CheckpointError, path, ": cannot open (", std::strerror(errno), ")");
    const std::string text((std::istreambuf_iterator<char>(in)), {});
    const json::Value index = json::Parser(text, path).parse();
    const json::Value* map = index.find("weight_map");
    XTRAIN_CHECK(map && map->kind == json::Value::Kind::object, CheckpointError, path, ": no weight_map");
    std::vector<std::string> names;
    for (const auto& file : map->members)
      if (std::find(names.begin(), names.end(), file.string) == names.end()) names.push_back(file.string);
    for (const auto& name : names)
      files.push_back(read_safetensors((std::filesystem::path(path).parent_path() / name).string()));
  } else {
    files.push_back(read_safetensors(path));
  }
  std::vector<std::string> used;
  auto find = [&](const std::string& name) -> std::pair<const SafetensorsFile*, const SafetensorsFile::Entry*> {
    for (const auto& f : files)
      for (const auto& e : f.entries)
        if (e.name == name) return {&f, &e};
    throw CheckpointError(path + ": no tensor '" + name + "' (the model has it)");
  };
  auto load_floats = [&](const std::string& name, std::span<float> dst, const std::vector<std::size_t>& shape) {
    const auto [f, e] = find(name);
    used.push_back(name);
    XTRAIN_CHECK(std::vector<std::size_t>(e->shape.begin(), e->shape.end()) == shape, CheckpointError, f->path,
                 ": tensor '", name, "' has shape ", shape_string({e->shape.begin(), e->shape.end()}),
                 ", the model expects ", shape_string(shape));
    const char* src = f->bytes.data() + e->begin;
    if (e->dtype == "F32")
      std::memcpy(dst.data(), src, dst.size() * sizeof(float));
    else if (e->dtype == "F64")
      for (std::size_t i = 0; i < dst.size(); ++i) {
        double d;
        std::memcpy(&d, src + i * 8, 8);
        dst[i] = static_cast<float>(d);
      }
    else
      throw CheckpointError(f->path + ": tensor '" + name + "' has dtype " + e->dtype + " (F32 or F64 expected)");
  };
  auto present = [&](const std::string& name) {
    for (const auto& f : files)
      for (const auto& e : f.entries)
        if (e.name == name) return true;
    return false;
  };
  for (const auto& e : arena.entries()) {
    if (e.aliases.empty()) {
      load_floats(e.name, arena.values(e), e.shape);
      continue;
    }
    // A tied parameter: PyTorch's state_dict lists every name, safetensors' save_file and
    // HuggingFace keep one. Load whichever are there; several must hold the same values.
    std::vector<std::string> names{e.name};
    names.insert(names.end(), e.aliases.begin(), e.aliases.end());
    std::vector<float> first;
    for (const auto& name : names) {
      if (!present(name)) continue;
      load_floats(name, arena.values(e), e.shape);
      if (first.empty()) {
        first.assign(arena.values(e).begin(), arena.values(e).end());
        continue;
      }
      XTRAIN_CHECK(std::equal(first.begin(), first.end(), arena.values(e).begin()), CheckpointError, path,
                   ": tensors '", names[0], "' and '", name, "' are tied in this model but hold different values");
    }
    XTRAIN_CHECK(!first.empty() || e.size == 0, CheckpointError, path, ": no tensor '", e.name, "' (the model has it",
                 e.aliases.empty() ? "" : ", tied to '" + e.aliases[0] + "', also absent", ")");
  }
  xtrain::visit_buffers(model, [&](const std::string& name, auto&& buffer) {
    if constexpr (std::is_same_v<std::remove_cvref_t<decltype(buffer)>, Tensor<float>>) {
      load_floats(name, std::span<float>(buffer.data(), buffer.size()), buffer.shape().to_vector());
    } else {
      const auto [f, e] = find(name);
      used.push_back(name);
      XTRAIN_CHECK(e->dtype == "I64" && e->end - e->begin == 8, CheckpointError, f->path, ": tensor '", name,
                   "' must be a scalar I64");
      std::memcpy(&buffer, f->bytes.data() + e->begin, 8);
    }
  });
  for (const auto& f : files)
    for (const auto& e : f.entries)
      XTRAIN_CHECK(std::find(used.begin(), used.end(), e.name) != used.end(), CheckpointError, f.path, ": tensor '",
                   e.name, "' is not a parameter or buffer of this model");
}

}  // namespace xtrain::checkpoint

#pragma once
/// \file report.hpp
/// What a Profiler recorded, for people and for tools:
///   - `key_averages(p, group_by)`: one row per module and phase (or per kind: "Linear forward"),
///     with calls, self and total time, bytes allocated; `table(p, options)` prints them as
///     torch's `key_averages().table()` does, sortable by any column;
///   - `table(p, comm, options)`: collective; rank 0 gets every rank's figures side by side
///     (min / median / max of each row's self time over the ranks: a straggler shows);
///   - `chrome_trace(p, rank)`: a Chrome trace (chrome://tracing, ui.perfetto.dev): "X" events in
///     microseconds, pid = rank, tid 0 = compute, tid 1 = communication;
///   - `export_chrome_traces(p, comm, dir)`: collective; each rank writes dir/trace_rank<R>.json,
///     rank 0 merges them into dir/trace.json (one timeline for the whole job).

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <span>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "xtrain/core/error.hpp"
#include "xtrain/core/profiler.hpp"

namespace xtrain::profile {

/// Rows per module and phase ("0: Linear forward") or per kind and phase ("Linear forward").
enum class GroupBy { module, kind };
/// The column a table is sorted by (descending; name ascending).
enum class SortBy { self, total, calls, average, bytes, name };

/// One row of key_averages.
struct Row {
  std::string name;
  Category category = Category::user;
  std::uint64_t calls = 0;
  double self_us = 0.0, total_us = 0.0;  ///< summed over the calls
  std::int64_t bytes = 0;                ///< tensor bytes allocated inside (children included)
  bool in_step = false;                  ///< its calls are inside the steps (their % are of the step time)
  double average_us() const noexcept { return calls ? total_us / static_cast<double>(calls) : 0.0; }
};

/// The recorded steps (Category::step events) and how much of their time the events inside them
/// account for (their self times; the rest is the step's own self time: loop bookkeeping).
struct StepSummary {
  std::uint64_t steps = 0;
  double total_us = 0.0, median_us = 0.0;
  double accounted = 0.0;  ///< (sum of self times inside the steps) / total_us
};

/// "0: Linear forward", "Adam step", "zero_grad", "data".
inline std::string row_name(const Label& l, Category c, GroupBy g) {
  std::string s = g == GroupBy::module ? l.text() : l.kind;
  if (c == Category::forward) s += " forward";
  if (c == Category::backward) s += " backward";
  if (c == Category::optimizer && l.kind != zero_grad_kind) s += " step";
  return s;
}

/// One row per key (module or kind, and phase), summed over the recorded events. Events inside an
/// evaluation or a checkpoint save outside the steps have rows of their own, tagged
/// " [evaluation]" / " [checkpoint]", so that the steps' rows describe the steps alone.
inline std::vector<Row> key_averages(const Profiler& p, GroupBy group_by = GroupBy::module) {
  std::map<std::pair<std::string, Category>, Row> rows;
  const auto& events = p.events();
  std::vector<Category> root(events.size());  // the outermost event each one is inside
  for (std::size_t i = 0; i < events.size(); ++i) {
    const Event& e = events[i];
    root[i] = e.parent == Event::none ? e.category : root[e.parent];
    std::string name = row_name(p.labels()[e.label], e.category, group_by);
    if (root[i] != e.category && (root[i] == Category::evaluation || root[i] == Category::checkpoint))
      name += std::string(" [") + category_name(root[i]) + "]";
    Row& r = rows[{name, e.category}];
    r.name = name;
    r.category = e.category;
    r.in_step = root[i] == Category::step;
    ++r.calls;
    r.total_us += static_cast<double>(e.dur_ns) * 1e-3;
    r.self_us += static_cast<double>(e.dur_ns - e.child_ns) * 1e-3;
    r.bytes += e.bytes;
  }
  std::vector<Row> out;
  out.reserve(rows.size());
  for (auto& [key, row] : rows) out.push_back(std::move(row));
  return out;
}

inline StepSummary step_summary(const Profiler& p) {
  StepSummary s;
  std::vector<double> durations;
  double self = 0.0;
  for (const Event& e : p.events())
    if (e.category == Category::step) {
      durations.push_back(static_cast<double>(e.dur_ns) * 1e-3);
      self += static_cast<double>(e.dur_ns - e.child_ns) * 1e-3;
    }
  s.steps = durations.size();
  for (double d : durations) s.total_us += d;
  if (!durations.empty()) {
    std::nth_element(durations.begin(), durations.begin() + static_cast<std::ptrdiff_t>(durations.size() / 2),
                     durations.end());
    s.median_us = durations[durations.size() / 2];
  }
  s.accounted = s.total_us > 0.0 ? (s.total_us - self) / s.total_us : 0.0;
  return s;
}

struct TableOptions {
  GroupBy group_by = GroupBy::module;
  SortBy sort_by = SortBy::self;
  std::size_t row_limit = 0;  ///< 0: every row
};

namespace detail {
inline void sort_rows(std::vector<Row>& rows, SortBy by) {
  auto key = [by](const Row& r) -> double {
    switch (by) {
      case SortBy::self:
        return r.self_us;
      case SortBy::total:
        return r.total_us;
      case SortBy::calls:
        return static_cast<double>(r.calls);
      case SortBy::average:
        return r.average_us();
      case SortBy::bytes:
        return static_cast<double>(r.bytes);
      case SortBy::name:
        return 0.0;
    }
    return 0.0;
  };
  std::stable_sort(rows.begin(), rows.end(), [&](const Row& a, const Row& b) {
    if (by == SortBy::name) return a.name < b.name;
    return key(a) > key(b);
  });
}

inline std::string format(const char* fmt, double a, double b = 0.0, double c = 0.0) {
  char buf[64];
  std::snprintf(buf, sizeof buf, fmt, a, b, c);
  return buf;
}

inline std::string pad(std::string s, std::size_t width, bool left) {
  if (s.size() >= width) return s;
  return left ? s + std::string(width - s.size(), ' ') : std::string(width - s.size(), ' ') + s;
}

inline std::string bytes_text(std::int64_t b) {
  const double v = static_cast<double>(b);
  if (b >= (1 << 20)) return format("%.1f MiB", v / (1 << 20));
  if (b >= (1 << 10)) return format("%.1f KiB", v / (1 << 10));
  return std::to_string(b) + " B";
}

// A table: the first column left-aligned, the others right-aligned, a rule under the header.
inline std::string render(const std::vector<std::vector<std::string>>& cells) {
  std::vector<std::size_t> width;
  for (const auto& row : cells)
    for (std::size_t i = 0; i < row.size(); ++i) {
      if (width.size() <= i) width.push_back(0);
      width[i] = std::max(width[i], row[i].size());
    }
  std::string out, rule;
  for (std::size_t i = 0; i < width.size(); ++i)
    rule += std::string(width[i], '-') + (i + 1 < width.size() ? "  " : "");
  for (std::size_t r = 0; r < cells.size(); ++r) {
    for (std::size_t i = 0; i < cells[r].size(); ++i)
      out += pad(cells[r][i], width[i], i == 0) + (i + 1 < cells[r].size() ? "  " : "");
    out += '\n';
    if (r == 0) out += rule + '\n';
  }
  return out;
}

inline std::string summary_line(const StepSummary& s) {
  if (s.steps == 0) return "No step recorded (outside fit(), or the schedule recorded none).\n";
  return "Steps recorded: " + std::to_string(s.steps) + ", median " + format("%.1f us", s.median_us) +
         "; the events inside them account for " + format("%.1f%%", 100.0 * s.accounted) + " of their time.\n";
}
}  // namespace detail

/// This rank's table: name, calls, self and total time (ms), share of the recorded steps' time
/// (rows inside the steps),
/// average per call (us), bytes allocated (with profile_memory); then a summary of the steps.
inline std::string table(const Profiler& p, const TableOptions& options = {}) {
  std::vector<Row> rows = key_averages(p, options.group_by);
  detail::sort_rows(rows, options.sort_by);
  if (options.row_limit && rows.size() > options.row_limit) rows.resize(options.row_limit);
  const StepSummary steps = step_summary(p);
  const bool memory = p.options().profile_memory;
  std::vector<std::vector<std::string>> cells;
  cells.push_back({"Name", "Kind", "Calls", "Self ms", "Self %", "Total ms", "Total %", "Avg us"});
  if (memory) cells.back().push_back("Bytes");
  for (const Row& r : rows) {
    const bool in_step = steps.total_us > 0.0 && r.in_step;
    cells.push_back(
        {r.name, category_name(r.category), std::to_string(r.calls), detail::format("%.3f", r.self_us * 1e-3),
         in_step && r.category != Category::step ? detail::format("%.1f%%", 100.0 * r.self_us / steps.total_us) : "",
         detail::format("%.3f", r.total_us * 1e-3),
         in_step ? detail::format("%.1f%%", 100.0 * r.total_us / steps.total_us) : "",
         detail::format("%.2f", r.average_us())});
    if (memory) cells.back().push_back(detail::bytes_text(r.bytes));
  }
  return detail::render(cells) + detail::summary_line(steps);
}

/// Collective: every rank's rows (rank 0's keys), gathered to rank 0, which gets a table of the
/// median over the ranks with each row's self time min / median / max (a straggler shows as a
/// max far above the median). Other ranks get an empty string. One rank: table(p, options).
template <class Communicator>
std::string table(const Profiler& p, Communicator& comm, const TableOptions& options = {}) {
  const std::size_t ranks = comm.size(), rank = comm.rank();
  if (ranks == 1) return table(p, options);
  std::vector<Row> mine = key_averages(p, options.group_by);
  detail::sort_rows(mine, options.sort_by);
  // Rank 0's keys, in its order, to every rank.
  std::string keys;
  for (const Row& r : mine)
    keys += r.name + '\t' + std::to_string(static_cast<int>(r.category)) + (r.in_step ? "s" : "") + '\n';
  comm.broadcast(keys, "profiler table keys");
  std::vector<std::pair<std::string, Category>> order;
  std::vector<bool> in_step;
  for (std::size_t at = 0; at < keys.size();) {
    const std::size_t tab = keys.find('\t', at), nl = keys.find('\n', tab);
    order.emplace_back(keys.substr(at, tab - at), static_cast<Category>(std::stoi(keys.substr(tab + 1, nl - tab - 1))));
    in_step.push_back(keys[nl - 1] == 's');
    at = nl + 1;
  }
  // [row][rank][calls, self, total], summed over the ranks (each fills its own slot).
  std::vector<double> figures(order.size() * ranks * 3, 0.0);
  for (const Row& r : mine)
    for (std::size_t i = 0; i < order.size(); ++i)
      if (order[i].first == r.name && order[i].second == r.category) {
        double* f = &figures[(i * ranks + rank) * 3];
        f[0] = static_cast<double>(r.calls);
        f[1] = r.self_us;
        f[2] = r.total_us;
      }
  const StepSummary steps = step_summary(p);
  std::vector<double> step_totals(ranks, 0.0), accounted(ranks, 0.0);
  step_totals[rank] = steps.total_us;
  accounted[rank] = steps.accounted;
  comm.allreduce_sum(std::span<double>(figures), "profiler table");
  comm.allreduce_sum(std::span<double>(step_totals), "profiler step totals");
  comm.allreduce_sum(std::span<double>(accounted), "profiler accounted");
  if (rank != 0) return {};
  auto stats = [&](std::size_t row, std::size_t field) {
    std::vector<double> v(ranks);
    for (std::size_t k = 0; k < ranks; ++k) v[k] = figures[(row * ranks + k) * 3 + field];
    std::sort(v.begin(), v.end());
    return std::array<double, 3>{v.front(), ranks % 2 ? v[ranks / 2] : 0.5 * (v[ranks / 2 - 1] + v[ranks / 2]),
                                 v.back()};
  };
  std::vector<double> sorted_steps = step_totals;
  std::sort(sorted_steps.begin(), sorted_steps.end());
  const double step_median = sorted_steps[ranks / 2];
  std::vector<std::vector<std::string>> cells;
  cells.push_back({"Name (" + std::to_string(ranks) + " ranks)", "Kind", "Calls", "Self ms min", "median", "max",
                   "Self %", "Total ms", "Avg us"});
  const std::size_t limit = options.row_limit ? std::min(options.row_limit, order.size()) : order.size();
  for (std::size_t i = 0; i < limit; ++i) {
    const auto calls = stats(i, 0), self = stats(i, 1), total = stats(i, 2);
    cells.push_back({order[i].first, category_name(order[i].second), detail::format("%.0f", calls[1]),
                     detail::format("%.3f", self[0] * 1e-3), detail::format("%.3f", self[1] * 1e-3),
                     detail::format("%.3f", self[2] * 1e-3),
                     step_median > 0.0 && in_step[i] && order[i].second != Category::step
                         ? detail::format("%.1f%%", 100.0 * self[1] / step_median)
                         : "",
                     detail::format("%.3f", total[1] * 1e-3),
                     detail::format("%.2f", calls[1] > 0 ? total[1] / calls[1] : 0.0)});
  }
  std::string out = detail::render(cells) + "Per rank: ";
  for (std::size_t k = 0; k < ranks; ++k)
    out += "rank " + std::to_string(k) + " " + detail::format("%.1f ms", step_totals[k] * 1e-3) + " in steps (" +
           detail::format("%.1f%%", 100.0 * accounted[k]) + " accounted)" + (k + 1 < ranks ? ", " : "\n");
  return out;
}

namespace detail {
inline void json_string(std::string& out, const std::string& s) {
  out += '"';
  for (const char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(c));
      out += buf;
    } else {
      out += c;
    }
  }
  out += '"';
}

inline std::string trace_events(const Profiler& p, std::size_t rank) {
  std::string out;
  const std::string pid = std::to_string(rank);
  auto meta = [&](const char* what, const std::string& tid, const std::string& name) {
    out += std::string("{\"name\":\"") + what + "\",\"ph\":\"M\",\"pid\":" + pid +
           (tid.empty() ? "" : ",\"tid\":" + tid) + ",\"args\":{\"name\":";
    json_string(out, name);
    out += "}},\n";
  };
  meta("process_name", "", "rank " + pid);
  meta("thread_name", "0", "compute");
  meta("thread_name", "1", "communication");
  char num[64];
  for (const Event& e : p.events()) {
    const Label& l = p.labels()[e.label];
    out += "{\"name\":";
    json_string(out, e.category == Category::step ? "ProfilerStep#" + std::to_string(e.step) : l.text());
    out += ",\"cat\":\"";
    out += category_name(e.category);
    std::snprintf(num, sizeof num, "\",\"ph\":\"X\",\"ts\":%.3f,\"dur\":%.3f", static_cast<double>(e.start_ns) * 1e-3,
                  static_cast<double>(e.dur_ns) * 1e-3);
    out += num;
    out += ",\"pid\":" + pid + ",\"tid\":" + std::to_string(e.track) + ",\"args\":{\"step\":" + std::to_string(e.step);
    if (!l.module.empty() || e.category == Category::forward || e.category == Category::backward) {
      out += ",\"module\":";
      json_string(out, l.module);
      out += ",\"kind\":";
      json_string(out, l.kind);
    }
    if (e.shape != Event::none) {
      out += ",\"input_shape\":";
      json_string(out, p.shapes()[e.shape]);
    }
    if (p.options().profile_memory && e.track == 0) out += ",\"bytes\":" + std::to_string(e.bytes);
    out += "}},\n";
  }
  if (!out.empty()) out.resize(out.size() - 2);  // the last ",\n"
  return out;
}

constexpr const char* trace_head = "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n";
constexpr const char* trace_tail = "\n]}\n";

inline void write_text(const std::filesystem::path& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary);
  f << text;
  f.close();
  XTRAIN_CHECK(f.good(), ValueError, "profiler: cannot write ", path.string());
}
}  // namespace detail

/// A Chrome trace (JSON) of what `p` recorded, as rank `rank`.
inline std::string chrome_trace(const Profiler& p, std::size_t rank = 0) {
  return detail::trace_head + detail::trace_events(p, rank) + detail::trace_tail;
}

/// Writes chrome_trace(p, rank) to `path`.
inline void export_chrome_trace(const Profiler& p, const std::string& path, std::size_t rank = 0) {
  detail::write_text(path, chrome_trace(p, rank));
}

/// Collective: each rank writes `dir`/trace_rank<R>.json; after a barrier rank 0 merges every
/// rank's file it can read into `dir`/trace.json (the ranks share one clock: Trainer::set_profiler
/// started it after a barrier). Returns, on rank 0, the files written (the merged one last) and
/// names the ranks whose file it could not read (`dir` not shared between nodes).
template <class Communicator>
std::vector<std::string> export_chrome_traces(const Profiler& p, Communicator& comm, const std::string& dir) {
  const std::size_t rank = comm.rank(), ranks = comm.size();
  std::string error;
  try {
    std::filesystem::create_directories(dir);
    detail::write_text(std::filesystem::path(dir) / ("trace_rank" + std::to_string(rank) + ".json"),
                       chrome_trace(p, rank));
  } catch (const std::exception& e) {
    error = e.what();
  }
  double failed = error.empty() ? 0.0 : 1.0;
  comm.allreduce_sum(std::span<double>(&failed, 1), "profiler trace status");
  XTRAIN_CHECK(failed == 0.0, ValueError, "profiler: ", failed, " rank(s) could not write their trace to ", dir,
               error.empty() ? "" : ": ", error);
  if (rank != 0) return {};
  std::vector<std::string> files;
  std::string merged = detail::trace_head;
  std::vector<std::size_t> missing;
  for (std::size_t r = 0; r < ranks; ++r) {
    const std::filesystem::path path = std::filesystem::path(dir) / ("trace_rank" + std::to_string(r) + ".json");
    std::ifstream f(path, std::ios::binary);
    std::stringstream text;
    text << f.rdbuf();
    std::string s = text.str();
    const std::string head = detail::trace_head, tail = detail::trace_tail;
    if (!f || s.size() < head.size() + tail.size() || s.compare(0, head.size(), head) != 0) {
      missing.push_back(r);
      continue;
    }
    files.push_back(path.string());
    if (merged.size() > head.size()) merged += ",\n";
    merged.append(s, head.size(), s.size() - head.size() - tail.size());
  }
  merged += detail::trace_tail;
  const std::string merged_path = (std::filesystem::path(dir) / "trace.json").string();
  detail::write_text(merged_path, merged);
  files.push_back(merged_path);
  if (!missing.empty()) {
    std::string which;
    for (std::size_t r : missing) which += (which.empty() ? "" : ", ") + std::to_string(r);
    std::fprintf(stderr,
                 "[xtrain] profiler: trace.json lacks rank(s) %s: their trace_rank files are not readable from rank 0 "
                 "(is %s on a file system every node shares?)\n",
                 which.c_str(), dir.c_str());
  }
  return files;
}

}  // namespace xtrain::profile

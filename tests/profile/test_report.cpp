// profile/report.hpp and the profiler on a training (core/profiler.hpp): module names and nesting of the recorded
// events, the schedule, the table, Chrome traces (parsed back), several ranks (buckets on the communication track, the
// all-rank table, the merged trace), bytes allocated.
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "xtrain/checkpoint/json.hpp"
#include "xtrain/xtrain.hpp"

using namespace xtrain;
namespace nn = xtrain::layers;
namespace profile = xtrain::profile;

namespace {
data::TensorDataset random_set(std::size_t n, std::uint64_t seed) {
  Tensor<float> x({n, 20});
  Tensor<std::int32_t> y({n});
  Generator g(seed, streams::user);
  for (float& v : x) v = g.uniform(-1.0f, 1.0f);
  for (std::size_t i = 0; i < n; ++i) y[i] = static_cast<std::int32_t>(i % 4);
  return data::TensorDataset(std::move(x), std::move(y), 4, "random");
}

auto nested_model() {
  return nn::Sequential{nn::Linear{20, 16}, nn::Residual{nn::Sequential{nn::Linear{16, 16}, nn::ReLU{}}},
                        nn::Linear{16, 4}};
}

// Whether the event is inside a step (not the evaluation after the epoch).
bool in_step(const profile::Profiler& p, const profile::Event& e) {
  const profile::Event* root = &e;
  while (root->parent != profile::Event::none) root = &p.events()[root->parent];
  return root->category == profile::Category::step;
}

// The event's label text, with the phase for module events.
std::string what(const profile::Profiler& p, const profile::Event& e) {
  return profile::row_name(p.labels()[e.label], e.category, profile::GroupBy::module);
}

checkpoint::json::Value parse_json(const std::string& text) { return checkpoint::json::Parser(text, "trace").parse(); }

std::string read(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}
}  // namespace

TEST_CASE("Profiler: every module's forward and backward, named as in state_dict, nested in the step", "[profile]") {
  Trainer trainer{nested_model(), optim::Adam{}, TrainingOptions{}.batch_size(16).epochs(1).verbose(false)};
  profile::Profiler prof({.record_shapes = true});
  trainer.set_profiler(&prof);
  trainer.fit(random_set(64, 1), random_set(16, 2));  // 4 steps, then an evaluation

  const auto& events = prof.events();
  std::multiset<std::string> names;
  for (const auto& e : events)
    if (in_step(prof, e)) names.insert(what(prof, e));
  for (const char* n : {"Sequential forward", "0: Linear forward", "1: Residual forward", "1: Sequential forward",
                        "1.0: Linear forward", "1.1: ReLU forward", "2: Linear forward", "CrossEntropyLoss forward",
                        "2: Linear backward", "1.1: ReLU backward", "1.0: Linear backward", "0: Linear backward",
                        "Sequential backward", "Adam step", "zero_grad", "data", "step"}) {
    INFO(n);
    REQUIRE(names.count(n) == 4);  // once per step
  }
  std::size_t evaluations = 0, evaluation_forwards = 0;
  for (const auto& e : events) {
    evaluations += e.category == profile::Category::evaluation;
    evaluation_forwards += !in_step(prof, e) && what(prof, e) == "1.0: Linear forward";
  }
  REQUIRE(evaluations == 1);
  REQUIRE(evaluation_forwards == 1);  // one evaluation batch

  // Nesting: every event lies inside its parent; module events inside the root's, the root's and
  // the optimizer's inside a step; the evaluation's forwards inside the evaluation.
  for (const auto& e : events) {
    if (e.parent == profile::Event::none) {
      const bool top = e.category == profile::Category::step || e.category == profile::Category::evaluation;
      INFO(what(prof, e));
      REQUIRE(top);
      continue;
    }
    const auto& parent = events[e.parent];
    REQUIRE(e.start_ns >= parent.start_ns);
    REQUIRE(e.start_ns + e.dur_ns <= parent.start_ns + parent.dur_ns);
    if (what(prof, e) == "1.0: Linear forward") REQUIRE(what(prof, parent) == "1: Sequential forward");
    if (what(prof, e) == "Adam step") REQUIRE(parent.category == profile::Category::step);
  }
  // Children's times add up to the parent's child time, so self times sum to the step time.
  std::vector<std::int64_t> child(events.size(), 0);
  for (const auto& e : events)
    if (e.parent != profile::Event::none) child[e.parent] += e.dur_ns;
  for (std::size_t i = 0; i < events.size(); ++i) REQUIRE(events[i].child_ns == child[i]);
  // record_shapes: the first layer saw [16, 20] in training (and the eval batch in evaluation).
  bool shape_seen = false;
  for (const auto& e : events)
    if (what(prof, e) == "0: Linear forward" && e.shape != profile::Event::none)
      shape_seen |= prof.shapes()[e.shape] == "[16, 20]";
  REQUIRE(shape_seen);
}

TEST_CASE("Profiler: the schedule skips, warms up (dropped) and keeps active steps, repeat times", "[profile]") {
  Trainer trainer{nested_model(), optim::SGD{}, TrainingOptions{}.batch_size(8).epochs(1).verbose(false)};
  profile::Profiler prof({.schedule = {.wait = 1, .warmup = 1, .active = 2, .repeat = 2, .skip_first = 1}});
  trainer.set_profiler(&prof);
  trainer.fit(random_set(96, 1), random_set(8, 2));  // 12 steps: 0 skipped, then cycles 1-4, 5-8
  std::set<std::uint64_t> steps;
  for (const auto& e : prof.events())
    if (e.category == profile::Category::step) steps.insert(e.step);
  REQUIRE(steps == std::set<std::uint64_t>{3, 4, 7, 8});  // wait 1, warmup 2 (dropped), active 3-4; ...
  for (const auto& e : prof.events()) REQUIRE((steps.count(e.step) == 1));  // the evaluation (step 12): off
  REQUIRE(prof.step_count() == 12);

  // Attached but outside the schedule: nothing recorded.
  Trainer again{nested_model(), optim::SGD{}, TrainingOptions{}.batch_size(8).epochs(1).verbose(false)};
  profile::Profiler idle({.schedule = {.wait = 1000, .active = 1}});
  again.set_profiler(&idle);
  REQUIRE_FALSE(idle.recording());
  again.fit(random_set(96, 1), random_set(8, 2));
  REQUIRE(idle.step_count() == 12);
  REQUIRE(idle.events().empty());
}

TEST_CASE("Profiler: a loop of train_step is recorded as fit's steps are, a profiler step per optimizer step",
          "[profile]") {
  // accumulate(2): two train_step calls (micro-steps) make one optimizer step.
  Trainer trainer{nested_model(), optim::Adam{},
                  TrainingOptions{}.batch_size(8).global_batch_size(16).accumulate(2).verbose(false)};
  profile::Profiler prof({.schedule = {.warmup = 1, .active = 2, .repeat = 1}});
  trainer.set_profiler(&prof);
  const data::TensorDataset set = random_set(8, 1);
  const Tensor<float>& x = set.features();
  for (std::size_t call = 0; call < 8; ++call) trainer.train_step(x, set.targets(), (call % 2) * 8, 16);
  REQUIRE(trainer.step() == 4);
  REQUIRE(prof.step_count() == 4);
  std::multiset<std::uint64_t> step_events;
  std::size_t adam = 0;
  for (const auto& e : prof.events()) {
    if (e.category == profile::Category::step) step_events.insert(e.step);
    adam += what(prof, e) == "Adam step";
    if (e.parent == profile::Event::none) REQUIRE(e.category == profile::Category::step);
  }
  // Steps 1 and 2 active (step 0 the warmup, dropped), each of two micro-step events.
  REQUIRE(step_events == std::multiset<std::uint64_t>{1, 1, 2, 2});
  REQUIRE(adam == 2);
}

TEST_CASE("Profiler: the table groups, sorts and accounts for the step time; the trace is Chrome's JSON", "[profile]") {
  Trainer trainer{nested_model(), optim::Adam{}, TrainingOptions{}.batch_size(16).epochs(1).verbose(false)};
  profile::Profiler prof;
  trainer.set_profiler(&prof);
  trainer.fit(random_set(64, 1), random_set(16, 2));

  const auto rows = profile::key_averages(prof, profile::GroupBy::kind);
  bool linear = false;
  for (const auto& r : rows)
    if (r.name == "Linear forward" && r.in_step) {
      linear = true;
      REQUIRE(r.calls == 3 * 4);  // three Linear layers, four steps
    }
  REQUIRE(linear);
  const std::string by_self = profile::table(prof);
  INFO(by_self);
  REQUIRE(by_self.find("1.0: Linear forward") != std::string::npos);
  REQUIRE(by_self.find("0: Linear forward [evaluation]") != std::string::npos);
  REQUIRE(by_self.find("Steps recorded: 4") != std::string::npos);
  // Sorted by self time, descending: the first data row's self time is the largest.
  auto sorted = profile::key_averages(prof);
  double largest = 0.0;
  for (const auto& r : sorted) largest = std::max(largest, r.self_us);
  const std::string first_row = by_self.substr(by_self.find('\n', by_self.find('\n') + 1) + 1);
  const std::string first_name = first_row.substr(0, first_row.find("  "));
  bool first_is_largest = false;
  for (const auto& r : sorted)
    if (r.name == first_name) first_is_largest = r.self_us == largest;
  REQUIRE(first_is_largest);
  const std::string by_name = profile::table(prof, {.sort_by = profile::SortBy::name});
  REQUIRE(by_name.find("0: Linear backward") < by_name.find("2: Linear forward"));

  const auto summary = profile::step_summary(prof);
  REQUIRE(summary.steps == 4);
  REQUIRE(summary.accounted > 0.0);
  REQUIRE(summary.accounted <= 1.0);

  const auto trace = parse_json(profile::chrome_trace(prof, 3));
  const auto* events = trace.find("traceEvents");
  REQUIRE(events != nullptr);
  std::size_t complete = 0, named_module = 0;
  for (const auto& e : events->array) {
    REQUIRE(e.find("pid")->number == 3);
    if (e.find("ph")->string != "X") continue;
    ++complete;
    REQUIRE(e.find("dur")->number >= 0);
    if (e.find("name")->string == "1.0: Linear" && e.find("args")->find("kind")->string == "Linear") ++named_module;
  }
  REQUIRE(complete == prof.events().size());
  REQUIRE(named_module == 2 * 4 + 1);  // forward and backward per step, and the evaluation's forward
}

TEST_CASE("Profiler on 2 ranks: bucket reductions on the communication track, every rank in the table and the trace",
          "[profile]") {
  const std::string dir = (std::filesystem::temp_directory_path() / "xtrain_profile_test").string();
  std::filesystem::remove_all(dir);
  std::vector<std::string> tables(2);
  std::vector<std::size_t> buckets(2), comm_spans(2), misfiled(2);  // checked after the threads (Catch2 v2)
  parallel::launch_threads(2, [&](parallel::ThreadAllReduce& comm) {
    Trainer<decltype(nested_model()), optim::Adam, FullPrecision, parallel::ThreadAllReduce> t{
        nested_model(), optim::Adam{}, TrainingOptions{}.global_batch_size(16).bucket_bytes(512).verbose(false), comm};
    buckets[comm.rank()] = t.bucket_count();
    profile::Profiler prof;
    t.set_profiler(&prof);
    t.fit(random_set(64, 1), random_set(16, 2));
    for (const auto& e : prof.events())
      if (e.track == 1) {
        ++comm_spans[comm.rank()];
        misfiled[comm.rank()] += e.category != profile::Category::communication ||
                                 prof.labels()[e.label].kind.rfind("allreduce bucket ", 0) != 0;
      }
    tables[comm.rank()] = profile::table(prof, t.communicator());
    profile::export_chrome_traces(prof, t.communicator(), dir);
  });
  for (std::size_t r = 0; r < 2; ++r) {
    REQUIRE(buckets[r] > 1);
    REQUIRE(comm_spans[r] > 0);  // the buckets that started during backward (the last one blocks)
    REQUIRE(misfiled[r] == 0);
  }
  INFO(tables[0]);
  REQUIRE(tables[0].find("Name (2 ranks)") != std::string::npos);
  REQUIRE(tables[0].find("gradient allreduce wait") != std::string::npos);
  REQUIRE(tables[1].empty());
  const auto merged = parse_json(read(dir + "/trace.json"));
  std::set<double> pids;
  for (const auto& e : merged.find("traceEvents")->array) pids.insert(e.find("pid")->number);
  REQUIRE(pids == std::set<double>{0, 1});
  REQUIRE(std::filesystem::exists(dir + "/trace_rank1.json"));
  std::filesystem::remove_all(dir);
}

TEST_CASE("Profiler: profile_memory counts the tensor bytes a module allocates (the first step only)", "[profile]") {
  Trainer trainer{nested_model(), optim::Adam{}, TrainingOptions{}.batch_size(16).epochs(1).verbose(false)};
  profile::Profiler prof({.profile_memory = true});
  trainer.set_profiler(&prof);
  trainer.fit(random_set(64, 1), random_set(16, 2));
  std::vector<std::int64_t> first_linear;
  for (const auto& e : prof.events())
    if (what(prof, e) == "0: Linear forward" && e.category == profile::Category::forward &&
        e.parent != profile::Event::none && prof.events()[e.parent].parent != profile::Event::none &&
        prof.events()[prof.events()[e.parent].parent].category == profile::Category::step)
      first_linear.push_back(e.bytes);
  REQUIRE(first_linear.size() == 4);
  REQUIRE(first_linear[0] == static_cast<std::int64_t>(16 * 16 * sizeof(float)));       // its [16, 16] output
  for (std::size_t i = 1; i < first_linear.size(); ++i) REQUIRE(first_linear[i] == 0);  // reused
}

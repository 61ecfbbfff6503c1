// core/profiler.hpp: the recorder modules and the engine call. Scopes nest and account for their
// children; the schedule records warmup and active steps and drops the warmup's events; an
// owner's EventLabels records nothing without a profiler and names its events by kind. (The
// profiler on a real training, the table and the trace: profile/test_report.cpp.)
#include <string>
#include <thread>

#include <catch2/catch.hpp>

#include "xtrain/core/profiler.hpp"

using namespace xtrain;

TEST_CASE("Profiler scopes nest and account for their children", "[profile]") {
  profile::Profiler p;
  {
    const auto outer = p.scope("outer");
    {
      const auto inner = p.scope("inner");
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  REQUIRE(p.events().size() == 2);
  const profile::Event& outer = p.events()[0];
  const profile::Event& inner = p.events()[1];
  REQUIRE(p.labels()[outer.label].text() == "outer");
  REQUIRE(inner.parent == 0);
  REQUIRE(outer.child_ns == inner.dur_ns);
  REQUIRE(outer.dur_ns >= inner.dur_ns);
  REQUIRE(inner.dur_ns >= 1000000);
}

TEST_CASE("Profiler schedule: skip, wait, warmup (dropped) and active steps", "[profile]") {
  profile::Profiler p({.schedule = {.wait = 1, .warmup = 1, .active = 1, .repeat = 1, .skip_first = 1}});
  const std::uint32_t label = p.label("", "work");
  for (int step = 0; step < 6; ++step) {
    { const auto s = p.scope(label, profile::Category::user); }
    p.step();
  }
  // Step 0 skipped, 1 waited, 2 warmed up (dropped when 3 began), 3 active, then off (repeat 1).
  REQUIRE(p.events().size() == 1);
  REQUIRE(p.events()[0].step == 3);
  REQUIRE(p.step_count() == 6);
  REQUIRE_FALSE(p.recording());
}

TEST_CASE("EventLabels: nothing without a profiler, events named by kind with one", "[profile]") {
  profile::EventLabels<2> labels{{"loss", "optimizer"}};
  { const auto s = labels.scope(0, profile::Category::forward); }  // no profiler: nothing, no crash
  REQUIRE(labels.profiler() == nullptr);
  profile::Profiler p;
  labels.set_kind(0, "CrossEntropyLoss");
  labels.attach(&p);
  { const auto s = labels.scope(0, profile::Category::forward); }
  { const auto s = labels.scope(1, profile::Category::optimizer); }
  REQUIRE(p.events().size() == 2);
  REQUIRE(p.labels()[p.events()[0].label].kind == "CrossEntropyLoss");
  REQUIRE(p.labels()[p.events()[1].label].kind == "optimizer");
  REQUIRE(p.events()[1].category == profile::Category::optimizer);
  labels.attach(nullptr);
  { const auto s = labels.scope(0, profile::Category::forward); }
  REQUIRE(p.events().size() == 2);
}

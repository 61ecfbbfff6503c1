#pragma once
/// \file profiler.hpp
/// xtrain::profile::Profiler: where a training step's time goes, per module (state_dict names),
/// the loss, the optimizer, each gradient bucket's reduction, data loading, evaluation and
/// checkpoints, as torch.profiler records it. Attach one to a Trainer (`trainer.set_profiler(&p)`)
/// or an Engine; `profile/report.hpp` prints the table and writes Chrome traces.
///
/// Off costs one pointer test per module call: Context::profiler is null unless a profiler is
/// attached, and an attached one outside its schedule's warmup/active steps records nothing.
/// On, an event costs two clock reads and one push into a reserved vector.

#include <algorithm>
#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <typeinfo>
#include <unordered_map>
#include <utility>
#include <vector>

#if defined(__GNUG__)
#include <cxxabi.h>
#endif

#include "xtrain/core/memory.hpp"

namespace xtrain::profile {

/// The kind of the event of zeroing the gradients at the start of an accumulation window
/// (category optimizer; PyTorch's profiler calls it Optimizer.zero_grad).
inline constexpr const char* zero_grad_kind = "zero_grad";

/// What an event is.
enum class Category : std::uint8_t {
  step,           ///< one training (micro-)step: everything else of the step is inside it
  forward,        ///< a module's (or the loss's) forward
  backward,       ///< a module's (or the loss's) backward
  optimizer,      ///< the optimizer step (with unscaling and clipping)
  reduction,      ///< time the compute thread spends on gradient reduction (blocked or blocking)
  communication,  ///< a non-blocking bucket allreduce, from its start to its completion (own track)
  data,           ///< fetching and batching the data
  evaluation,     ///< an evaluation pass
  checkpoint,     ///< saving or loading a checkpoint
  user,           ///< a scope of the user's (Profiler::scope)
};

constexpr const char* category_name(Category c) noexcept {
  switch (c) {
    case Category::step:
      return "step";
    case Category::forward:
      return "forward";
    case Category::backward:
      return "backward";
    case Category::optimizer:
      return "optimizer";
    case Category::reduction:
      return "reduction";
    case Category::communication:
      return "communication";
    case Category::data:
      return "data";
    case Category::evaluation:
      return "evaluation";
    case Category::checkpoint:
      return "checkpoint";
    case Category::user:
      return "user";
  }
  return "user";
}

/// Which steps are recorded, as torch.profiler.schedule: skip `skip_first` steps, then cycles of
/// `wait` steps not recorded, `warmup` steps recorded and discarded (the first steps' one-time
/// costs stay out), `active` steps kept; `repeat` cycles (0: until the end). `active == 0`: every
/// step from the first is kept (no schedule).
struct Schedule {
  std::uint64_t wait = 0, warmup = 0, active = 0, repeat = 0, skip_first = 0;
};

/// As torch.profiler.profile's arguments.
struct ProfilerOptions {
  Schedule schedule{};
  bool record_shapes = false;   ///< note each module call's input shape
  bool profile_memory = false;  ///< note the tensor bytes each event allocated (memory::counters)
};

/// One recorded interval. Times in nanoseconds since the profiler's origin (a clock shared by the
/// ranks once the Trainer attached the profiler: they start it together, after a barrier).
struct Event {
  static constexpr std::uint32_t none = 0xffffffffu;
  std::int64_t start_ns = 0, dur_ns = 0;
  std::int64_t child_ns = 0;                ///< time of the events directly inside it
  std::int64_t bytes = 0, child_bytes = 0;  ///< tensor bytes allocated inside (profile_memory)
  std::uint64_t step = 0;                   ///< the profiler step it belongs to
  std::uint32_t label = 0;                  ///< Profiler::labels() index
  std::uint32_t shape = none;               ///< Profiler::shapes() index (record_shapes)
  std::uint32_t parent = none;              ///< index of the event it is directly inside
  std::uint8_t track = 0;                   ///< 0: the compute thread, 1: communication
  Category category = Category::user;
};

/// What an event is about: a module's state_dict name (empty for the root and for what is not a
/// module) and its kind ("Linear", "BatchNorm1d", "Adam", "data", ...).
struct Label {
  std::string module, kind;
  /// "0: Linear", "Sequential" (the root), "data".
  std::string text() const { return module.empty() ? kind : module + ": " + kind; }
};

/// The class name of `m`: what its describe() says before '(' ("Linear(in_features=..." ->
/// "Linear"), else its demangled type name without namespaces and template arguments.
template <class M>
std::string kind_of(const M& m) {
  if constexpr (requires { m.describe(); }) {
    std::string s = m.describe();
    const std::size_t cut = s.find_first_of("(\n ");
    if (cut != 0) return s.substr(0, cut);
  }
  std::string name = typeid(M).name();
#if defined(__GNUG__)
  int status = 0;
  std::unique_ptr<char, void (*)(void*)> d(abi::__cxa_demangle(name.c_str(), nullptr, nullptr, &status), std::free);
  if (status == 0 && d) name = d.get();
#endif
  if (const std::size_t lt = name.find('<'); lt != std::string::npos) name.resize(lt);
  if (const std::size_t colon = name.rfind("::"); colon != std::string::npos) name.erase(0, colon + 2);
  return name;
}

class Profiler {
  using clock = std::chrono::steady_clock;

 public:
  /// An open event: ends when destroyed. Empty (does nothing) when the profiler is not recording.
  class Scope {
   public:
    Scope() = default;
    Scope(Profiler* p, std::uint32_t index) noexcept : p_(p), index_(index) {}
    Scope(Scope&& o) noexcept : p_(std::exchange(o.p_, nullptr)), index_(o.index_) {}
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;
    Scope& operator=(Scope&&) = delete;
    ~Scope() {
      if (p_) p_->end(index_);
    }

   private:
    Profiler* p_ = nullptr;
    std::uint32_t index_ = 0;
  };

  explicit Profiler(ProfilerOptions options = {}) : options_(options), origin_(clock::now()) { update_state(); }
  Profiler(const Profiler&) = delete;
  Profiler& operator=(const Profiler&) = delete;

  const ProfilerOptions& options() const noexcept { return options_; }
  /// Whether events are recorded now (a warmup or active step of the schedule).
  bool recording() const noexcept { return recording_; }

  /// Makes room for `n` events now (otherwise the first event reserves 16384).
  void reserve(std::size_t n) { events_.reserve(n); }

  /// Ends a step (torch's `prof.step()`; the Trainer calls it after each optimizer step): the
  /// schedule moves on. The warmup steps' events are dropped when the active steps begin.
  void step() {
    const State before = state_;
    ++step_;
    update_state();
    if (before == State::warmup && state_ == State::active && open_.empty()) events_.resize(warmup_begin_);
    if (before != State::warmup && state_ == State::warmup) warmup_begin_ = events_.size();
  }
  /// Steps ended so far.
  std::uint64_t step_count() const noexcept { return step_; }

  /// Names the modules of `model` by their state_dict names (the root: its kind alone), so that
  /// their forward and backward events say which module they are. Engines call it.
  template <class M>
  void attach(M& model) {
    add_module(&model, type_tag<M>(), "", kind_of(model));
    Namer n{*this, {}};
    model.visit(n);
  }

  /// Starts the timeline's clock now (the Trainer calls it on every rank right after a barrier).
  void set_origin() noexcept { origin_ = clock::now(); }

  /// Opens an event (labelled `label`, an index from label()) until the Scope is destroyed.
  Scope scope(std::uint32_t label, Category category, std::uint32_t shape = Event::none) {
    if (!recording_) return {};
    Event e;
    e.label = label;
    e.category = category;
    e.shape = shape;
    e.step = step_;
    e.parent = open_.empty() ? Event::none : open_.back();
    if (events_.capacity() == 0) events_.reserve(1u << 14);  // at the first event: attaching costs nothing
    if (options_.profile_memory) e.bytes = memory::counters().allocated;
    const auto index = static_cast<std::uint32_t>(events_.size());
    e.start_ns = now_ns();
    events_.push_back(e);
    open_.push_back(index);
    return {this, index};
  }
  /// The same with a name (a user's scope: `auto s = prof.scope("tokenize")`).
  Scope scope(std::string_view name, Category category = Category::user) {
    if (!recording_) return {};
    return scope(label("", name), category);
  }

  /// An event for `module`'s forward or backward on input `x` (xtrain::forward/backward call it).
  template <class M, class X>
  Scope module_scope(const M& module, Category category, const X& x) {
    if (!recording_) return {};
    std::uint32_t shape = Event::none;
    if constexpr (requires { x.shape().str(); })
      if (options_.record_shapes) shape = intern(shapes_, shape_index_, x.shape().str());
    return scope(module_label(module), category, shape);
  }

  /// A finished interval on a track of its own (a non-blocking allreduce: it runs while the
  /// compute thread goes on), from `start` to `end`.
  void span(std::uint32_t label, Category category, std::uint8_t track, clock::time_point start,
            clock::time_point end) {
    if (!recording_) return;
    Event e;
    e.label = label;
    e.category = category;
    e.track = track;
    e.step = step_;
    e.start_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(start - origin_).count();
    e.dur_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(end - start).count();
    events_.push_back(e);
  }

  /// The index of the label (module name, kind), added the first time.
  std::uint32_t label(std::string_view module, std::string_view kind) {
    std::string key;
    key.reserve(module.size() + kind.size() + 1);
    key.append(module).push_back('\0');
    key.append(kind);
    const auto [it, added] = label_index_.try_emplace(std::move(key), static_cast<std::uint32_t>(labels_.size()));
    if (added) labels_.push_back({std::string(module), std::string(kind)});
    return it->second;
  }

  /// The label of `module` (attached, or added now with an empty name).
  template <class M>
  std::uint32_t module_label(const M& module) {
    const auto it = modules_.find(Key{&module, type_tag<M>()});
    if (it != modules_.end()) return it->second;
    return add_module(&module, type_tag<M>(), "", kind_of(module));
  }

  const std::vector<Event>& events() const noexcept { return events_; }
  const std::vector<Label>& labels() const noexcept { return labels_; }
  const std::vector<std::string>& shapes() const noexcept { return shapes_; }
  /// Drops the events recorded so far (labels stay). Call it between steps, with no scope open.
  void clear() noexcept {
    events_.clear();
    open_.clear();
    warmup_begin_ = 0;
  }

 private:
  enum class State { off, warmup, active };
  struct Key {
    const void* object;
    const void* type;
    bool operator==(const Key&) const = default;
  };
  struct KeyHash {
    std::size_t operator()(const Key& k) const noexcept {
      return std::hash<const void*>{}(k.object) * 31u + std::hash<const void*>{}(k.type);
    }
  };
  // One address per type: the module key is (object, type), as a container and its first member
  // share an address.
  template <class M>
  static const void* type_tag() noexcept {
    static const char tag = 0;
    return &tag;
  }

  struct Namer {
    Profiler& p;
    std::string prefix;
    template <class... A>
    void param(A&&...) {}
    template <class... A>
    void buffer(A&&...) {}
    template <class I>
    void id(I&) {}
    template <class M>
    void child(std::string_view name, M& m) {
      std::string full = prefix;
      if (!name.empty()) full += (full.empty() ? "" : ".") + std::string(name);
      p.add_module(&m, type_tag<M>(), full, kind_of(m));
      Namer inner{p, full};
      m.visit(inner);
    }
  };

  std::uint32_t add_module(const void* object, const void* type, const std::string& name, const std::string& kind) {
    const std::uint32_t l = label(name, kind);
    modules_[Key{object, type}] = l;
    return l;
  }

  static std::uint32_t intern(std::vector<std::string>& values, std::unordered_map<std::string, std::uint32_t>& index,
                              std::string s) {
    const auto [it, added] = index.try_emplace(s, static_cast<std::uint32_t>(values.size()));
    if (added) values.push_back(std::move(s));
    return it->second;
  }

  std::int64_t now_ns() const noexcept {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(clock::now() - origin_).count();
  }

  void end(std::uint32_t index) noexcept {
    if (index >= events_.size()) return;  // dropped by a clear() while open (a misuse): nothing to end
    const std::int64_t now = now_ns();
    Event& e = events_[index];
    e.dur_ns = now - e.start_ns;
    if (options_.profile_memory) e.bytes = memory::counters().allocated - e.bytes;
    if (!open_.empty() && open_.back() == index) open_.pop_back();
    if (e.parent != Event::none) {
      events_[e.parent].child_ns += e.dur_ns;
      events_[e.parent].child_bytes += e.bytes;
    }
  }

  void update_state() noexcept {
    const Schedule& s = options_.schedule;
    state_ = step_ < s.skip_first ? State::off : State::active;
    if (s.active != 0 && state_ == State::active) {  // in a cycle of wait, warmup, active steps
      const std::uint64_t k = step_ - s.skip_first, cycle = s.wait + s.warmup + s.active;
      const std::uint64_t phase = k % cycle;
      if ((s.repeat != 0 && k / cycle >= s.repeat) || phase < s.wait)
        state_ = State::off;
      else if (phase < s.wait + s.warmup)
        state_ = State::warmup;
    }
    recording_ = state_ != State::off;
  }

  ProfilerOptions options_;
  clock::time_point origin_;
  std::uint64_t step_ = 0;
  State state_ = State::active;
  bool recording_ = true;
  std::size_t warmup_begin_ = 0;
  std::vector<Event> events_;
  std::vector<std::uint32_t> open_;
  std::vector<Label> labels_;
  std::unordered_map<std::string, std::uint32_t> label_index_;
  std::vector<std::string> shapes_;
  std::unordered_map<std::string, std::uint32_t> shape_index_;
  std::unordered_map<Key, std::uint32_t, KeyHash> modules_;
};

/// The labels of an owner's own events (the engine's loss and optimizer, a synchronisation's
/// waits), interned when a profiler is attached: `labels.scope(i, category)` records event i in
/// the attached profiler, and does nothing without one.
template <std::size_t N>
class EventLabels {
 public:
  explicit EventLabels(std::array<std::string, N> kinds) : kinds_(std::move(kinds)) {}
  /// Records into `p` from now on (null: nothing). Kinds set before are the ones recorded.
  void attach(Profiler* p) {
    profiler_ = p;
    if (p)
      for (std::size_t i = 0; i < N; ++i) labels_[i] = p->label("", kinds_[i]);
  }
  /// Sets the kind of event i (a loss's or an optimizer's name); takes effect at attach().
  void set_kind(std::size_t i, std::string_view kind) { kinds_[i] = std::string(kind); }
  /// Records event i until the returned scope ends.
  Profiler::Scope scope(std::size_t i, Category category) const {
    return profiler_ ? profiler_->scope(labels_[i], category) : Profiler::Scope{};
  }
  Profiler* profiler() const noexcept { return profiler_; }

 private:
  std::array<std::string, N> kinds_;
  std::array<std::uint32_t, N> labels_{};
  Profiler* profiler_ = nullptr;
};

}  // namespace xtrain::profile

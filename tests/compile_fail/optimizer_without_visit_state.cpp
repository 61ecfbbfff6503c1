// Must NOT compile: an optimizer with State, init, step, learning_rate and name, but no
// visit_state (what the sharded step and checkpoints split and gather its state through). The
// first error must be xtrain's message naming it, at the Trainer, not deep inside the engine.
#include <xtrain/xtrain.hpp>

struct SignMomentum {
  static constexpr const char* name = "SignMomentum";
  struct State {
    xtrain::AlignedVector velocity;
    template <class Archive>
    void serialize(Archive& ar, unsigned) {
      ar& velocity;
    }
  };
  State init(std::size_t n) const { return {xtrain::AlignedVector(n, 0.0f)}; }
  void step(std::span<float> p, std::span<const float> g, State& s, const xtrain::StepInfo& info) const {
    for (std::size_t i = 0; i < p.size(); ++i) {
      float& v = s.velocity[info.state_offset + i];
      v = 0.9f * v + g[i];
      p[i] -= info.lr * (v > 0.0f ? 1.0f : v < 0.0f ? -1.0f : 0.0f);
    }
  }
  float learning_rate() const { return 0.01f; }
};

int main() {
  xtrain::Trainer trainer{xtrain::layers::Sequential{xtrain::layers::Linear{4, 2}}, SignMomentum{}};
  (void)trainer;
}

// optim/adam8bit.hpp: the 8-bit codes, Adam8bit/AdamW8bit against Adam/AdamW (fp32-kept tensors
// bitwise, the rest close, training as well), the same weights on 1 and 2 threads, state of
// about 2 bytes per parameter, checkpoints.
#include <array>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "support.hpp"
#include "xtrain/xtrain.hpp"

using namespace xtrain;

namespace {
auto mlp8() {
  set_seed(5);
  return layers::Sequential{layers::Linear{784, 64}, layers::ReLU{}, layers::Linear{64, 10}};
}
/// Trains mlp8() with `opt` for one epoch of 3200 Fashion-MNIST images; its parameters, test accuracy.
template <class Opt, class Backend = backend::Cpu>
std::pair<std::vector<float>, double> train8(const Opt& opt, TrainingOptions options = {}) {
  Trainer<decltype(mlp8()), Opt, FullPrecision, parallel::SingleProcess, Backend> t{
      mlp8(), opt, options.batch_size(32).epochs(1).verbose(false)};
  const History h = t.fit(test::fashion_head<3200>(), test::fashion_head<1000, true>());
  return {{t.params().values().begin(), t.params().values().end()}, h.epochs.back().test.accuracy};
}
}  // namespace

TEST_CASE("The 8-bit codes: 1 is exact, every code decodes and encodes back, the error is relative", "[optim][8bit]") {
  using optim::quant::encode_signed, optim::quant::encode_unsigned;
  const auto& ts = optim::quant::signed_table();
  const auto& tu = optim::quant::unsigned_table();
  REQUIRE(ts[encode_signed(1.0f, 1.0f)] == 1.0f);
  REQUIRE(ts[encode_signed(-1.0f, 1.0f)] == -1.0f);
  REQUIRE(tu[encode_unsigned(1.0f, 1.0f)] == 1.0f);
  REQUIRE(encode_unsigned(0.0f, 1.0f) == 0);
  REQUIRE(encode_signed(0.0f, 1.0f) == 0);
  for (std::uint32_t c = 0; c < 256; ++c) {
    INFO("code " << c);
    if (std::fabs(ts[c]) <= 1.0f && ts[c] != 0.0f) REQUIRE(encode_signed(ts[c], 1.0f) == c);
    if (tu[c] <= 1.0f) REQUIRE(encode_unsigned(tu[c], 1.0f) == c);
  }
  // Relative error at most 1/16 (3 mantissa bits, rounded) down to 2^-14 (m) and 2^-30 (v) of absmax.
  for (float y = 1.0f; y > 1e-9f; y *= 0.9173f) {
    INFO("y " << y);
    if (y > 6.2e-5f) REQUIRE(std::fabs(ts[encode_signed(-y, 1.0f)] + y) <= y / 16.0f);
    REQUIRE(std::fabs(tu[encode_unsigned(y, 1.0f)] - y) <= y / 16.0f);
  }
  REQUIRE(tu[encode_unsigned(3e-9f, 1.0f)] > 0.0f);  // the second moment keeps 10^-8.5 of its block's largest
  // The SIMD encoder gives the scalar one's codes, NaN and values above 1 included (the largest code).
  using B = simd::batch<float>;
  std::vector<float> ys{0.0f, 1.0f, 1.5f, std::nanf(""), INFINITY, 1e-30f, 0.999f, 0.9999999f};
  for (float y = 1.0f; y > 1e-12f; y *= 0.8711f) ys.push_back(y);
  while (ys.size() % B::size) ys.push_back(0.25f);
  for (std::size_t i = 0; i < ys.size(); i += B::size) {
    std::array<std::int32_t, B::size> s{}, u{};
    optim::quant::Signed::encode_batch(B::load_unaligned(ys.data() + i)).store_unaligned(s.data());
    optim::quant::Unsigned::encode_batch(B::load_unaligned(ys.data() + i)).store_unaligned(u.data());
    for (std::size_t k = 0; k < B::size; ++k) {
      INFO("y " << ys[i + k]);
      REQUIRE(static_cast<std::uint32_t>(s[k]) == optim::quant::Signed::encode(ys[i + k]));
      REQUIRE(static_cast<std::uint32_t>(u[k]) == optim::quant::Unsigned::encode(ys[i + k]));
    }
  }
  REQUIRE(optim::quant::Unsigned::encode(std::nanf("")) == 248);
  // The SIMD decoders give the tables' values.
  using I = xsimd::batch<std::int32_t, B::arch_type>;
  std::array<std::int32_t, B::size> lane{};
  for (std::size_t i = 0; i < lane.size(); ++i) lane[i] = static_cast<std::int32_t>(i);
  for (std::size_t c = 0; c < 256; c += B::size) {
    const I codes = I(static_cast<std::int32_t>(c)) + I::load_unaligned(lane.data());
    std::array<float, B::size> du{}, ds{};
    optim::quant::Unsigned::decode_batch(codes).store_unaligned(du.data());
    optim::quant::Signed::decode_batch(codes).store_unaligned(ds.data());
    for (std::size_t k = 0; k < B::size; ++k) {
      REQUIRE(du[k] == tu[c + k]);
      REQUIRE(ds[k] == std::fabs(ts[c + k]));
    }
  }
}

TEST_CASE("AdamW8bit with every tensor kept in fp32 trains bitwise as AdamW", "[optim][8bit]") {
  const auto opt = optim::AdamW{}.lr(2e-3f).weight_decay(0.05f);
  const auto kept = optim::AdamW8bit{}.lr(2e-3f).weight_decay(0.05f).min_8bit_size(1u << 30);
  const auto groups = TrainingOptions{}.param_groups({optim::ParamGroup::no_weight_decay().lr_scale(0.5f)});
  REQUIRE(train8(kept, groups).first == train8(opt, groups).first);
}

TEST_CASE("AdamW8bit trains as AdamW does, with 2 bytes of state per parameter", "[optim][8bit]") {
  const auto [fp32, fp32_acc] = train8(optim::AdamW{}.lr(2e-3f));
  const auto [q8, q8_acc] = train8(optim::AdamW8bit{}.lr(2e-3f));
  REQUIRE(std::fabs(q8_acc - fp32_acc) < 2.0);  // percent; one epoch of 3200 images: ~75 % either way
  float diff = 0.0f;
  for (std::size_t i = 0; i < fp32.size(); ++i) diff = std::max(diff, std::fabs(fp32[i] - q8[i]));
  REQUIRE(diff > 0.0f);  // the 8-bit state did act

  ParamArena arena;
  auto model = mlp8();
  arena.adopt(model);
  const auto opt = optim::AdamW8bit{};
  const std::int64_t before = memory::counters().live;
  const auto state = optim::init_state(opt, arena, 0, arena.size());
  const double bytes = static_cast<double>(memory::counters().live - before);
  // 784 x 64 weights in 8 bits; 64 + 640 + 10 parameters (under 4096) in fp32.
  REQUIRE(state.fp32.exp_avg.size() == 64 + 640 + 16);
  REQUIRE(bytes / static_cast<double>(arena.parameter_count()) < 2.3);
  REQUIRE(state.exp_avg_codes.size() == arena.size());
}

TEST_CASE("AdamW8bit gives the same weights on 1 and 2 threads", "[optim][8bit]") {
  const auto opt = optim::AdamW8bit{}.lr(2e-3f).min_8bit_size(1000);
  REQUIRE(train8<optim::AdamW8bit, backend::CpuThreads>(opt, TrainingOptions{}.threads(1)).first ==
          train8<optim::AdamW8bit, backend::CpuThreads>(opt, TrainingOptions{}.threads(2)).first);
}

TEST_CASE("Adam8bit steps a flat buffer; its state resumes from a checkpoint", "[optim][8bit][checkpoint]") {
  std::vector<float> p(1000), g(1000);
  for (std::size_t i = 0; i < p.size(); ++i) {
    p[i] = std::sin(0.1f * static_cast<float>(i));
    g[i] = std::cos(0.37f * static_cast<float>(i)) * 1e-3f;
  }
  const auto opt = optim::Adam8bit{}.lr(1e-2f);
  const auto adam = optim::Adam{}.lr(1e-2f);
  auto s8 = opt.init(p.size());
  auto s32 = adam.init(p.size());
  std::vector<float> p32 = p;
  for (std::uint64_t t = 1; t <= 5; ++t) {
    opt.step(p, g, s8, StepInfo{1e-2f, t});
    adam.step(p32, g, s32, StepInfo{1e-2f, t});
  }
  for (std::size_t i = 0; i < p.size(); ++i) REQUIRE(p[i] == Approx(p32[i]).margin(2e-3));
  REQUIRE_THROWS_WITH(opt.step(p, g, s8, StepInfo{1e-2f, 6, 16}), Catch::Contains("not on a block of 256"));

  const std::string dir = (std::filesystem::temp_directory_path() / "xtrain_adam8bit_ckpt").string();
  std::filesystem::remove_all(dir);
  const auto options = TrainingOptions{}.batch_size(32).epochs(1).verbose(false);
  using T = Trainer<decltype(mlp8()), optim::AdamW8bit>;
  std::vector<float> straight, resumed;
  {
    T t{mlp8(), optim::AdamW8bit{}.lr(2e-3f), options};
    t.fit(test::fashion_head<3200>(), test::fashion_head<1000, true>());
    straight.assign(t.params().values().begin(), t.params().values().end());
  }
  {
    T t{mlp8(), optim::AdamW8bit{}.lr(2e-3f), options};
    try {
      t.fit(test::fashion_head<3200>(), test::fashion_head<1000, true>(), test::SaveAndStop{dir, 40});
    } catch (const std::runtime_error&) {
    }
  }
  {
    T t{mlp8(), optim::AdamW8bit{}.lr(2e-3f), options};
    t.load_state(dir);
    t.fit(test::fashion_head<3200>(), test::fashion_head<1000, true>());
    resumed.assign(t.params().values().begin(), t.params().values().end());
  }
  REQUIRE(resumed == straight);
  std::filesystem::remove_all(dir);
}

// layers/residual.hpp: the residual sum in bf16 rounds as from_float does, in registers and in
// the tail. (Residual{m} in models: test_sequential.cpp, test_module_parity.cpp.)
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "layers/helpers.hpp"
#include "parity.hpp"
#include "support.hpp"
#include "xtrain/kernels/reference/attention.hpp"
#include "xtrain/xtrain.hpp"

using namespace xtrain;
using namespace xtrain::test;
namespace nn = xtrain::layers;

TEST_CASE("The residual sum in bf16 rounds as from_float does, in registers and in the tail",
          "[transformer][precision]") {
  // 37 values: two registers of 16 and a tail of 5; ties to even, a subnormal sum (not flushed),
  // NaN quieted, overflow to Inf.
  const std::size_t n = 37;
  std::vector<float> fa(n), fb(n);
  for (std::size_t i = 0; i < n; ++i) {
    fa[i] = 1.0f + static_cast<float>(i) / 64.0f;
    fb[i] = std::ldexp(1.0f, -8 - static_cast<int>(i % 3));  // halfway, a quarter, an eighth of a bf16 ulp of 1
  }
  fa[3] = 3e-39f;  // subnormal (bf16 keeps it)
  fb[3] = 1e-39f;
  fa[20] = std::numeric_limits<float>::quiet_NaN();
  fa[33] = 3e38f;
  fb[33] = 3e38f;
  std::vector<bf16> a(n), b(n), out(n), expected(n);
  kernels::from_float(fa.data(), a.data(), n);
  kernels::from_float(fb.data(), b.data(), n);
  std::vector<float> wa(n), wb(n), sum(n);
  kernels::to_float(a.data(), wa.data(), n);
  kernels::to_float(b.data(), wb.data(), n);
  for (std::size_t i = 0; i < n; ++i) sum[i] = wa[i] + wb[i];
  kernels::from_float(sum.data(), expected.data(), n);
  nn::detail::add(a.data(), b.data(), out.data(), n);
  for (std::size_t i = 0; i < n; ++i) {
    INFO("element " << i);
    REQUIRE(std::memcmp(&out[i], &expected[i], sizeof(bf16)) == 0);
  }
}

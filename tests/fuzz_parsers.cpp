// libFuzzer target for every parser of untrusted bytes: the first byte picks the checkpoint
// header (0), safetensors (1), NPY (2) or IDX (3); the rest is the file. Any outcome but a
// value or an xtrain::Error (a crash, a sanitizer report, another exception) is a finding.
// Built and run for 60 s by tests/run_fuzzer.sh (ctest fuzz.parsers).
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "xtrain/checkpoint/archive.hpp"
#include "xtrain/checkpoint/safetensors.hpp"
#include "xtrain/data/idx.hpp"
#include "xtrain/data/npy.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const std::string bytes(reinterpret_cast<const char*>(data) + 1, size - 1);
  try {
    switch (data[0] % 4) {
      case 0:
        xtrain::checkpoint::verify(bytes, "fuzz");
        break;
      case 1: {
        const auto f = xtrain::checkpoint::parse_safetensors(bytes, "fuzz");
        std::size_t sum = 0;  // touch every tensor's bytes: offsets must be in bounds
        for (const auto& e : f.entries)
          for (auto i = e.begin; i < e.end; ++i) sum += static_cast<unsigned char>(f.bytes[i]);
        (void)sum;
        break;
      }
      case 2: {
        const auto a = xtrain::data::parse_npy({bytes.begin(), bytes.end()}, "fuzz");
        double sum = 0;  // read every element: the data must be where the header says
        for (std::size_t i = 0; i < a.count(); ++i) sum += a.at(i);
        (void)sum;
        break;
      }
      default:
        xtrain::data::parse_idx({bytes.begin(), bytes.end()}, "fuzz");
    }
  } catch (const xtrain::Error&) {
  }
  return 0;
}

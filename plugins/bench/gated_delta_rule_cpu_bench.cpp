// Times GatedDeltaRule's CPU kernels, the onnxruntime op's body (gated_delta_rule_cpu.h) against the
// plain reference (gated_delta_rule_ref.h), one call on one core, at the hybrid bench's heads
// (scripts/bench_hybrid_step.py: 4 key heads, 8 value heads, 64 x 64) and Qwen3-Next's (16, 32,
// 128 x 128), and prints the largest difference between the two. Not built by CMake (no CUDA, no
// onnxruntime needed):
//   g++ -O3 -std=gnu++17 -Iplugins plugins/bench/gated_delta_rule_cpu_bench.cpp -o build/gated_delta_rule_cpu_bench
//   build/gated_delta_rule_cpu_bench
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

#include "gated_delta_rule/gated_delta_rule_cpu.h"
#include "gated_delta_rule/gated_delta_rule_ref.h"

namespace {

struct Case {
  const char* name;
  dflash::GatedDeltaRuleShape shape;
  int64_t states_from;
};

// Median milliseconds of `call` over repeats filling about half a second.
template <typename F>
double median_ms(F call) {
  call();
  std::vector<double> times;
  double total = 0;
  while (total < 0.5 || times.size() < 5) {
    const auto start = std::chrono::steady_clock::now();
    call();
    times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    total += times.back();
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2] * 1e3;
}

float max_difference(const std::vector<float>& a, const std::vector<float>& b) {
  float worst = 0.f;
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::fabs(a[i] - b[i]));
  return worst;
}

}  // namespace

int main() {
  const Case cases[] = {
      {"prefill 256, last state", {1, 256, 4, 8, 64, 64}, 255},
      {"verify 16, all states", {1, 16, 4, 8, 64, 64}, 0},
      {"one token", {1, 1, 4, 8, 64, 64}, 0},
      {"prefill 1024, last state", {1, 1024, 4, 8, 64, 64}, 1023},
      {"Qwen3-Next heads, 64 tokens", {1, 64, 16, 32, 128, 128}, 63},
  };
  std::printf("%-30s %-22s %12s %12s %8s %12s\n", "case", "b s Hk Hv Dk Dv", "ref ms", "cpu ms", "speedup",
              "max |diff|");
  for (const Case& c : cases) {
    const auto& s = c.shape;
    std::mt19937 rng(1);
    std::normal_distribution<float> normal(0.f, 1.f);
    auto random = [&](int64_t n) {
      std::vector<float> x(n);
      for (float& v : x) v = normal(rng);
      return x;
    };
    const auto q = random(s.batch * s.tokens * s.key_heads * s.key_dim), k = random(q.size());
    const auto v = random(s.batch * s.tokens * s.value_heads * s.value_dim);
    auto g = random(s.batch * s.tokens * s.value_heads), beta = random(g.size());
    const auto state = random(s.batch * s.value_heads * s.key_dim * s.value_dim);
    for (float& x : g) x = -std::log1p(std::exp(x));  // log decay < 0, as the models' -softplus
    for (float& x : beta) x = 1.f / (1.f + std::exp(-x));
    const size_t kept = (s.tokens - c.states_from) * state.size();
    std::vector<float> out_ref(v.size()), out_cpu(v.size()), states_ref(kept), states_cpu(kept);
    const double ref = median_ms([&] {
      dflash::gated_delta_rule_ref(s, q.data(), k.data(), v.data(), g.data(), beta.data(), state.data(),
                                   c.states_from, out_ref.data(), states_ref.data());
    });
    const double cpu = median_ms([&] {
      dflash::gated_delta_rule_cpu(s, q.data(), k.data(), v.data(), g.data(), beta.data(), state.data(),
                                   c.states_from, out_cpu.data(), states_cpu.data());
    });
    char dims[64];
    std::snprintf(dims, sizeof dims, "%ld %ld %ld %ld %ld %ld", static_cast<long>(s.batch), static_cast<long>(s.tokens),
                  static_cast<long>(s.key_heads), static_cast<long>(s.value_heads), static_cast<long>(s.key_dim),
                  static_cast<long>(s.value_dim));
    const float diff = std::max(max_difference(out_ref, out_cpu), max_difference(states_ref, states_cpu));
    std::printf("%-30s %-22s %12.3f %12.3f %7.1fx %12.2e\n", c.name, dims, ref, cpu, ref / cpu, diff);
  }
  return 0;
}

// The chunked GatedDeltaRule (gated_delta_chunks.h: the CUDA kernel's prefill path) run on host
// threads with a barrier between its phases, as a CUDA block runs it, against the token-by-token
// reference (gated_delta_rule_ref.h): outputs and the last state, float32. It proves the chunk
// algebra, the padding of a short last chunk and of Dk, the column split and the phases' barriers at
// several thread counts; not the CUDA compiler or a GPU (kernel_parity.cpp runs the kernel there).
#include <pthread.h>

#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "check.h"
#include "gated_delta_rule/gated_delta_chunks.h"
#include "gated_delta_rule/gated_delta_rule_ref.h"

namespace {

namespace chunks = dflash::delta_chunks;

// A block's threads on the host: run() starts `count` threads on one body; sync() is a barrier
// (pthread_barrier_wait orders memory as __syncthreads does).
struct HostThreads {
  static int id() { return id_; }
  static int count() { return count_; }
  static void sync() { pthread_barrier_wait(&barrier_); }

  template <class Body>
  static void run(int count, Body body) {
    count_ = count;
    pthread_barrier_init(&barrier_, nullptr, unsigned(count));
    std::vector<std::thread> pool;
    for (int t = 0; t < count; ++t)
      pool.emplace_back([t, &body] {
        id_ = t;
        body();
      });
    for (std::thread& thread : pool) thread.join();
    pthread_barrier_destroy(&barrier_);
  }

 private:
  static inline thread_local int id_ = 0;
  static inline int count_ = 1;
  static inline pthread_barrier_t barrier_;
};

struct FloatIo {
  static float load(const float* p) { return *p; }
  static void store(float* p, float x) { *p = x; }
};

std::vector<float> normal(size_t n, float scale, std::mt19937& rng) {
  std::normal_distribution<float> dist(0.f, scale);
  std::vector<float> values(n);
  for (float& v : values) v = dist(rng);
  return values;
}

// Inputs as a model feeds them (g = -softplus, beta = sigmoid); every block of the grid the CUDA
// kernel launches, each on `threads` host threads; compared with the reference within 1e-5 * (1 + |want|).
void compare_with_reference(int64_t b, int64_t s, int64_t hk, int64_t hv, int64_t dk, int64_t dv, int threads,
                            float g_scale = 1.f) {
  std::mt19937 rng(static_cast<unsigned>(s * 131 + hv * 17 + dk * 3 + dv + threads));
  const dflash::GatedDeltaRuleShape shape{b, s, hk, hv, dk, dv};
  std::vector<float> q = normal(b * s * hk * dk, 1.f, rng), k = normal(b * s * hk * dk, 1.f, rng);
  std::vector<float> v = normal(b * s * hv * dv, 1.f, rng), init = normal(b * hv * dk * dv, 0.5f, rng);
  std::vector<float> g = normal(b * s * hv, 1.f, rng), beta(g.size());
  for (size_t i = 0; i < g.size(); ++i) {
    beta[i] = 1.f / (1.f + std::exp(-g[i]));
    g[i] = -std::log1p(std::exp(g[i])) * g_scale;
  }
  std::vector<float> out_want(b * s * hv * dv), state_want(b * hv * dk * dv);
  dflash::gated_delta_rule_ref(shape, q.data(), k.data(), v.data(), g.data(), beta.data(), init.data(), s - 1,
                               out_want.data(), state_want.data());

  std::vector<float> out(out_want.size(), NAN), state(state_want.size(), NAN);
  auto shared = std::make_unique<chunks::Shared>();
  for (int64_t row = 0; row < b; ++row)
    for (int64_t h = 0; h < hv; ++h)
      for (int64_t column0 = 0; column0 < dv; column0 += chunks::kColumns)
        HostThreads::run(threads, [&] {
          chunks::scan_block<HostThreads, FloatIo>(shape, row, h, column0, q.data(), k.data(), v.data(), g.data(),
                                                   beta.data(), init.data(), out.data(),
                                                   state.data() + (row * hv + h) * dk * dv, *shared);
        });

  const std::string what = "b=" + std::to_string(b) + " s=" + std::to_string(s) + " Hk=" + std::to_string(hk) +
                           " Hv=" + std::to_string(hv) + " Dk=" + std::to_string(dk) + " Dv=" + std::to_string(dv) +
                           " threads=" + std::to_string(threads);
  auto worst = [](const std::vector<float>& got, const std::vector<float>& want) {
    double bad = 0.0;  // NaN (a value never written) counts as infinitely bad
    for (size_t i = 0; i < got.size(); ++i) {
      const double gap = std::fabs(double(got[i]) - want[i]) / (1.0 + std::fabs(want[i]));
      bad = std::isnan(gap) ? INFINITY : std::max(bad, gap);
    }
    return bad;
  };
  const double out_gap = worst(out, out_want), state_gap = worst(state, state_want);
  if (!(out_gap <= 1e-5 && state_gap <= 1e-5))
    check::fail(__FILE__, __LINE__,
                what + ": out off by " + std::to_string(out_gap) + ", last state by " + std::to_string(state_gap));
}

}  // namespace

TEST(one_chunk_exactly_on_one_thread) { compare_with_reference(1, 32, 1, 1, 16, 8, 1); }

TEST(a_short_last_chunk_and_grouped_heads) { compare_with_reference(2, 77, 2, 4, 16, 12, 64); }

TEST(dk_not_a_multiple_of_four_and_a_part_filled_column_block) {
  compare_with_reference(1, 45, 1, 2, 30, 40, 37);  // 37 threads: no phase's work divides evenly
}

TEST(fewer_tokens_than_a_chunk) { compare_with_reference(1, 5, 1, 1, 8, 4, 16); }

TEST(qwen3_next_head_widths_over_many_chunks) { compare_with_reference(1, 200, 1, 2, 128, 128, chunks::kThreads); }

TEST(strong_decay_leaves_no_overflow) {
  compare_with_reference(1, 70, 1, 1, 32, 32, 96, 8.f);  // g down to about -30 a token
}

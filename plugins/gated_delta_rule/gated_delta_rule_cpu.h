// dflash::GatedDeltaRule v1, fast CPU kernel (the onnxruntime op's body): the reference's math
// (gated_delta_rule_ref.h, which stays the CUDA kernel's parity oracle) with one pass over the
// state per token instead of four, vectorised over Dv. Results equal the reference's up to float32
// round-off (summation order, fused multiply-adds). Contract: plugins/gated_delta_rule/README.md.
//
// Why one fused pass: column j of the state evolves on its own (it needs only q_t, k_t, g_t,
// beta_t and v_t[j]), and the recall S^T k_{t+1} that token t+1 needs can be accumulated while
// token t writes its new state. So per token and per tile of 2 x kLanes columns the kernel reads
// each state row once and, in registers: decays it, adds k_t[i] delta, accumulates o_t += S q_t and
// next recall += S k_{t+1}, stores it (and copies it into `states` when kept). The state of one
// head (64 x 64 floats in Qwen3.5, 16 KiB) stays in L1. The chunked form (HF's prefill path) does
// more arithmetic than this at these head sizes and pays only where matrix units do the products.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "gated_delta_rule/gated_delta_rule_ref.h"

namespace dflash {
namespace gated_delta_rule_cpu_detail {

// The code is a template over `Lanes`, a GCC/Clang vector of one register of the ISA it is
// compiled for (8 floats for AVX2, 4 for SSE): a vector wider than the ISA's registers was lowered
// through the stack by GCC 12. A pass covers kTile = 2 x kLanes columns of each state row, so every
// sum has two independent accumulator chains and both FMA pipes stay busy.
typedef float Lanes4 __attribute__((vector_size(4 * sizeof(float))));
typedef float Lanes8 __attribute__((vector_size(8 * sizeof(float))));

template <typename Lanes>
constexpr int64_t kLanes = sizeof(Lanes) / sizeof(float);
template <typename Lanes>
constexpr int64_t kTile = 2 * kLanes<Lanes>;

struct Head {
  int64_t dk, dv, tokens, states_from;
  const float *qn, *kn;  // normalised query and key of this head's key head, [tokens, dk]
  const float *value, *g, *beta;  // first element of position 0 of this (row, head); positions `stride` apart
  int64_t stride;                 // value heads x value_dim (value) or value heads (g, beta)
  float *out, *states;            // out like value; states of position states_from, `state_stride` apart
  int64_t state_stride;
};

// Helpers take vectors by reference and are always inlined: no vector crosses a call, so no ABI
// question between the ISAs the kernel is compiled for. `cols` <= kTile columns from `row`, zeros after.
template <typename Lanes>
[[gnu::always_inline]] inline void load_tile(Lanes& lo, Lanes& hi, const float* row, int64_t cols) {
  if (cols == kTile<Lanes>) {
    std::memcpy(&lo, row, sizeof(Lanes));
    std::memcpy(&hi, row + kLanes<Lanes>, sizeof(Lanes));
    return;
  }
  float x[kTile<Lanes>] = {};
  std::memcpy(x, row, cols * sizeof(float));
  std::memcpy(&lo, x, sizeof(Lanes));
  std::memcpy(&hi, x + kLanes<Lanes>, sizeof(Lanes));
}

template <typename Lanes>
[[gnu::always_inline]] inline void store_tile(float* row, const Lanes& lo, const Lanes& hi, int64_t cols) {
  if (cols == kTile<Lanes>) {
    std::memcpy(row, &lo, sizeof(Lanes));
    std::memcpy(row + kLanes<Lanes>, &hi, sizeof(Lanes));
    return;
  }
  float x[kTile<Lanes>];
  std::memcpy(x, &lo, sizeof(Lanes));
  std::memcpy(x + kLanes<Lanes>, &hi, sizeof(Lanes));
  std::memcpy(row, x, cols * sizeof(float));
}

// One token over one tile (dk rows of two Lanes): row <- decay row + k[i] delta, out += row q[i],
// and when kNext the next token's (undecayed) recall += row k_next[i]; when kKeep the row is
// copied to kept.
template <typename Lanes, bool kNext, bool kKeep>
[[gnu::always_inline]] inline void update_tile(Lanes* tile, int64_t dk, float decay, const Lanes* delta,
                                               const float* k, const float* q, const float* k_next, float* kept,
                                               int64_t kept_stride, int64_t cols, Lanes* out, Lanes* recall) {
  const Lanes d0 = delta[0], d1 = delta[1];
  Lanes o0 = {}, o1 = {}, r0 = {}, r1 = {};
  for (int64_t i = 0; i < dk; ++i) {
    const Lanes x0 = tile[2 * i] * decay + k[i] * d0;
    const Lanes x1 = tile[2 * i + 1] * decay + k[i] * d1;
    tile[2 * i] = x0;
    tile[2 * i + 1] = x1;
    o0 += x0 * q[i];
    o1 += x1 * q[i];
    if constexpr (kNext) {
      r0 += x0 * k_next[i];
      r1 += x1 * k_next[i];
    }
    if constexpr (kKeep) store_tile(kept + i * kept_stride, x0, x1, cols);
  }
  out[0] = o0;
  out[1] = o1;
  if constexpr (kNext) {
    recall[0] = r0;
    recall[1] = r1;
  }
}

// state: this head's state, tile-major ([tiles][dk][2] Lanes, zero past dv); recall: [tiles][2].
template <typename Lanes>
[[gnu::always_inline]] inline void run_head(const Head& h, Lanes* state, Lanes* recall) {
  const int64_t tiles = (h.dv + kTile<Lanes> - 1) / kTile<Lanes>;
  for (int64_t tile = 0; tile < tiles; ++tile) {  // the first token's recall, S0^T k_0
    const Lanes* rows = state + 2 * tile * h.dk;
    Lanes r0 = {}, r1 = {};
    for (int64_t i = 0; i < h.dk; ++i) {
      r0 += rows[2 * i] * h.kn[i];
      r1 += rows[2 * i + 1] * h.kn[i];
    }
    recall[2 * tile] = r0;
    recall[2 * tile + 1] = r1;
  }
  for (int64_t t = 0; t < h.tokens; ++t) {
    const float decay = std::exp(h.g[t * h.stride]), beta = h.beta[t * h.stride];
    const float* k = h.kn + t * h.dk;
    const float* q = h.qn + t * h.dk;
    const float* k_next = k + h.dk;
    const float* v = h.value + t * h.stride * h.dv;
    float* o = h.out + t * h.stride * h.dv;
    const bool next = t + 1 < h.tokens, keep = t >= h.states_from;
    float* kept = keep ? h.states + (t - h.states_from) * h.state_stride : nullptr;
    for (int64_t tile = 0; tile < tiles; ++tile) {
      const int64_t first = tile * kTile<Lanes>, cols = h.dv - first < kTile<Lanes> ? h.dv - first : kTile<Lanes>;
      // delta = beta (v - (decay S)^T k); zero in the padding columns, which therefore stay zero.
      Lanes delta[2], out[2];
      load_tile(delta[0], delta[1], v + first, cols);
      Lanes* r = recall + 2 * tile;
      delta[0] = (delta[0] - r[0] * decay) * beta;
      delta[1] = (delta[1] - r[1] * decay) * beta;
      Lanes* rows = state + 2 * tile * h.dk;
      float* kept_tile = keep ? kept + first : nullptr;
      const int64_t dk = h.dk, dv = h.dv;
      if (next && keep)
        update_tile<Lanes, true, true>(rows, dk, decay, delta, k, q, k_next, kept_tile, dv, cols, out, r);
      else if (next)
        update_tile<Lanes, true, false>(rows, dk, decay, delta, k, q, k_next, nullptr, 0, cols, out, r);
      else if (keep)
        update_tile<Lanes, false, true>(rows, dk, decay, delta, k, q, nullptr, kept_tile, dv, cols, out, r);
      else
        update_tile<Lanes, false, false>(rows, dk, decay, delta, k, q, nullptr, nullptr, 0, cols, out, r);
      store_tile(o + first, out[0], out[1], cols);
    }
  }
}

// The whole op; compiled once per ISA below (always_inline carries the loops into each).
template <typename Lanes>
[[gnu::always_inline]] inline void run(const GatedDeltaRuleShape& s, const float* query, const float* key,
                                       const float* value, const float* g, const float* beta,
                                       const float* initial_state, int64_t states_from, float* out, float* states) {
  const int64_t dk = s.key_dim, dv = s.value_dim, groups = s.value_heads / s.key_heads;
  const int64_t tiles = (dv + kTile<Lanes> - 1) / kTile<Lanes>;
  const float q_scale = std::sqrt(static_cast<float>(dk));
  std::vector<float> qn(s.tokens * dk), kn(s.tokens * dk);
  // Lanes in a float buffer aligned by hand (a std::vector<Lanes> came out 16-byte aligned with GCC 12).
  std::vector<float> buffer((tiles * dk + tiles) * kTile<Lanes> + kLanes<Lanes>);
  const auto address = reinterpret_cast<std::uintptr_t>(buffer.data());
  Lanes* state = reinterpret_cast<Lanes*>((address + sizeof(Lanes) - 1) / sizeof(Lanes) * sizeof(Lanes));
  Lanes* recall = state + 2 * tiles * dk;
  for (int64_t b = 0; b < s.batch; ++b) {
    for (int64_t kh = 0; kh < s.key_heads; ++kh) {
      // Normalise q and k once per key head (its `groups` value heads share them), as the reference does.
      for (int64_t t = 0; t < s.tokens; ++t) {
        const float* q = query + ((b * s.tokens + t) * s.key_heads + kh) * dk;
        const float* k = key + ((b * s.tokens + t) * s.key_heads + kh) * dk;
        float qq = 0.f, kk = 0.f;
        for (int64_t i = 0; i < dk; ++i) {
          qq += q[i] * q[i];
          kk += k[i] * k[i];
        }
        const float rq = 1.f / std::sqrt(qq + kGatedDeltaRuleEpsilon);
        const float rk = 1.f / std::sqrt(kk + kGatedDeltaRuleEpsilon);
        for (int64_t i = 0; i < dk; ++i) {
          qn[t * dk + i] = q[i] * rq / q_scale;
          kn[t * dk + i] = k[i] * rk;
        }
      }
      for (int64_t h = kh * groups; h < (kh + 1) * groups; ++h) {
        const float* initial = initial_state + (b * s.value_heads + h) * dk * dv;
        for (int64_t tile = 0; tile < tiles; ++tile) {
          const int64_t first = tile * kTile<Lanes>, cols = dv - first < kTile<Lanes> ? dv - first : kTile<Lanes>;
          for (int64_t i = 0; i < dk; ++i)
            load_tile(state[2 * (tile * dk + i)], state[2 * (tile * dk + i) + 1], initial + i * dv + first, cols);
        }
        const int64_t head_row = b * s.tokens * s.value_heads + h;  // position 0 of (b, h)
        const int64_t kept = s.tokens - states_from;
        Head head{dk, dv, s.tokens, states_from, qn.data(), kn.data(), value + head_row * dv, g + head_row,
                  beta + head_row, s.value_heads, out + head_row * dv,
                  states + (b * kept * s.value_heads + h) * dk * dv, s.value_heads * dk * dv};
        run_head<Lanes>(head, state, recall);
      }
    }
  }
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define DFLASH_GATED_DELTA_RULE_AVX2 1
[[gnu::target("avx2,fma")]] inline void run_avx2(const GatedDeltaRuleShape& s, const float* query, const float* key,
                                                 const float* value, const float* g, const float* beta,
                                                 const float* initial_state, int64_t states_from, float* out,
                                                 float* states) {
  run<Lanes8>(s, query, key, value, g, beta, initial_state, states_from, out, states);
}
#endif

inline void run_baseline(const GatedDeltaRuleShape& s, const float* query, const float* key, const float* value,
                         const float* g, const float* beta, const float* initial_state, int64_t states_from, float* out,
                         float* states) {
  run<Lanes4>(s, query, key, value, g, beta, initial_state, states_from, out, states);
}

}  // namespace gated_delta_rule_cpu_detail

// Same signature and contract as gated_delta_rule_ref; picks AVX2 + FMA code when the CPU has it
// (the library is built for baseline x86-64, so the wider code is chosen at run time).
inline void gated_delta_rule_cpu(const GatedDeltaRuleShape& s, const float* query, const float* key,
                                 const float* value, const float* g, const float* beta, const float* initial_state,
                                 int64_t states_from, float* out, float* states) {
  namespace d = gated_delta_rule_cpu_detail;
#ifdef DFLASH_GATED_DELTA_RULE_AVX2
  static const bool avx2 = [] {
    __builtin_cpu_init();  // idempotent; makes the check safe however early the library is loaded
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  }();
  if (avx2) return d::run_avx2(s, query, key, value, g, beta, initial_state, states_from, out, states);
#endif
  d::run_baseline(s, query, key, value, g, beta, initial_state, states_from, out, states);
}

}  // namespace dflash

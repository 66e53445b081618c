// dflash::MoE v1, fast CPU kernel over raw pointers: the onnxruntime op's body. Same routing and math as
// moe_ref.h (the oracle tests hold it to), computed the way the CUDA kernel is: a call's (token, slot)
// pairs grouped by expert, so each picked expert's rows are read once a call and reused from cache for
// all its pairs; dot products in 8 independent lanes, which the compiler vectorises. A token's output
// depends on its own pairs only, each sum in a fixed order: batch-invariant.
#pragma once

#include <cstdint>
#include <vector>

#include "moe/moe_ref.h"

namespace dflash {

namespace moe_cpu_detail {

inline float dot(const float* a, const float* b, int64_t n) {
  float lanes[8] = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int l = 0; l < 8; ++l) lanes[l] += a[i + l] * b[i + l];
  float sum = ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) + ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
  for (; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

}  // namespace moe_cpu_detail

// The shapes and layouts of moe_ref; the caller has checked 1 <= top_k <= E.
inline void moe_cpu(const MoEShape& s, const float* hidden, const float* router_logits, const float* gate_up,
                    const float* down, bool normalize, float* out) {
  using moe_cpu_detail::dot;
  const int64_t h = s.hidden, n = s.inter, k = s.top_k, pairs = s.tokens * k;
  std::vector<int64_t> ids(pairs);
  std::vector<float> weights(pairs);
  for (int64_t t = 0; t < s.tokens; ++t)
    moe_route_token(router_logits + t * s.experts, s.experts, k, normalize, ids.data() + t * k, weights.data() + t * k);
  std::vector<std::vector<int64_t>> of_expert(s.experts);  // each expert's pairs, in token order
  for (int64_t p = 0; p < pairs; ++p) of_expert[ids[p]].push_back(p);
  std::vector<float> act(pairs * n), partial(pairs * h);
  for (int64_t e = 0; e < s.experts; ++e) {
    const std::vector<int64_t>& mine = of_expert[e];
    if (mine.empty()) continue;
    const float* gate = gate_up + e * 2 * n * h;
    const float* up = gate + n * h;
    for (int64_t i = 0; i < n; ++i)
      for (int64_t p : mine) {
        const float* x = hidden + (p / k) * h;
        act[p * n + i] = moe_silu(dot(gate + i * h, x, h)) * dot(up + i * h, x, h);
      }
    const float* w = down + e * h * n;
    for (int64_t c = 0; c < h; ++c)
      for (int64_t p : mine) partial[p * h + c] = dot(w + c * n, act.data() + p * n, n);
  }
  for (int64_t t = 0; t < s.tokens; ++t)  // each token's experts summed in slot order
    for (int64_t c = 0; c < h; ++c) {
      float sum = 0.f;
      for (int64_t j = 0; j < k; ++j) sum += weights[t * k + j] * partial[(t * k + j) * h + c];
      out[t * h + c] = sum;
    }
}

}  // namespace dflash

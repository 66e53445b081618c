// dflash::MoE v1, CPU reference kernel over raw pointers (no ONNX Runtime or TensorRT types), written as
// the math reads: the parity oracle of the CUDA kernel and of moe_cpu.h (the onnxruntime op's body). Contract: plugins/moe/README.md; the math is
// dflash_trt/export/moe_routing.py::routed_experts with SiLU.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "common/host_device.h"

namespace dflash {

struct MoEShape {
  int64_t tokens, hidden, experts, inter, top_k;
};

// One token's routing: softmax(logits) in float32, the top_k experts by probability (ties: the
// lowest index, as ONNX TopK), their probabilities renormalised to sum 1 where `normalize`.
// logits [experts] -> ids [top_k] (descending probability), weights [top_k].
template <typename Logit>
inline void moe_route_token(const Logit* logits, int64_t experts, int64_t top_k, bool normalize,
                                               int64_t* ids, float* weights) {
  float peak = -INFINITY;
  for (int64_t e = 0; e < experts; ++e) peak = fmaxf(peak, static_cast<float>(logits[e]));
  float total = 0.f;
  for (int64_t e = 0; e < experts; ++e) total += expf(static_cast<float>(logits[e]) - peak);
  float kept = 0.f;
  for (int64_t j = 0; j < top_k; ++j) {
    int64_t best = -1;
    float best_p = -1.f;
    for (int64_t e = 0; e < experts; ++e) {
      bool taken = false;
      for (int64_t i = 0; i < j; ++i) taken = taken || ids[i] == e;
      const float p = expf(static_cast<float>(logits[e]) - peak) / total;
      if (!taken && p > best_p) {  // strict: an equal probability keeps the lower index
        best = e;
        best_p = p;
      }
    }
    ids[j] = best;
    weights[j] = best_p;
    kept += best_p;
  }
  if (normalize)
    for (int64_t j = 0; j < top_k; ++j) weights[j] /= kept;
}

DFLASH_HOST_DEVICE inline float moe_silu(float x) { return x / (1.f + expf(-x)); }

// hidden [T, H]; router_logits [T, E]; gate_up [E, 2I, H] (rows [gate; up]); down [E, H, I] -> out [T, H]:
// out[t] = sum over its top_k experts e of weight * down[e] @ (silu(gate[e] @ x) * (up[e] @ x)).
// The caller has checked 1 <= top_k <= E.
inline void moe_ref(const MoEShape& s, const float* hidden, const float* router_logits, const float* gate_up,
                    const float* down, bool normalize, float* out) {
  const int64_t h = s.hidden, n = s.inter;
  std::vector<int64_t> ids(s.top_k);
  std::vector<float> weights(s.top_k), act(n);
  for (int64_t t = 0; t < s.tokens; ++t) {
    const float* x = hidden + t * h;
    float* y = out + t * h;
    for (int64_t c = 0; c < h; ++c) y[c] = 0.f;
    moe_route_token(router_logits + t * s.experts, s.experts, s.top_k, normalize, ids.data(), weights.data());
    for (int64_t j = 0; j < s.top_k; ++j) {
      const float* gate = gate_up + ids[j] * 2 * n * h;
      const float* up = gate + n * h;
      for (int64_t i = 0; i < n; ++i) {
        float g = 0.f, u = 0.f;
        for (int64_t c = 0; c < h; ++c) {
          g += gate[i * h + c] * x[c];
          u += up[i * h + c] * x[c];
        }
        act[i] = moe_silu(g) * u;
      }
      const float* w = down + ids[j] * h * n;
      for (int64_t c = 0; c < h; ++c) {
        float acc = 0.f;
        for (int64_t i = 0; i < n; ++i) acc += w[c * n + i] * act[i];
        y[c] += weights[j] * acc;
      }
    }
  }
}

}  // namespace dflash

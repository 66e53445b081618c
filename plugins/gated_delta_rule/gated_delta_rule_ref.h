// dflash::GatedDeltaRule v1, CPU reference kernel over raw pointers (no ONNX Runtime or TensorRT
// types). Contract: plugins/gated_delta_rule/README.md; the math is dflash_trt/export/delta_rule.py.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

namespace dflash {

struct GatedDeltaRuleShape {
  int64_t batch, tokens, key_heads, value_heads, key_dim, value_dim;
};

// The L2 normalisation epsilon of HF's Qwen3-Next / Qwen3.5 layers (use_qk_l2norm_in_kernel).
constexpr float kGatedDeltaRuleEpsilon = 1e-6f;

// query, key [b, s, Hk, Dk]; value [b, s, Hv, Dv]; g, beta [b, s, Hv]; initial_state [b, Hv, Dk, Dv];
// writes out [b, s, Hv, Dv] and states [b, s - states_from, Hv, Dk, Dv] (the state after each
// position t >= states_from). The caller has checked 0 <= states_from < s and Hv % Hk == 0.
inline void gated_delta_rule_ref(const GatedDeltaRuleShape& s, const float* query, const float* key,
                                 const float* value, const float* g, const float* beta, const float* initial_state,
                                 int64_t states_from, float* out, float* states) {
  const int64_t dk = s.key_dim, dv = s.value_dim, groups = s.value_heads / s.key_heads;
  const int64_t kept = s.tokens - states_from;
  const float q_scale = std::sqrt(static_cast<float>(dk));
  std::vector<float> state(dk * dv), q(dk), k(dk), delta(dv);
  for (int64_t b = 0; b < s.batch; ++b) {
    for (int64_t h = 0; h < s.value_heads; ++h) {
      const int64_t kh = h / groups;  // value head h reads key head h / (Hv / Hk)
      std::memcpy(state.data(), initial_state + (b * s.value_heads + h) * dk * dv, dk * dv * sizeof(float));
      for (int64_t t = 0; t < s.tokens; ++t) {
        const int64_t key_row = (b * s.tokens + t) * s.key_heads + kh;
        const int64_t head_row = (b * s.tokens + t) * s.value_heads + h;
        float qq = 0.f, kk = 0.f;
        for (int64_t i = 0; i < dk; ++i) {
          q[i] = query[key_row * dk + i];
          k[i] = key[key_row * dk + i];
          qq += q[i] * q[i];
          kk += k[i] * k[i];
        }
        const float rq = 1.f / std::sqrt(qq + kGatedDeltaRuleEpsilon);
        const float rk = 1.f / std::sqrt(kk + kGatedDeltaRuleEpsilon);
        for (int64_t i = 0; i < dk; ++i) {
          q[i] = q[i] * rq / q_scale;
          k[i] = k[i] * rk;
        }
        const float decay = std::exp(g[head_row]);
        const float* v = value + head_row * dv;
        for (float& x : state) x *= decay;
        for (int64_t j = 0; j < dv; ++j) {
          float recalled = 0.f;  // (S^T k)[j]
          for (int64_t i = 0; i < dk; ++i) recalled += state[i * dv + j] * k[i];
          delta[j] = (v[j] - recalled) * beta[head_row];
        }
        for (int64_t i = 0; i < dk; ++i)
          for (int64_t j = 0; j < dv; ++j) state[i * dv + j] += k[i] * delta[j];
        float* o = out + head_row * dv;
        for (int64_t j = 0; j < dv; ++j) {
          float acc = 0.f;
          for (int64_t i = 0; i < dk; ++i) acc += state[i * dv + j] * q[i];
          o[j] = acc;
        }
        if (t >= states_from) {
          float* kept_state = states + ((b * kept + t - states_from) * s.value_heads + h) * dk * dv;
          std::memcpy(kept_state, state.data(), dk * dv * sizeof(float));
        }
      }
    }
  }
}

}  // namespace dflash

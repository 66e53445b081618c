// dflash::InjectKV v1, CPU reference kernel over raw pointers (no ONNX Runtime or TensorRT types),
// shared by the onnxruntime op and, as the parity oracle, by the future CUDA kernel.
// Contract: plugins/inject_kv/README.md.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

namespace dflash {

struct InjectKVShape {
  int64_t batch, tokens, hidden, kv_heads, head_dim;
};

// hidden [b, n, H]; k_weight, v_weight [kv*d, H] (row-major, nn.Linear layout); k_norm [d];
// cos, sin [b, n, d]; writes k_out, v_out [b, kv, n, d].
inline void inject_kv_ref(const InjectKVShape& s, const float* hidden, const float* k_weight, const float* v_weight,
                          const float* k_norm, const float* cos, const float* sin, float epsilon, float* k_out,
                          float* v_out) {
  const int64_t d = s.head_dim, half = s.head_dim / 2;
  std::vector<float> k(d);
  for (int64_t b = 0; b < s.batch; ++b) {
    for (int64_t t = 0; t < s.tokens; ++t) {
      const float* x = hidden + (b * s.tokens + t) * s.hidden;
      const float* c = cos + (b * s.tokens + t) * d;
      const float* sn = sin + (b * s.tokens + t) * d;
      for (int64_t h = 0; h < s.kv_heads; ++h) {
        const int64_t out_offset = ((b * s.kv_heads + h) * s.tokens + t) * d;
        double square_sum = 0.0;
        for (int64_t j = 0; j < d; ++j) {
          const float* wk = k_weight + (h * d + j) * s.hidden;
          const float* wv = v_weight + (h * d + j) * s.hidden;
          float kj = 0.f, vj = 0.f;
          for (int64_t i = 0; i < s.hidden; ++i) {
            kj += x[i] * wk[i];
            vj += x[i] * wv[i];
          }
          k[j] = kj;
          square_sum += static_cast<double>(kj) * kj;
          v_out[out_offset + j] = vj;
        }
        // RMSNorm over the head, then RoPE in the rotate-half convention (pairs j and j + d/2).
        const float inv_rms = 1.f / std::sqrt(static_cast<float>(square_sum / d) + epsilon);
        for (int64_t j = 0; j < d; ++j) k[j] = k[j] * inv_rms * k_norm[j];
        for (int64_t j = 0; j < d; ++j) {
          const float rotated = j < half ? -k[j + half] : k[j - half];
          k_out[out_offset + j] = k[j] * c[j] + rotated * sn[j];
        }
      }
    }
  }
}

}  // namespace dflash

// dflash::BlockAttention v1, CPU reference kernel over raw pointers (no ONNX Runtime or TensorRT
// types). Contract: plugins/block_attention/README.md.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "common/host_device.h"

namespace dflash {

struct BlockAttentionShape {
  int64_t batch, heads, kv_heads, block, context, head_dim;
};

// The positions a query at q_pos sees: [first, end). The CUDA kernels apply these same functions, so
// the two cannot drift apart.
DFLASH_HOST_DEVICE inline void visible_keys(int64_t q_pos, bool causal, int64_t window, int64_t& first,
                                            int64_t& end) {
  first = window > 0 ? q_pos - window + 1 : INT64_MIN;
  end = causal ? q_pos + 1 : window > 0 ? q_pos + window : INT64_MAX;
}

DFLASH_HOST_DEVICE inline bool key_visible(int64_t q_pos, int64_t k_pos, bool causal, int64_t window) {
  int64_t first, end;
  visible_keys(q_pos, causal, window, first, end);
  return first <= k_pos && k_pos < end;
}

// q [b, heads, n, d]; k_context, v_context [b, kv, C, d]; k_block, v_block [b, kv, n, d];
// context_lengths [b]; writes out [b, heads, n, d].
inline void block_attention_ref(const BlockAttentionShape& s, const float* q, const float* k_context,
                                const float* v_context, const float* k_block, const float* v_block,
                                const int64_t* context_lengths, float scale, bool causal, int64_t window,
                                float* out) {
  const int64_t d = s.head_dim, groups = s.heads / s.kv_heads;
  std::vector<float> scores(s.context + s.block);
  for (int64_t b = 0; b < s.batch; ++b) {
    const int64_t length = std::min(context_lengths[b], s.context);
    for (int64_t h = 0; h < s.heads; ++h) {
      const int64_t g = h / groups;  // grouped-query attention: query head h reads kv head h / groups
      const float* kc = k_context + (b * s.kv_heads + g) * s.context * d;
      const float* vc = v_context + (b * s.kv_heads + g) * s.context * d;
      const float* kb = k_block + (b * s.kv_heads + g) * s.block * d;
      const float* vb = v_block + (b * s.kv_heads + g) * s.block * d;
      for (int64_t i = 0; i < s.block; ++i) {
        const float* qi = q + ((b * s.heads + h) * s.block + i) * d;
        const int64_t q_pos = length + i;
        float best = -std::numeric_limits<float>::infinity();
        // Keys in position order: context slots 0..length-1, then the block at length..length+n-1,
        // so a key's index is its position.
        const int64_t keys = length + s.block;
        for (int64_t key = 0; key < keys; ++key) {
          const bool in_context = key < length;
          if (!key_visible(q_pos, key, causal, window)) {
            scores[key] = -std::numeric_limits<float>::infinity();
            continue;
          }
          const float* kk = in_context ? kc + key * d : kb + (key - length) * d;
          float dot = 0.f;
          for (int64_t j = 0; j < d; ++j) dot += qi[j] * kk[j];
          scores[key] = dot * scale;
          best = std::max(best, scores[key]);
        }
        float* o = out + ((b * s.heads + h) * s.block + i) * d;
        std::fill(o, o + d, 0.f);
        if (best == -std::numeric_limits<float>::infinity()) continue;  // nothing visible: zeros
        float total = 0.f;
        for (int64_t key = 0; key < keys; ++key) {
          if (scores[key] == -std::numeric_limits<float>::infinity()) continue;
          const float weight = std::exp(scores[key] - best);
          total += weight;
          const float* vv = key < length ? vc + key * d : vb + (key - length) * d;
          for (int64_t j = 0; j < d; ++j) o[j] += weight * vv[j];
        }
        for (int64_t j = 0; j < d; ++j) o[j] /= total;
      }
    }
  }
}

}  // namespace dflash

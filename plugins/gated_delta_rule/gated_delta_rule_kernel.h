// dflash::GatedDeltaRule v1 on CUDA: launch function over raw device pointers (no TensorRT types).
// Contract: plugins/gated_delta_rule/README.md; CPU twin and parity oracle: gated_delta_rule_ref.h.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "common/dtype.h"
#include "gated_delta_rule/gated_delta_rule_ref.h"

namespace dflash {

constexpr int64_t kGatedDeltaRuleMaxKeyDim = 256;

// nullptr if the kernel can run shape `s` keeping the states from `states_from` on, else the
// reason (one line).
inline const char* gated_delta_rule_unsupported(const GatedDeltaRuleShape& s, int64_t states_from) {
  if (s.batch < 0 || s.tokens < 1) return "batch must be >= 0 and tokens >= 1";
  if (states_from < 0 || states_from >= s.tokens) return "states_from must be in [0, tokens - 1]";
  if (s.key_heads < 1 || s.value_heads % s.key_heads != 0) return "value_heads must be a multiple of key_heads >= 1";
  if (s.key_dim < 1 || s.key_dim > kGatedDeltaRuleMaxKeyDim) return "key_dim must be in [1, 256]";
  if (s.value_dim < 1) return "value_dim must be >= 1";
  if (s.batch * s.value_heads > INT32_MAX) return "batch x value_heads must be < 2^31 (CUDA grid x)";
  if ((s.value_dim + 31) / 32 > 65535) return "value_dim must be <= 65535 * 32 (CUDA grid y)";
  return nullptr;
}

// query, key [b, s, Hk, Dk], value [b, s, Hv, Dv] and beta [b, s, Hv] of `dtype`; g [b, s, Hv] and
// initial_state [b, Hv, Dk, Dv] float32; states_from a host value in [0, s - 1] (TensorRT hands it
// to the plugin as a shape input). Writes out [b, s, Hv, Dv] of `dtype` and states
// [b, s - states_from, Hv, Dk, Dv] float32. Arithmetic is float32. Asynchronous on `stream`.
cudaError_t gated_delta_rule_launch(const GatedDeltaRuleShape& s, DType dtype, const void* query, const void* key,
                                    const void* value, const float* g, const void* beta, const float* initial_state,
                                    int64_t states_from, void* out, float* states, cudaStream_t stream);

}  // namespace dflash

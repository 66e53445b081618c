// C entry points of the dflash CUDA kernels over raw device pointers, for callers that are not TensorRT:
// the torch backend registers them as the CUDA implementations of its dflash:: custom ops
// (dflash_trt/runtime/cuda_ops.py), so the kernels TensorRT runs as plugins also run inside decoding:
// InjectKV and BlockAttention in the draft graphs, GatedDeltaRule in a hybrid target's, MoE in a sparse
// target's.
// Each returns nullptr on success, else one line saying why (a shape the kernel refuses, a CUDA error);
// the launches are asynchronous on `stream` (a CUstream / cudaStream_t).
#include <cuda_runtime_api.h>

#include "block_attention/block_attention_kernel.h"
#include "gated_delta_rule/gated_delta_rule_kernel.h"
#include "inject_kv/inject_kv_kernel.h"
#include "moe/moe_kernel.h"

#define DFLASH_EXPORT extern "C" __attribute__((visibility("default")))

namespace {

const char* launched(cudaError_t status) { return status == cudaSuccess ? nullptr : cudaGetErrorString(status); }

bool known(int32_t dtype) { return dtype >= 0 && dtype <= 2; }

}  // namespace

DFLASH_EXPORT size_t dflash_block_attention_workspace(int64_t batch, int64_t heads, int64_t kv_heads, int64_t block,
                                                      int64_t context, int64_t head_dim) {
  return dflash::block_attention_workspace_size({batch, heads, kv_heads, block, context, head_dim});
}

// q [b, heads, n, d]; k_context, v_context [b, kv, C, d]; k_block, v_block [b, kv, n, d]; context_lengths [b]
// int64; out [b, heads, n, d]; dtype 0 float32, 1 float16, 2 bfloat16 (plugins/block_attention/README.md).
DFLASH_EXPORT const char* dflash_block_attention(int64_t batch, int64_t heads, int64_t kv_heads, int64_t block,
                                                 int64_t context, int64_t head_dim, int32_t dtype, const void* q,
                                                 const void* k_context, const void* v_context, const void* k_block,
                                                 const void* v_block, const int64_t* context_lengths, float scale,
                                                 int32_t causal, int64_t window, void* workspace, void* out,
                                                 void* stream) {
  const dflash::BlockAttentionShape shape{batch, heads, kv_heads, block, context, head_dim};
  if (!known(dtype)) return "dtype must be 0 (float32), 1 (float16) or 2 (bfloat16)";
  if (const char* why = dflash::block_attention_unsupported(shape)) return why;
  return launched(dflash::block_attention_launch(shape, dflash::DType(dtype), q, k_context, v_context, k_block,
                                                 v_block, context_lengths, scale, causal != 0, window, workspace,
                                                 out, static_cast<cudaStream_t>(stream)));
}

DFLASH_EXPORT size_t dflash_inject_kv_workspace(int64_t batch, int64_t tokens, int64_t hidden, int64_t kv_heads,
                                                int64_t head_dim) {
  return dflash::inject_kv_workspace_size({batch, tokens, hidden, kv_heads, head_dim});
}

// hidden [b, n, H]; k_weight, v_weight [kv*d, H]; k_norm [d]; cos, sin [b, n, d]; k_out, v_out [b, kv, n, d]
// (plugins/inject_kv/README.md).
DFLASH_EXPORT const char* dflash_inject_kv(int64_t batch, int64_t tokens, int64_t hidden, int64_t kv_heads,
                                           int64_t head_dim, int32_t dtype, const void* hidden_states,
                                           const void* k_weight, const void* v_weight, const void* k_norm,
                                           const void* cos, const void* sin, float epsilon, void* workspace,
                                           void* k_out, void* v_out, void* stream) {
  const dflash::InjectKVShape shape{batch, tokens, hidden, kv_heads, head_dim};
  if (!known(dtype)) return "dtype must be 0 (float32), 1 (float16) or 2 (bfloat16)";
  if (const char* why = dflash::inject_kv_unsupported(shape)) return why;
  return launched(dflash::inject_kv_launch(shape, dflash::DType(dtype), hidden_states, k_weight, v_weight, k_norm,
                                           cos, sin, epsilon, workspace, k_out, v_out,
                                           static_cast<cudaStream_t>(stream)));
}

// query, key [b, s, Hk, Dk], value [b, s, Hv, Dv], beta [b, s, Hv] of `dtype`; g [b, s, Hv] and
// initial_state [b, Hv, Dk, Dv] float32; out [b, s, Hv, Dv] of `dtype`, states [b, s - states_from, Hv, Dk,
// Dv] float32 (plugins/gated_delta_rule/README.md).
DFLASH_EXPORT const char* dflash_gated_delta_rule(int64_t batch, int64_t tokens, int64_t key_heads,
                                                  int64_t value_heads, int64_t key_dim, int64_t value_dim,
                                                  int32_t dtype, const void* query, const void* key,
                                                  const void* value, const float* g, const void* beta,
                                                  const float* initial_state, int64_t states_from, void* out,
                                                  float* states, void* stream) {
  const dflash::GatedDeltaRuleShape shape{batch, tokens, key_heads, value_heads, key_dim, value_dim};
  if (!known(dtype)) return "dtype must be 0 (float32), 1 (float16) or 2 (bfloat16)";
  if (const char* why = dflash::gated_delta_rule_unsupported(shape, states_from)) return why;
  return launched(dflash::gated_delta_rule_launch(shape, dflash::DType(dtype), query, key, value, g, beta,
                                                  initial_state, states_from, out, states,
                                                  static_cast<cudaStream_t>(stream)));
}

DFLASH_EXPORT size_t dflash_moe_workspace(int64_t tokens, int64_t hidden, int64_t experts, int64_t inter,
                                          int64_t top_k) {
  return dflash::moe_workspace_size({tokens, hidden, experts, inter, top_k});
}

// hidden [T, H]; router_logits [T, E]; gate_up [E, 2I, H]; down [E, H, I]; out [T, H], all of `dtype`;
// normalize 0 or 1 (plugins/moe/README.md).
DFLASH_EXPORT const char* dflash_moe(int64_t tokens, int64_t hidden, int64_t experts, int64_t inter, int64_t top_k,
                                     int32_t normalize, int32_t dtype, const void* hidden_states,
                                     const void* router_logits, const void* gate_up, const void* down,
                                     void* workspace, void* out, void* stream) {
  const dflash::MoEShape shape{tokens, hidden, experts, inter, top_k};
  if (!known(dtype)) return "dtype must be 0 (float32), 1 (float16) or 2 (bfloat16)";
  if (normalize != 0 && normalize != 1) return "normalize must be 0 or 1";
  if (const char* why = dflash::moe_unsupported(shape)) return why;
  return launched(dflash::moe_launch(shape, dflash::DType(dtype), normalize != 0, hidden_states, router_logits,
                                     gate_up, down, workspace, out, static_cast<cudaStream_t>(stream)));
}

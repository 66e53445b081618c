// dflash::InjectKV v1 on CUDA: launch function over raw device pointers (no TensorRT types).
// Contract and math: plugins/inject_kv/README.md; CPU twin and parity oracle: inject_kv_ref.h.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "common/dtype.h"
#include "inject_kv/inject_kv_ref.h"

namespace dflash {

// Register arrays in the norm/RoPE kernel hold head_dim / 64 rotate-half pairs per lane.
constexpr int64_t kInjectKVMaxHeadDim = 256;
// Up to this many rows (b x n) the projection streams the weights GEMV-style (16-byte loads); more
// rows take the tiled GEMM, which reuses each weight tile across 32 rows.
constexpr int64_t kInjectKVSkinnyMaxRows = 128;

// How one call is cut into launches. The projection is a split-K GEMM into float32 scratch: rows
// are few on the hot path (b x accepted tokens, b x block) while the weights are large, so K is
// split until about kTargetBlocks thread blocks stream the weights. Rows go kRowsPerLaunch at a
// time so the scratch stays bounded however long a prefill is.
struct InjectKVPlan {
  static constexpr int64_t kTile = 32;  // rows, columns and K depth of one block's tile
  static constexpr int64_t kRowsPerLaunch = 1024;
  static constexpr int64_t kTargetBlocks = 1024;  // ~8 resident blocks per SM on a 132-SM H100
  static constexpr int64_t kMaxSplits = 16;
  int64_t rows_per_launch, splits, k_per_split;
};

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

inline InjectKVPlan inject_kv_plan(const InjectKVShape& s) {
  using P = InjectKVPlan;
  const int64_t rows = std::max<int64_t>(1, std::min(s.batch * s.tokens, P::kRowsPerLaunch));
  const int64_t blocks = ceil_div(2 * s.kv_heads * s.head_dim, P::kTile) * ceil_div(rows, P::kTile);
  const int64_t k_tiles = ceil_div(s.hidden, P::kTile);
  // splits x rows never exceeds kRowsPerLaunch: that is what bounds the scratch below.
  const int64_t most = std::min({P::kMaxSplits, k_tiles, P::kRowsPerLaunch / rows});
  const int64_t splits = std::max<int64_t>(1, std::min(P::kTargetBlocks / std::max<int64_t>(1, blocks), most));
  return {rows, splits, ceil_div(k_tiles, splits) * P::kTile};
}

// Scratch bytes for shape `s`: an upper bound on what inject_kv_plan uses, monotone in every dim,
// so the size TensorRT reserves for a profile's largest shape covers every shape it admits.
inline size_t inject_kv_workspace_size(const InjectKVShape& s) {
  const int64_t rows = std::min(InjectKVPlan::kRowsPerLaunch, InjectKVPlan::kMaxSplits * s.batch * s.tokens);
  return static_cast<size_t>(std::max<int64_t>(0, rows * 2 * s.kv_heads * s.head_dim)) * sizeof(float);
}

// nullptr if the kernels can run shape `s`, else the reason (one line).
inline const char* inject_kv_unsupported(const InjectKVShape& s) {
  if (s.batch < 0 || s.tokens < 0) return "batch and tokens must be >= 0";
  if (s.hidden < 1 || s.kv_heads < 1) return "hidden size and num_kv_heads must be >= 1";
  if (s.head_dim < 2 || s.head_dim % 2 != 0 || s.head_dim > kInjectKVMaxHeadDim)
    return "head_dim must be even and in [2, 256] (rotate-half RoPE; the CUDA kernel's register budget)";
  return nullptr;
}

// hidden [b, n, H]; k_weight, v_weight [kv*d, H]; k_norm [d]; cos, sin [b, n, d], all of `dtype`;
// workspace: inject_kv_workspace_size(s) bytes. Writes k_out, v_out [b, kv, n, d] of `dtype`.
// Accumulates in float32 and rounds once, on the final store. Asynchronous on `stream`.
cudaError_t inject_kv_launch(const InjectKVShape& s, DType dtype, const void* hidden, const void* k_weight,
                             const void* v_weight, const void* k_norm, const void* cos, const void* sin, float epsilon,
                             void* workspace, void* k_out, void* v_out, cudaStream_t stream);

}  // namespace dflash

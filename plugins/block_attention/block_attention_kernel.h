// dflash::BlockAttention v1 on CUDA: launch function over raw device pointers (no TensorRT types).
// Contract: plugins/block_attention/README.md; CPU twin and parity oracle: block_attention_ref.h.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "block_attention/block_attention_ref.h"
#include "common/dtype.h"

namespace dflash {

constexpr int64_t kBlockAttentionMaxHeadDim = 256;

// How one call is cut into thread blocks. A block holds `tile_rows` query rows of one (batch row,
// kv head) -- all query heads of a GQA group share that kv head, so its K/V tiles are loaded once
// for all of them -- and walks one split of the keys. Keys are split (flash-decoding) until about
// kTargetBlocks blocks run: with a batch of 1 and 8 kv heads there would otherwise be only a few
// dozen blocks streaming a long context. More than one split adds a combine pass over float32
// partial results in the workspace.
//
// Two kernels: with `mma` (16-bit dtypes, head_dim 128) a block of 4 warps multiplies on tensor
// cores, 2 blocks per SM (85 KiB of shared memory each), and holds 64 rows, or, when a GQA group has
// at most 16 (`key_split`: a decode step's few queries a row), one tile of 16 rows whose keys its 4
// warps split; otherwise 16 rows (8 for wide heads) on CUDA cores in float32, about 8 blocks per SM.
// Either way splits x blocks x rows per block stays within kMaxPartialRows, which bounds the workspace.
struct BlockAttentionPlan {
  static constexpr int64_t kTargetBlocks = 1024;     // CUDA cores: ~8 resident blocks per SM on 132 SMs
  static constexpr int64_t kMmaTargetBlocks = 256;   // tensor cores: ~2 resident blocks per SM
  static constexpr int64_t kMinKeysPerSplit = 128;
  static constexpr int64_t kMaxSplits = 64;
  static constexpr int64_t kMaxTileRows = 16;
  static constexpr int64_t kMmaTileRows = 64;
  static constexpr int64_t kMmaKeySplitRows = 16;
  static constexpr int64_t kMaxPartialRows = kTargetBlocks * kMaxTileRows;
  static_assert(kMmaTargetBlocks * kMmaTileRows == kMaxPartialRows, "both plans fit one workspace bound");
  int64_t tile_rows, query_tiles, splits;
  bool mma, key_split;
};

// The tensor-core kernel's shapes: 16-bit storage and head_dim 128 (every Qwen3 drafter's).
inline bool block_attention_mma_fits(const BlockAttentionShape& s, DType dtype) {
  return dtype != DType::kFloat32 && s.head_dim == 128;
}

// Wide heads get fewer rows per block so that the block's tiles fit in 48 KiB of shared memory.
inline int64_t block_attention_tile_rows(int64_t head_dim) { return head_dim <= 128 ? 16 : 8; }

inline BlockAttentionPlan block_attention_plan(const BlockAttentionShape& s, bool mma) {
  using P = BlockAttentionPlan;
  const int64_t group_rows = s.heads / std::max<int64_t>(1, s.kv_heads) * s.block;
  const bool key_split = mma && group_rows <= P::kMmaKeySplitRows;
  const int64_t tile_rows = key_split ? P::kMmaKeySplitRows
                            : mma     ? P::kMmaTileRows
                                      : block_attention_tile_rows(s.head_dim);
  const int64_t query_tiles = std::max<int64_t>(1, (group_rows + tile_rows - 1) / tile_rows);
  const int64_t blocks = std::max<int64_t>(1, s.batch * s.kv_heads * query_tiles);
  const int64_t by_keys = (s.context + s.block + P::kMinKeysPerSplit - 1) / P::kMinKeysPerSplit;
  const int64_t target = mma ? P::kMmaTargetBlocks : P::kTargetBlocks;
  const int64_t splits = std::clamp<int64_t>(std::min(target / blocks, by_keys), 1, P::kMaxSplits);
  return {tile_rows, query_tiles, splits, mma, key_split};
}

// Workspace bytes for shape `s`: an upper bound on the partial results of block_attention_plan
// (splits x rows x (head_dim + 2) floats), monotone in every dim, so the size TensorRT reserves
// for a profile's largest shape covers every shape it admits. Either plan keeps splits <= kMaxSplits
// and splits x blocks x rows per block <= kMaxPartialRows.
inline size_t block_attention_workspace_size(const BlockAttentionShape& s) {
  using P = BlockAttentionPlan;
  const int64_t rows = s.batch * s.heads * s.block;
  const int64_t bound = std::min(P::kMaxSplits * rows, P::kMaxPartialRows);
  return static_cast<size_t>(std::max<int64_t>(0, bound * (s.head_dim + 2))) * sizeof(float);
}

// nullptr if the kernels can run shape `s`, else the reason (one line).
inline const char* block_attention_unsupported(const BlockAttentionShape& s) {
  if (s.batch < 0 || s.block < 0 || s.context < 0) return "batch, block and context must be >= 0";
  if (s.kv_heads < 1 || s.heads < 1 || s.heads % s.kv_heads != 0) return "heads must be a multiple of kv_heads >= 1";
  if (s.head_dim < 1 || s.head_dim > kBlockAttentionMaxHeadDim) return "head_dim must be in [1, 256]";
  if (s.batch * s.kv_heads > 65535) return "batch x kv_heads must be <= 65535 (CUDA grid y)";
  return nullptr;
}

// q [b, heads, n, d]; k_context, v_context [b, kv, C, d]; k_block, v_block [b, kv, n, d], all of
// `dtype`; context_lengths [b] int64 (clamped to [0, C]); workspace: block_attention_workspace_size(s)
// bytes. Writes out [b, heads, n, d] of `dtype`; a query that sees no key gets zeros. Scores, softmax
// and the weighted sum are float32. Asynchronous on `stream`.
cudaError_t block_attention_launch(const BlockAttentionShape& s, DType dtype, const void* q, const void* k_context,
                                   const void* v_context, const void* k_block, const void* v_block,
                                   const int64_t* context_lengths, float scale, bool causal, int64_t window,
                                   void* workspace, void* out, cudaStream_t stream);

}  // namespace dflash

// dflash::MoE v1 on CUDA: launch function over raw device pointers (no TensorRT types).
// Contract: plugins/moe/README.md; CPU twin and parity oracle: moe_ref.h.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "common/dtype.h"
#include "moe/moe_ref.h"

namespace dflash {

// One warp routes a token holding 16 of its logits a lane; a lane holds one pick.
constexpr int64_t kMoEMaxExperts = 512;
constexpr int64_t kMoEMaxTopK = 32;
// A call runs as launches of at most this many tokens, so the scratch stays bounded however long a
// prefill is (each launch reads its picked experts once).
constexpr int64_t kMoETokensPerLaunch = 512;

// Where one launch's scratch lives, for `tokens` <= kMoETokensPerLaunch tokens: offsets in bytes
// from the workspace, each 256-byte aligned. A pair is (token, slot), p = token * top_k + slot.
struct MoEScratch {
  static constexpr size_t kAlign = 256;
  size_t ids, weights, counts, picked, lists, act, partial, total;
};

inline MoEScratch moe_scratch(const MoEShape& s) {
  const auto tokens = static_cast<size_t>(std::clamp<int64_t>(s.tokens, 0, kMoETokensPerLaunch));
  const auto pairs = tokens * static_cast<size_t>(std::max<int64_t>(0, s.top_k));
  const auto experts = static_cast<size_t>(std::max<int64_t>(0, s.experts));
  constexpr size_t kAlign = MoEScratch::kAlign;
  const auto up = [](size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; };
  MoEScratch w{};
  size_t at = 0;
  w.ids = at, at += up(pairs * sizeof(int32_t));              // [pairs] the pair's expert; -1: none (NaN logits)
  w.weights = at, at += up(pairs * sizeof(float));            // [pairs] its routing weight
  w.counts = at, at += up(experts * sizeof(int32_t));         // [E] pairs routed to each expert
  w.picked = at, at += up((experts + 1) * sizeof(int32_t));   // [E] experts with pairs, ascending; then how many
  w.lists = at, at += up(experts * tokens * sizeof(int32_t)); // [E, tokens] each expert's pairs, in token order
  // [pairs, I] silu(gate) * up, rounded to T: sized for float32, the widest T
  w.act = at, at += up(pairs * static_cast<size_t>(std::max<int64_t>(0, s.inter)) * sizeof(float));
  w.partial = at, at += up(pairs * static_cast<size_t>(std::max<int64_t>(0, s.hidden)) * sizeof(float));  // [pairs, H]
  w.total = at;
  return w;
}

// Scratch bytes for shape `s`, monotone in every dim, so the size TensorRT reserves for a profile's
// largest shape covers every shape it admits.
inline size_t moe_workspace_size(const MoEShape& s) { return moe_scratch(s).total; }

// nullptr if the kernels can run shape `s`, else the reason (one line).
inline const char* moe_unsupported(const MoEShape& s) {
  if (s.tokens < 0) return "tokens must be >= 0";
  if (s.hidden < 1 || s.inter < 1) return "hidden and inter (the experts' width) must be >= 1";
  if (s.experts < 1 || s.experts > kMoEMaxExperts)
    return "experts must be in [1, 512] (the CUDA kernel routes a token with one warp)";
  if (s.top_k < 1 || s.top_k > s.experts) return "top_k must be in [1, experts]";
  if (s.top_k > kMoEMaxTopK) return "top_k must be <= 32 (the CUDA kernel holds a pick a lane)";
  if (s.hidden > (int64_t{1} << 30) || s.inter > (int64_t{1} << 30))
    return "hidden and inter must be <= 2^30 (CUDA grid x)";
  return nullptr;
}

// hidden [tokens, H]; router_logits [tokens, E]; gate_up [E, 2I, H] (each expert's gate rows, then
// its up rows); down [E, H, I], all of `dtype`; workspace: moe_workspace_size(s) bytes (16-byte
// aligned, or the activations are read one element a load). Writes out [tokens, H] of `dtype`.
// Routes each token as moe_route_token does and reads only the experts the tokens picked, each in one
// pass per 16 of its (token, slot) pairs on tensor cores (16-bit dtypes, H and I multiples of 8,
// 16-byte aligned), else per 4; not one per token; accumulates in float32, rounds the
// activations to `dtype` before the down projection and `out` once, on the store. A token's output
// does not depend on the other tokens of the call. No host sync: capturable in a CUDA graph.
// Asynchronous on `stream`.
cudaError_t moe_launch(const MoEShape& s, DType dtype, bool normalize, const void* hidden, const void* router_logits,
                       const void* gate_up, const void* down, void* workspace, void* out, cudaStream_t stream);

}  // namespace dflash

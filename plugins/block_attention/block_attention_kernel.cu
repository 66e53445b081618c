// dflash::BlockAttention v1 CUDA kernels: flash-attention style (key tiles in shared memory, online
// softmax with a running max and sum per query row), split over keys when there are few blocks,
// plus the pass that combines the splits.
#include "block_attention/block_attention_kernel.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>

#include "common/convert.cuh"

namespace dflash {
namespace {

constexpr int kWarps = 4;
constexpr unsigned kFullMask = 0xffffffffu;

struct Args {
  int64_t heads, kv_heads, block, context, head_dim, groups, total_rows, splits;
  float scale;
  bool causal;
  int64_t window;
};

// Template: DCH = head dims per lane (head_dim padded to 32 * DCH), KT = keys per tile, RPW = query
// rows per warp. Lanes own dims for the output accumulator; for the scores a lane owns a key (and,
// when KT < 32, a slice of the dims, summed across the 32 / KT lanes sharing that key).
template <typename T, int DCH, int KT, int RPW>
__global__ void __launch_bounds__(kWarps * 32)
    attention_kernel(Args a, const T* q, const T* k_context, const T* v_context, const T* k_block, const T* v_block,
                     const int64_t* context_lengths, float* partial, T* out) {
  constexpr int D = 32 * DCH, ROWS = kWarps * RPW, LANES_PER_KEY = 32 / KT;
  constexpr float kNegInf = -INFINITY;
  __shared__ float q_s[ROWS][D];
  __shared__ float k_s[KT][D + 1];  // +1: lanes reading one dim of different keys hit different banks
  __shared__ float v_s[KT][D];

  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t b = blockIdx.y / a.kv_heads, g = blockIdx.y % a.kv_heads, split = blockIdx.z;
  const int64_t n = a.block, d = a.head_dim, group_rows = a.groups * n, row0 = blockIdx.x * ROWS;
  const int64_t length = min(max(context_lengths[b], int64_t{0}), a.context);
  const int64_t keys = length + n;  // key index == position: context slots, then the block

  // Row r of the group is query head g * groups + r / n, block slot r % n (position length + r % n).
  for (int e = threadIdx.x; e < ROWS * D; e += blockDim.x) {
    const int r = e / D, j = e % D;
    const int64_t row = row0 + r;
    float x = 0.f;
    if (row < group_rows && j < d) x = load(q + ((b * a.heads + g * a.groups + row / n) * n + row % n) * d + j);
    q_s[r][j] = x;
  }

  // Keys any row of this block may see, intersected with this block's split of [0, keys).
  int64_t i_min = n, i_max = -1;
  for (int r = 0; r < ROWS; ++r) {
    if (row0 + r < group_rows) {
      i_min = min(i_min, (row0 + r) % n);
      i_max = max(i_max, (row0 + r) % n);
    }
  }
  int64_t lo = 0, hi = keys;
  if (a.causal) hi = min(hi, length + i_max + 1);
  if (a.window > 0) {
    lo = max(lo, length + i_min - a.window + 1);
    if (!a.causal) hi = min(hi, length + i_max + a.window);
  }
  const int64_t chunk = (keys + a.splits * KT - 1) / (a.splits * KT) * KT;
  lo = max(lo, split * chunk);
  hi = min(hi, (split + 1) * chunk);

  float m[RPW], l[RPW], o[RPW][DCH];
  int64_t q_pos[RPW];
  bool row_ok[RPW];
#pragma unroll
  for (int r = 0; r < RPW; ++r) {
    const int64_t row = row0 + warp * RPW + r;
    row_ok[r] = row < group_rows;
    q_pos[r] = length + row % n;
    m[r] = kNegInf;
    l[r] = 0.f;
#pragma unroll
    for (int c = 0; c < DCH; ++c) o[r][c] = 0.f;
  }

  const int key = lane % KT, slice = lane / KT;
  for (int64_t t0 = lo; t0 < hi; t0 += KT) {
    __syncthreads();  // the previous tile is consumed (first pass: q_s is staged)
    for (int e = threadIdx.x; e < KT * D; e += blockDim.x) {
      const int kk = e / D, j = e % D;
      const int64_t pos = t0 + kk;
      float kx = 0.f, vx = 0.f;
      if (pos < hi && j < d) {
        const int64_t at = pos < length ? ((b * a.kv_heads + g) * a.context + pos) * d + j
                                        : ((b * a.kv_heads + g) * n + pos - length) * d + j;
        kx = load((pos < length ? k_context : k_block) + at);
        vx = load((pos < length ? v_context : v_block) + at);
      }
      k_s[kk][j] = kx;
      v_s[kk][j] = vx;
    }
    __syncthreads();

    const int64_t pos = t0 + key;
#pragma unroll
    for (int r = 0; r < RPW; ++r) {
      const float* qr = q_s[warp * RPW + r];
      float dot = 0.f;
#pragma unroll 8
      for (int j = slice; j < D; j += LANES_PER_KEY) dot += qr[j] * k_s[key][j];
      for (int offset = KT; offset < 32; offset *= 2) dot += __shfl_xor_sync(kFullMask, dot, offset);
      const bool visible = row_ok[r] && pos < hi && key_visible(q_pos[r], pos, a.causal, a.window);
      const float score = visible ? dot * a.scale : kNegInf;
      // Lanes holding the same key hold the same score, so reducing within KT lanes covers the tile.
      float tile_max = score;
      for (int offset = KT / 2; offset > 0; offset /= 2)
        tile_max = fmaxf(tile_max, __shfl_xor_sync(kFullMask, tile_max, offset));
      const float m_new = fmaxf(m[r], tile_max);
      if (m_new == kNegInf) continue;          // nothing visible to this row yet (uniform across the warp)
      const float alpha = expf(m[r] - m_new);  // 0 while m[r] is still -inf
      const float p = visible ? expf(score - m_new) : 0.f;
      float p_sum = p;
      for (int offset = KT / 2; offset > 0; offset /= 2) p_sum += __shfl_xor_sync(kFullMask, p_sum, offset);
      m[r] = m_new;
      l[r] = l[r] * alpha + p_sum;
#pragma unroll
      for (int c = 0; c < DCH; ++c) o[r][c] *= alpha;
      for (int kk = 0; kk < KT; ++kk) {
        const float pk = __shfl_sync(kFullMask, p, kk);
#pragma unroll
        for (int c = 0; c < DCH; ++c) o[r][c] += pk * v_s[kk][lane + 32 * c];
      }
    }
  }

  // One split: the normalised output. Several: this split's unnormalised sum, max and total, laid
  // out as [splits][rows][d] sums, then [splits][rows][2] (max, total).
#pragma unroll
  for (int r = 0; r < RPW; ++r) {
    if (!row_ok[r]) continue;
    const int64_t row = row0 + warp * RPW + r;
    const int64_t out_row = (b * a.heads + g * a.groups + row / n) * n + row % n;
    if (a.splits == 1) {
      const float inv = l[r] > 0.f ? 1.f / l[r] : 0.f;  // no visible key: zeros
#pragma unroll
      for (int c = 0; c < DCH; ++c)
        if (lane + 32 * c < d) out[out_row * d + lane + 32 * c] = from_float<T>(o[r][c] * inv);
      continue;
    }
    const int64_t at = split * a.total_rows + out_row;
#pragma unroll
    for (int c = 0; c < DCH; ++c)
      if (lane + 32 * c < d) partial[at * d + lane + 32 * c] = o[r][c];
    if (lane == 0) {
      float* ml = partial + a.splits * a.total_rows * d + at * 2;
      ml[0] = m[r];
      ml[1] = l[r];
    }
  }
}

// One warp per output row: rescale each split's sum to the common max and normalise by the total.
template <typename T>
__global__ void __launch_bounds__(128) combine_kernel(Args a, const float* partial, T* out) {
  const int lane = threadIdx.x % 32;
  const int64_t row = blockIdx.x * 4 + threadIdx.x / 32;
  if (row >= a.total_rows) return;
  const int64_t d = a.head_dim;
  const float* ml = partial + a.splits * a.total_rows * d;
  float best = -INFINITY;
  for (int64_t s = 0; s < a.splits; ++s) best = fmaxf(best, ml[(s * a.total_rows + row) * 2]);
  float total = 0.f;
  if (best != -INFINITY) {
    for (int64_t s = 0; s < a.splits; ++s)
      total += expf(ml[(s * a.total_rows + row) * 2] - best) * ml[(s * a.total_rows + row) * 2 + 1];
  }
  const float inv = total > 0.f ? 1.f / total : 0.f;
  for (int64_t j = lane; j < d; j += 32) {
    float acc = 0.f;
    if (inv > 0.f) {
      for (int64_t s = 0; s < a.splits; ++s)
        acc += expf(ml[(s * a.total_rows + row) * 2] - best) * partial[(s * a.total_rows + row) * d + j];
    }
    out[row * d + j] = from_float<T>(acc * inv);
  }
}

template <typename T, int DCH, int KT, int RPW>
cudaError_t launch_config(const BlockAttentionShape& s, const BlockAttentionPlan& plan, const Args& a, const void* q,
                          const void* kc, const void* vc, const void* kb, const void* vb, const int64_t* lengths,
                          void* workspace, void* out, cudaStream_t stream) {
  if (plan.tile_rows != kWarps * RPW) return cudaErrorInvalidConfiguration;  // header and kernel disagree
  const dim3 grid(static_cast<unsigned>(plan.query_tiles), static_cast<unsigned>(s.batch * s.kv_heads),
                  static_cast<unsigned>(plan.splits));
  attention_kernel<T, DCH, KT, RPW><<<grid, kWarps * 32, 0, stream>>>(
      a, static_cast<const T*>(q), static_cast<const T*>(kc), static_cast<const T*>(vc), static_cast<const T*>(kb),
      static_cast<const T*>(vb), lengths, static_cast<float*>(workspace), static_cast<T*>(out));
  if (plan.splits > 1) {
    const auto blocks = static_cast<unsigned>((a.total_rows + 3) / 4);
    combine_kernel<T><<<blocks, 128, 0, stream>>>(a, static_cast<const float*>(workspace), static_cast<T*>(out));
  }
  return cudaGetLastError();
}

template <typename T>
cudaError_t launch_typed(const BlockAttentionShape& s, const BlockAttentionPlan& plan, const Args& a, const void* q,
                         const void* kc, const void* vc, const void* kb, const void* vb, const int64_t* lengths,
                         void* workspace, void* out, cudaStream_t stream) {
  if (s.head_dim <= 64)
    return launch_config<T, 2, 32, 4>(s, plan, a, q, kc, vc, kb, vb, lengths, workspace, out, stream);
  if (s.head_dim <= 128)
    return launch_config<T, 4, 32, 4>(s, plan, a, q, kc, vc, kb, vb, lengths, workspace, out, stream);
  return launch_config<T, 8, 16, 2>(s, plan, a, q, kc, vc, kb, vb, lengths, workspace, out, stream);
}

}  // namespace

cudaError_t block_attention_launch(const BlockAttentionShape& s, DType dtype, const void* q, const void* k_context,
                                   const void* v_context, const void* k_block, const void* v_block,
                                   const int64_t* context_lengths, float scale, bool causal, int64_t window,
                                   void* workspace, void* out, cudaStream_t stream) {
  if (block_attention_unsupported(s) != nullptr) return cudaErrorInvalidValue;
  if (s.batch * s.block == 0) return cudaSuccess;
  const BlockAttentionPlan plan = block_attention_plan(s);
  const Args a{
      s.heads,     s.kv_heads, s.block, s.context, s.head_dim, s.heads / s.kv_heads, s.batch * s.heads * s.block,
      plan.splits, scale,      causal,  window};
  return dispatch_dtype(dtype, [&](auto tag) {
    return launch_typed<typename decltype(tag)::type>(s, plan, a, q, k_context, v_context, k_block, v_block,
                                                      context_lengths, workspace, out, stream);
  });
}

}  // namespace dflash

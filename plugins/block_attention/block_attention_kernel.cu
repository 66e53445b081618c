// dflash::BlockAttention v1 CUDA kernels: flash-attention style (key tiles in shared memory, online
// softmax with a running max and sum per query row), split over keys when there are few blocks,
// plus the pass that combines the splits. Two forms of the attention kernel: tensor-core mma for
// 16-bit dtypes at head_dim 128, float32 CUDA cores for everything else.
#include "block_attention/block_attention_kernel.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_pipeline.h>
#include <mma.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

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

// Keys [lo, hi) that any of a block's rows may see, intersected with the block's split of the
// `length` + n keys (splits cut in whole tiles of `tile` keys). The rows [row0, row0 + rows) hold
// block slots row % n: all n of them when the run is n long or wraps past n - 1 (a wider range only
// skips fewer keys; each score's mask decides).
__device__ __forceinline__ void block_key_range(const Args& a, int64_t length, int64_t row0, int64_t rows,
                                                int64_t split, int64_t tile, int64_t& lo, int64_t& hi) {
  const int64_t n = a.block, count = min(rows, a.groups * n - row0);
  const bool every_slot = count >= n || row0 % n + count > n;
  const int64_t i_min = every_slot ? 0 : row0 % n, i_max = every_slot ? n - 1 : (row0 + count - 1) % n;
  const int64_t keys = length + n;
  lo = 0;
  hi = keys;
  if (a.causal) hi = min(hi, length + i_max + 1);
  if (a.window > 0) {
    lo = max(lo, length + i_min - a.window + 1);
    if (!a.causal) hi = min(hi, length + i_max + a.window);
  }
  const int64_t chunk = (keys + a.splits * tile - 1) / (a.splits * tile) * tile;
  lo = max(lo, split * chunk);
  hi = min(hi, (split + 1) * chunk);
}

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

  // Row r of the group is query head g * groups + r / n, block slot r % n (position length + r % n).
  for (int e = threadIdx.x; e < ROWS * D; e += blockDim.x) {
    const int r = e / D, j = e % D;
    const int64_t row = row0 + r;
    float x = 0.f;
    if (row < group_rows && j < d) x = load(q + ((b * a.heads + g * a.groups + row / n) * n + row % n) * d + j);
    q_s[r][j] = x;
  }

  int64_t lo, hi;
  block_key_range(a, length, row0, ROWS, split, KT, lo, hi);

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

// Tensor-core form, head_dim 128, 16-bit T: a block of 4 warps holds 64 query rows (warp w rows
// 16w..16w+15) and walks its split in tiles of 64 keys. Per tile: S = Q K^T (wmma 16x16x16, float32
// accumulate) into shared memory; each warp's online-softmax update of its rows (2 lanes a row)
// writes P in T and rescales the float32 output rows, which then take O += P V on tensor cores.
// Shared memory rows are padded (+8 halves, +4 floats) against bank conflicts; every wmma tile
// pointer stays 32-byte aligned.
namespace mma_tile {
constexpr int D = 128, ROWS = 64, KEYS = 64;
constexpr int QK_LD = D + 8, S_LD = KEYS + 4, P_LD = KEYS + 8, O_LD = D + 4;
template <typename T>
constexpr size_t bytes() {
  return sizeof(T) * (ROWS * QK_LD + 2 * KEYS * QK_LD + ROWS * P_LD) + sizeof(float) * (ROWS * S_LD + ROWS * O_LD);
}
}  // namespace mma_tile

// Starts copying `rows` rows of D elements in 16-byte vectors; row r comes from src(r), or zeros if
// null. The copies are asynchronous, all of a thread's in flight at once (a load-then-store loop
// waits out one memory latency per vector): staged() waits for them.
template <typename T, typename Source>
__device__ __forceinline__ void stage_rows(T* dst, int ld, int rows, Source src) {
  constexpr int V = 16 / sizeof(T), PER_ROW = mma_tile::D / V;
  for (int e = threadIdx.x; e < rows * PER_ROW; e += blockDim.x) {
    const int r = e / PER_ROW, c = (e % PER_ROW) * V;
    const T* from = src(r);
    if (from != nullptr)
      __pipeline_memcpy_async(dst + r * ld + c, from + c, 16);
    else
      *reinterpret_cast<uint4*>(dst + r * ld + c) = make_uint4(0, 0, 0, 0);
  }
}

// Waits for this thread's stage_rows copies and then for the block's.
__device__ __forceinline__ void staged() {
  __pipeline_commit();
  __pipeline_wait_prior(0);
  __syncthreads();
}

using Accumulator = nvcuda::wmma::fragment<nvcuda::wmma::accumulator, 16, 16, 16, float>;

// acc += A B over `steps` 16-deep steps: A is 16 rows, row-major at `a` (leading dim a_ld), moving
// 16 columns a step; B is 16 columns in `BLayout` at `b` (leading dim b_ld), moving b_step a step.
template <typename BLayout, typename T>
__device__ __forceinline__ void mma_steps(Accumulator& acc, const T* a, int a_ld, const T* b, int b_ld, int b_step,
                                          int steps) {
  using namespace nvcuda;
  for (int k = 0; k < steps; ++k) {
    wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> a_frag;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, T, BLayout> b_frag;
    wmma::load_matrix_sync(a_frag, a + k * 16, a_ld);
    wmma::load_matrix_sync(b_frag, b + k * b_step, b_ld);
    wmma::mma_sync(acc, a_frag, b_frag, acc);
  }
}

template <typename T>
__global__ void __launch_bounds__(kWarps * 32)
    mma_attention_kernel(Args a, const T* q, const T* k_context, const T* v_context, const T* k_block,
                         const T* v_block, const int64_t* context_lengths, float* partial, T* out) {
  using namespace nvcuda;
  using namespace mma_tile;
  extern __shared__ __align__(128) unsigned char smem[];
  T* q_s = reinterpret_cast<T*>(smem);
  T* k_s = q_s + ROWS * QK_LD;
  T* v_s = k_s + KEYS * QK_LD;
  T* p_s = v_s + KEYS * QK_LD;
  float* s_s = reinterpret_cast<float*>(p_s + ROWS * P_LD);
  float* o_s = s_s + ROWS * S_LD;

  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t b = blockIdx.y / a.kv_heads, g = blockIdx.y % a.kv_heads, split = blockIdx.z;
  const int64_t n = a.block, group_rows = a.groups * n, row0 = blockIdx.x * ROWS;
  const int64_t length = min(max(context_lengths[b], int64_t{0}), a.context);

  stage_rows(q_s, QK_LD, ROWS, [&](int r) -> const T* {
    const int64_t row = row0 + r;
    return row < group_rows ? q + ((b * a.heads + g * a.groups + row / n) * n + row % n) * D : nullptr;
  });
  __pipeline_commit();  // Q's copies land with the first key tile's (staged() waits for both)
  for (int e = threadIdx.x; e < ROWS * O_LD; e += blockDim.x) o_s[e] = 0.f;

  int64_t lo, hi;
  block_key_range(a, length, row0, ROWS, split, KEYS, lo, hi);

  // Lanes 2i and 2i+1 own row 16 * warp + i of the softmax, each half of the tile's keys.
  const int my_row = warp * 16 + lane / 2, half = lane % 2;
  const int64_t row = row0 + my_row;
  const bool row_ok = row < group_rows;
  const int64_t q_pos = length + row % n;
  float m = -INFINITY, l = 0.f;

  for (int64_t t0 = lo; t0 < hi; t0 += KEYS) {
    __syncthreads();  // the previous tile's K/V are consumed (first pass: q_s and o_s are ready)
    const int64_t kv_row = (b * a.kv_heads + g);
    const auto key_row = [&](const T* context, const T* block) {
      return [=](int r) -> const T* {
        const int64_t pos = t0 + r;
        if (pos >= hi) return nullptr;
        return pos < length ? context + (kv_row * a.context + pos) * D : block + (kv_row * n + pos - length) * D;
      };
    };
    stage_rows(k_s, QK_LD, KEYS, key_row(k_context, k_block));
    stage_rows(v_s, QK_LD, KEYS, key_row(v_context, v_block));
    staged();

    // S[16 rows of this warp][64 keys] = Q K^T (K^T: the K tile read column-major)
    for (int j = 0; j < KEYS / 16; ++j) {
      Accumulator s_frag;
      wmma::fill_fragment(s_frag, 0.f);
      mma_steps<wmma::col_major>(s_frag, q_s + warp * 16 * QK_LD, QK_LD, k_s + j * 16 * QK_LD, QK_LD, 16, D / 16);
      wmma::store_matrix_sync(s_s + warp * 16 * S_LD + j * 16, s_frag, S_LD, wmma::mem_row_major);
    }
    __syncwarp();

    // Online softmax over this tile for my row, 32 keys per lane.
    float* scores = s_s + my_row * S_LD + half * 32;
    float tile_max = -INFINITY;
    for (int c = 0; c < 32; ++c) {
      const int64_t pos = t0 + half * 32 + c;
      const bool visible = row_ok && pos < hi && key_visible(q_pos, pos, a.causal, a.window);
      scores[c] = visible ? scores[c] * a.scale : -INFINITY;
      tile_max = fmaxf(tile_max, scores[c]);
    }
    tile_max = fmaxf(tile_max, __shfl_xor_sync(kFullMask, tile_max, 1));
    const float m_new = fmaxf(m, tile_max);
    const float alpha = m == -INFINITY ? 0.f : expf(m - m_new);  // nothing seen yet: o is still 0
    float p_sum = 0.f;
    T* probs = p_s + my_row * P_LD + half * 32;
    for (int c = 0; c < 32; ++c) {
      const float p = scores[c] == -INFINITY ? 0.f : expf(scores[c] - m_new);
      p_sum += p;
      probs[c] = from_float<T>(p);
    }
    p_sum += __shfl_xor_sync(kFullMask, p_sum, 1);
    m = m_new;
    l = l * alpha + p_sum;
    float* o_row = o_s + my_row * O_LD + half * (D / 2);
    for (int c = 0; c < D / 2; ++c) o_row[c] *= alpha;
    __syncwarp();

    // O[16 rows of this warp][128] += P V
    for (int j = 0; j < D / 16; ++j) {
      Accumulator o_frag;
      wmma::load_matrix_sync(o_frag, o_s + warp * 16 * O_LD + j * 16, O_LD, wmma::mem_row_major);
      mma_steps<wmma::row_major>(o_frag, p_s + warp * 16 * P_LD, P_LD, v_s + j * 16, QK_LD, 16 * QK_LD, KEYS / 16);
      wmma::store_matrix_sync(o_s + warp * 16 * O_LD + j * 16, o_frag, O_LD, wmma::mem_row_major);
    }
    __syncwarp();
  }

  __pipeline_wait_prior(0);  // with no key tile in this split, Q's copies were never waited for
  __syncthreads();  // o_s was zeroed by every thread: with no key tile in this split, nothing synced it
  // My row, my half of the dims: the normalised output (one split) or this split's partial sums
  // and (max, total), laid out as attention_kernel's.
  if (!row_ok) return;
  const int64_t out_row = (b * a.heads + g * a.groups + row / n) * n + row % n;
  const float* o_row = o_s + my_row * O_LD + half * (D / 2);
  if (a.splits == 1) {
    const float inv = l > 0.f ? 1.f / l : 0.f;
    for (int c = 0; c < D / 2; ++c) out[out_row * D + half * (D / 2) + c] = from_float<T>(o_row[c] * inv);
    return;
  }
  const int64_t at = split * a.total_rows + out_row;
  for (int c = 0; c < D / 2; ++c) partial[at * D + half * (D / 2) + c] = o_row[c];
  if (half == 0) {
    float* ml = partial + a.splits * a.total_rows * D + at * 2;
    ml[0] = m;
    ml[1] = l;
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

template <typename T>
using AttentionKernel = void (*)(Args, const T*, const T*, const T*, const T*, const T*, const int64_t*, float*, T*);

// One attention kernel over the plan's grid, then the combine pass when the keys were split.
template <typename T>
cudaError_t launch_attention(AttentionKernel<T> kernel, size_t shared_bytes, const BlockAttentionShape& s,
                             const BlockAttentionPlan& plan, const Args& a, const void* q, const void* kc,
                             const void* vc, const void* kb, const void* vb, const int64_t* lengths, void* workspace,
                             void* out, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(plan.query_tiles), static_cast<unsigned>(s.batch * s.kv_heads),
                  static_cast<unsigned>(plan.splits));
  kernel<<<grid, kWarps * 32, shared_bytes, stream>>>(
      a, static_cast<const T*>(q), static_cast<const T*>(kc), static_cast<const T*>(vc), static_cast<const T*>(kb),
      static_cast<const T*>(vb), lengths, static_cast<float*>(workspace), static_cast<T*>(out));
  if (plan.splits > 1) {
    const auto blocks = static_cast<unsigned>((a.total_rows + 3) / 4);
    combine_kernel<T><<<blocks, 128, 0, stream>>>(a, static_cast<const float*>(workspace), static_cast<T*>(out));
  }
  return cudaGetLastError();
}

template <typename T, int DCH, int KT, int RPW>
cudaError_t launch_config(const BlockAttentionShape& s, const BlockAttentionPlan& plan, const Args& a, const void* q,
                          const void* kc, const void* vc, const void* kb, const void* vb, const int64_t* lengths,
                          void* workspace, void* out, cudaStream_t stream) {
  if (plan.tile_rows != kWarps * RPW) return cudaErrorInvalidConfiguration;  // header and kernel disagree
  return launch_attention<T>(attention_kernel<T, DCH, KT, RPW>, 0, s, plan, a, q, kc, vc, kb, vb, lengths, workspace,
                             out, stream);
}

template <typename T>
cudaError_t launch_mma(const BlockAttentionShape& s, const BlockAttentionPlan& plan, const Args& a, const void* q,
                       const void* kc, const void* vc, const void* kb, const void* vb, const int64_t* lengths,
                       void* workspace, void* out, cudaStream_t stream) {
  constexpr size_t smem = mma_tile::bytes<T>();
  const cudaError_t opted =
      cudaFuncSetAttribute(mma_attention_kernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
  if (opted != cudaSuccess) return opted;
  return launch_attention<T>(mma_attention_kernel<T>, smem, s, plan, a, q, kc, vc, kb, vb, lengths, workspace, out,
                             stream);
}

template <typename T>
cudaError_t launch_typed(const BlockAttentionShape& s, const BlockAttentionPlan& plan, const Args& a, const void* q,
                         const void* kc, const void* vc, const void* kb, const void* vb, const int64_t* lengths,
                         void* workspace, void* out, cudaStream_t stream) {
  if constexpr (!std::is_same_v<T, float>) {
    if (plan.mma) return launch_mma<T>(s, plan, a, q, kc, vc, kb, vb, lengths, workspace, out, stream);
  }
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
  // The tensor-core kernel loads 16-byte vectors (every input must start on a 16-byte boundary) and
  // needs 110 KiB of shared memory per block, more than consumer GPUs (SM 12.x: 99 KiB) allow.
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  int device = 0, shared_optin = 0;
  const bool mma = block_attention_mma_fits(s, dtype) && aligned(q) && aligned(k_context) && aligned(v_context) &&
                   aligned(k_block) && aligned(v_block) && cudaGetDevice(&device) == cudaSuccess &&
                   cudaDeviceGetAttribute(&shared_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) ==
                       cudaSuccess &&
                   static_cast<size_t>(shared_optin) >= (dtype == DType::kFloat16 ? mma_tile::bytes<__half>()
                                                                                  : mma_tile::bytes<__nv_bfloat16>());
  const BlockAttentionPlan plan = block_attention_plan(s, mma);
  const Args a{
      s.heads,     s.kv_heads, s.block, s.context, s.head_dim, s.heads / s.kv_heads, s.batch * s.heads * s.block,
      plan.splits, scale,      causal,  window};
  return dispatch_dtype(dtype, [&](auto tag) {
    return launch_typed<typename decltype(tag)::type>(s, plan, a, q, k_context, v_context, k_block, v_block,
                                                      context_lengths, workspace, out, stream);
  });
}

}  // namespace dflash

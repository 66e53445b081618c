// dflash::BlockAttention v1 CUDA kernels: flash-attention style (key tiles in shared memory, online
// softmax with a running max and sum per query row), split over keys when there are few blocks,
// plus the pass that combines the splits. Two forms of the attention kernel: tensor-core mma for
// 16-bit dtypes at head_dim 128, float32 CUDA cores for everything else.
#include "block_attention/block_attention_kernel.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_pipeline.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "common/convert.cuh"
#include "common/mma.cuh"

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

// Tensor-core form, head_dim 128, 16-bit T, after FlashAttention-2: a block of 4 warps walks its
// split of the keys in tiles of 64, double-buffered: tile i + 1's K and V are copied asynchronously
// into shared memory while tile i is multiplied. Every product is an `mma.sync` m16n8k16 with float32
// accumulators, whose register layout the PTX ISA documents, so the scores S = Q K^T, the online
// softmax's running max and sum, and the output O stay in registers: the score accumulators of two
// adjacent 8-key blocks are, packed to T, the A operand of O += P V. Q's fragments are loaded once;
// K's and V's come from shared memory by `ldmatrix` (V's transposed). Shared rows are padded by 8
// halves (a 272-byte pitch puts the 8 rows an ldmatrix reads on 8 different 4-bank groups).
//
// Two layouts of the block's warps (`kKeySplit`):
// - 64 query rows, warp w rows 16w..16w+15 over all 64 keys of a tile (a drafter's block, a verify);
// - 16 query rows (a GQA group of at most 16 rows: a decode step's few queries), all four warps on
//   the same rows, warp w keys 16w..16w+15 of each tile, each with its own running max, sum and O,
//   merged through shared memory at the end. The other layout would spend three warps of four on
//   padding rows, and the kernel is bound by its instructions at these sizes, not by memory.
namespace mma_tile {
constexpr int D = 128, ROWS = 64, SPLIT_ROWS = 16, KEYS = 64, LD = D + 8, OUT_LD = D + 4;
__host__ __device__ constexpr int block_rows(bool key_split) { return key_split ? SPLIT_ROWS : ROWS; }
template <typename T>
constexpr size_t bytes(bool key_split) {
  return sizeof(T) * LD * (block_rows(key_split) + 2 * 2 * KEYS);  // Q, then two stages of K and V
}
// The key-split merge's buffers (every warp's O rows, then their max and sum) reuse the K/V stages.
static_assert(sizeof(float) * (4 * SPLIT_ROWS * OUT_LD + 4 * SPLIT_ROWS * 2) <= 2 * 2 * KEYS * LD * 2,
              "the merge fits in the K/V stages");
}  // namespace mma_tile

// Starts copying ROWS rows of D elements into dst (pitch LD): row r from src + r * D when r < valid,
// else zeros. Thread t copies 16-byte vector t % 16 of rows t / 16 + 8 i, so its addresses step by a
// fixed amount. Asynchronous: the caller commits and waits (__pipeline_commit / __pipeline_wait_prior)
// before a barrier.
template <int ROWS, typename T>
__device__ __forceinline__ void stage_rows(T* dst, const T* src, int64_t valid) {
  using namespace mma_tile;
  constexpr int V = 16 / sizeof(T), PER_ROW = D / V, STEP = kWarps * 32 / PER_ROW;
  static_assert(ROWS % STEP == 0, "whole passes of the block's threads");
  const int r0 = threadIdx.x / PER_ROW, c = (threadIdx.x % PER_ROW) * V;
#pragma unroll
  for (int i = 0; i < ROWS / STEP; ++i) {
    const int r = r0 + STEP * i;
    if (r < valid)
      __pipeline_memcpy_async(dst + r * LD + c, src + int64_t{r} * D + c, 16);
    else
      *reinterpret_cast<uint4*>(dst + r * LD + c) = make_uint4(0, 0, 0, 0);
  }
}

// Four 8x8 matrices of 16-bit values from shared memory, one per register: lane l gives the address
// of row l % 8 of matrix l / 8 and receives, of each matrix, row l / 4, columns 2 (l % 4) and + 1
// (with `trans`: column l / 4, rows 2 (l % 4) and + 1).
template <bool kTrans>
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* row) {
  const auto at = static_cast<uint32_t>(__cvta_generic_to_shared(row));
  if constexpr (kTrans)
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(at));
  else
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(at));
}

// Starts copying keys [t0, t0 + KEYS) of one (batch row, kv head) into a stage: K at k_s, V KEYS rows
// after it. Keys before `length` come from the context cache (k_context, v_context: that head's
// rows), the next ones before `hi` from the block's own K/V (k_block, v_block: its rows), the rest
// are zeros. Thread t copies 16-byte vector t % 16 of rows t / 16 + 8 i.
template <typename T>
__device__ __forceinline__ void stage_keys(T* k_s, const T* k_context, const T* v_context, const T* k_block,
                                           const T* v_block, int64_t length, int64_t t0, int64_t hi) {
  using namespace mma_tile;
  constexpr int V = 16 / sizeof(T), PER_ROW = D / V, STEP = kWarps * 32 / PER_ROW;
  const int r0 = threadIdx.x / PER_ROW, c = (threadIdx.x % PER_ROW) * V;
  T* v_s = k_s + KEYS * LD;
#pragma unroll
  for (int i = 0; i < KEYS / STEP; ++i) {
    const int r = r0 + STEP * i;
    const int64_t pos = t0 + r;
    T* k_to = k_s + r * LD + c;
    T* v_to = v_s + r * LD + c;
    if (pos < hi) {
      const bool context = pos < length;
      const int64_t at = (context ? pos : pos - length) * D + c;
      __pipeline_memcpy_async(k_to, (context ? k_context : k_block) + at, 16);
      __pipeline_memcpy_async(v_to, (context ? v_context : v_block) + at, 16);
    } else {
      *reinterpret_cast<uint4*>(k_to) = make_uint4(0, 0, 0, 0);
      *reinterpret_cast<uint4*>(v_to) = make_uint4(0, 0, 0, 0);
    }
  }
}

template <typename T, bool kKeySplit>
__global__ void __launch_bounds__(kWarps * 32)
    mma_attention_kernel(Args a, const T* q, const T* k_context, const T* v_context, const T* k_block,
                         const T* v_block, const int64_t* context_lengths, float* partial, T* out) {
  using namespace mma_tile;
  constexpr int BLOCK_ROWS = block_rows(kKeySplit), WARP_KEYS = kKeySplit ? KEYS / kWarps : KEYS;
  constexpr int KB = WARP_KEYS / 8, DB = D / 8;      // a warp's 8-key blocks of a tile, 8-dim blocks of a row
  constexpr int OUT_DB = kKeySplit ? DB / kWarps : DB;  // the 8-dim blocks of O a warp stores
  constexpr float kLog2e = 1.44269504088896341f, kLn2 = 0.693147180559945309f;
  extern __shared__ __align__(128) unsigned char smem[];
  T* q_s = reinterpret_cast<T*>(smem);
  T* kv_s = q_s + BLOCK_ROWS * LD;  // stage s: K at kv_s + 2 s KEYS LD, V KEYS LD after it

  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, group = lane / 4, pair = lane % 4;
  const int warp_row0 = kKeySplit ? 0 : 16 * warp, warp_key0 = kKeySplit ? WARP_KEYS * warp : 0;
  const int64_t b = blockIdx.y / a.kv_heads, g = blockIdx.y % a.kv_heads, split = blockIdx.z;
  const int64_t n = a.block, group_rows = a.groups * n, row0 = blockIdx.x * BLOCK_ROWS;
  const int64_t length = min(max(context_lengths[b], int64_t{0}), a.context);
  const int64_t kv_row = b * a.kv_heads + g;

  int64_t lo, hi;
  block_key_range(a, length, row0, BLOCK_ROWS, split, KEYS, lo, hi);
  // Keys before open_end are visible to every row of the block (no window; causal: up to the first
  // block slot's position): a tile of them needs no mask.
  const int64_t open_end = a.window > 0 ? 0 : a.causal ? min(hi, length + 1) : hi;
  const T* head_k = k_context + kv_row * a.context * D;  // this kv head's cached keys, then its block's
  const T* head_v = v_context + kv_row * a.context * D;
  const T* block_k = k_block + kv_row * n * D;
  const T* block_v = v_block + kv_row * n * D;
  const auto stage_tile = [&](int64_t t0, int stage) {
    stage_keys(kv_s + 2 * stage * KEYS * LD, head_k, head_v, block_k, block_v, length, t0, hi);
  };

  // Row r of the group is query head g * groups + r / n, block slot r % n: the group's rows are
  // consecutive rows of q and out, from first_row.
  const int64_t first_row = (b * a.heads + g * a.groups) * n;
  stage_rows<BLOCK_ROWS>(q_s, q + (first_row + row0) * D, group_rows - row0);
  if (lo < hi) stage_tile(lo, 0);
  __pipeline_commit();
  __pipeline_wait_prior(0);
  __syncthreads();

  // This lane's rows of the warp's 16: `group` (h = 0) and group + 8 (h = 1).
  int64_t q_pos[2];
  bool row_ok[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int64_t row = row0 + warp_row0 + group + 8 * h;
    row_ok[h] = row < group_rows;
    q_pos[h] = length + row % n;
  }
  uint32_t q_frag[D / 16][4];
#pragma unroll
  for (int ks = 0; ks < D / 16; ++ks)
    ldmatrix_x4<false>(q_frag[ks], q_s + (warp_row0 + lane % 16) * LD + ks * 16 + (lane / 16) * 8);

  // Scores are kept in units of log2: scale * log2(e) folded into one multiply, exp2 after (m too).
  const float scale_log2 = a.scale * kLog2e;
  float o[DB][4] = {}, m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
  int stage = 0;
  for (int64_t t0 = lo; t0 < hi; t0 += KEYS, stage ^= 1) {
    const bool more = t0 + KEYS < hi;
    if (more) stage_tile(t0 + KEYS, stage ^ 1);  // its buffers were released by the last tile's barrier
    __pipeline_commit();
    __pipeline_wait_prior(1);  // this tile's copies (committed a tile ago, or before the loop)
    __syncthreads();
    const T* k_s = kv_s + 2 * stage * KEYS * LD + warp_key0 * LD;  // this warp's keys of the tile
    const T* v_s = k_s + KEYS * LD;

    // S[16 rows][this warp's keys] = Q K^T: keys are K's rows, so K's row-major tile is the column-major B.
    float s[KB][4] = {};
#pragma unroll
    for (int ks = 0; ks < D / 16; ++ks) {
#pragma unroll
      for (int kp = 0; kp < KB / 2; ++kp) {
        uint32_t kf[4];
        ldmatrix_x4<false>(kf, k_s + (kp * 16 + lane % 8 + (lane / 16) * 8) * LD + ks * 16 + ((lane / 8) % 2) * 8);
        mma_16816<T>(s[2 * kp], q_frag[ks], kf[0], kf[1]);
        mma_16816<T>(s[2 * kp + 1], q_frag[ks], kf[2], kf[3]);
      }
    }

    // Online softmax, rows group and group + 8: a row's scores of this warp sit on the 4 lanes of its group.
    const bool open = t0 + KEYS <= open_end;
    const int64_t lane_key0 = t0 + warp_key0 + pair * 2;  // this lane's score (kb, e) is key lane_key0 + 8 kb + e
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      // Elsewhere the row sees the offsets [first, end) from lane_key0 (an empty range for a padding row).
      int first = 0, end = KEYS;
      if (!open) {
        int64_t key_first, key_end;  // unbounded sides are INT64_MIN / MAX: clamped before subtracting
        visible_keys(q_pos[h], a.causal, a.window, key_first, key_end);
        first = static_cast<int>(min(max(key_first, lane_key0) - lane_key0, int64_t{KEYS}));
        end = row_ok[h] ? static_cast<int>(min(max(min(key_end, hi), lane_key0) - lane_key0, int64_t{KEYS})) : 0;
      }
      float tile_max = -INFINITY;
#pragma unroll
      for (int kb = 0; kb < KB; ++kb)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          float& x = s[kb][2 * h + e];
          const int offset = kb * 8 + e;
          x = offset >= first && offset < end ? x * scale_log2 : -INFINITY;
          tile_max = fmaxf(tile_max, x);
        }
      tile_max = fmaxf(tile_max, __shfl_xor_sync(kFullMask, tile_max, 1));
      tile_max = fmaxf(tile_max, __shfl_xor_sync(kFullMask, tile_max, 2));
      const float m_new = fmaxf(m[h], tile_max);
      const float alpha = m[h] == -INFINITY ? 0.f : exp2f(m[h] - m_new);  // nothing seen yet: o is still 0
      const float m_sub = m_new == -INFINITY ? 0.f : m_new;  // a masked score's exp2 is then 0, never NaN
      float sum = 0.f;
#pragma unroll
      for (int kb = 0; kb < KB; ++kb)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          float& x = s[kb][2 * h + e];
          x = exp2f(x - m_sub);
          sum += x;
        }
      m[h] = m_new;
      l[h] = l[h] * alpha + sum;  // this lane's share; the group's 4 lanes are summed at the end
#pragma unroll
      for (int db = 0; db < DB; ++db) {
        o[db][2 * h] *= alpha;
        o[db][2 * h + 1] *= alpha;
      }
    }

    // O[16 rows][128] += P V, P in T: the accumulators of 8-key blocks 2j and 2j + 1 are the A
    // fragment of keys 16j..16j+15; V's row-major tile read transposed is the column-major B.
#pragma unroll
    for (int kp = 0; kp < KB / 2; ++kp) {
      const uint32_t p_frag[4] = {pack<T>(s[2 * kp][0], s[2 * kp][1]), pack<T>(s[2 * kp][2], s[2 * kp][3]),
                                  pack<T>(s[2 * kp + 1][0], s[2 * kp + 1][1]),
                                  pack<T>(s[2 * kp + 1][2], s[2 * kp + 1][3])};
#pragma unroll
      for (int dp = 0; dp < DB / 2; ++dp) {
        uint32_t vf[4];
        ldmatrix_x4<true>(vf, v_s + (kp * 16 + lane % 8 + ((lane / 8) % 2) * 8) * LD + dp * 16 + (lane / 16) * 8);
        mma_16816<T>(o[2 * dp], p_frag, vf[0], vf[1]);
        mma_16816<T>(o[2 * dp + 1], p_frag, vf[2], vf[3]);
      }
    }
    __syncthreads();  // this stage's buffers are read: the next tile may copy into them
  }

  float total[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    total[h] = l[h];
    total[h] += __shfl_xor_sync(kFullMask, total[h], 1);
    total[h] += __shfl_xor_sync(kFullMask, total[h], 2);
  }
  if constexpr (kKeySplit) {
    // Every warp saw a quarter of the keys for the same rows: each puts its O rows, max and sum in
    // shared memory (the K/V stages, free after the loop's last barrier), then warp w merges dims
    // 32w..32w+31 of all four into o[0..OUT_DB), with the merged max and sum.
    float* o_s = reinterpret_cast<float*>(kv_s);        // [warp][row][OUT_LD]
    float* ml_s = o_s + kWarps * SPLIT_ROWS * OUT_LD;   // [warp][row][max, sum]
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = group + 8 * h;
      float* at = o_s + (warp * SPLIT_ROWS + r) * OUT_LD + 2 * pair;
#pragma unroll
      for (int db = 0; db < DB; ++db)
        *reinterpret_cast<float2*>(at + db * 8) = make_float2(o[db][2 * h], o[db][2 * h + 1]);
      if (pair == 0) {
        ml_s[(warp * SPLIT_ROWS + r) * 2] = m[h];
        ml_s[(warp * SPLIT_ROWS + r) * 2 + 1] = total[h];
      }
    }
    __syncthreads();
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = group + 8 * h;
      float best = -INFINITY, weight[kWarps], sum = 0.f;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) best = fmaxf(best, ml_s[(w * SPLIT_ROWS + r) * 2]);
#pragma unroll
      for (int w = 0; w < kWarps; ++w) {
        const float mw = ml_s[(w * SPLIT_ROWS + r) * 2];
        weight[w] = mw == -INFINITY ? 0.f : exp2f(mw - best);
        sum += weight[w] * ml_s[(w * SPLIT_ROWS + r) * 2 + 1];
      }
#pragma unroll
      for (int i = 0; i < OUT_DB; ++i) {
        float2 acc = make_float2(0.f, 0.f);
#pragma unroll
        for (int w = 0; w < kWarps; ++w) {
          const float* from = o_s + (w * SPLIT_ROWS + r) * OUT_LD + (warp * OUT_DB + i) * 8 + 2 * pair;
          const float2 x = *reinterpret_cast<const float2*>(from);
          acc.x += weight[w] * x.x;
          acc.y += weight[w] * x.y;
        }
        o[i][2 * h] = acc.x;
        o[i][2 * h + 1] = acc.y;
      }
      m[h] = best;
      total[h] = sum;
    }
  }

  // My rows, dims (db0 + i) * 8 + 2 pair (+1): the normalised output (one split) or this split's
  // partial sums and (max, total) in natural units, laid out as attention_kernel's.
  const int db0 = kKeySplit ? warp * OUT_DB : 0;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    if (!row_ok[h]) continue;
    const int64_t row = row0 + warp_row0 + group + 8 * h;
    const int64_t out_row = first_row + row;
    if (a.splits == 1) {
      const float inv = total[h] > 0.f ? 1.f / total[h] : 0.f;  // no visible key: zeros
#pragma unroll
      for (int i = 0; i < OUT_DB; ++i)
        *reinterpret_cast<uint32_t*>(out + out_row * D + (db0 + i) * 8 + 2 * pair) =
            pack<T>(o[i][2 * h] * inv, o[i][2 * h + 1] * inv);
      continue;
    }
    const int64_t at = split * a.total_rows + out_row;
#pragma unroll
    for (int i = 0; i < OUT_DB; ++i)
      *reinterpret_cast<float2*>(partial + at * D + (db0 + i) * 8 + 2 * pair) =
          make_float2(o[i][2 * h], o[i][2 * h + 1]);
    if (pair == 0 && (!kKeySplit || warp == 0)) {
      float* ml = partial + a.splits * a.total_rows * D + at * 2;
      ml[0] = m[h] * kLn2;
      ml[1] = total[h];
    }
  }
}

// One warp per output row: rescale each split's sum to the common max and normalise by the total.
// Lane l holds splits l and l + 32 (kMaxSplits <= 64): their max and weight are computed once, and
// a split's weight reaches the lanes by a shuffle while they sum their dims of its partial output.
template <typename T>
__global__ void __launch_bounds__(128) combine_kernel(Args a, const float* partial, T* out) {
  static_assert(BlockAttentionPlan::kMaxSplits <= 64, "two splits a lane");
  constexpr int kDims = static_cast<int>(kBlockAttentionMaxHeadDim / 32);
  const int lane = threadIdx.x % 32;
  const int64_t row = blockIdx.x * 4 + threadIdx.x / 32;
  if (row >= a.total_rows) return;
  const int64_t d = a.head_dim;
  const int splits = static_cast<int>(a.splits);
  const float* ml = partial + a.splits * a.total_rows * d;
  float m[2], l[2], best = -INFINITY;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int64_t split = lane + 32 * i;
    m[i] = split < splits ? ml[(split * a.total_rows + row) * 2] : -INFINITY;
    l[i] = split < splits ? ml[(split * a.total_rows + row) * 2 + 1] : 0.f;
    best = fmaxf(best, m[i]);
  }
  for (int offset = 16; offset > 0; offset /= 2) best = fmaxf(best, __shfl_xor_sync(kFullMask, best, offset));
  float weight[2], total = 0.f;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    weight[i] = m[i] == -INFINITY ? 0.f : expf(m[i] - best);  // nothing visible in the split: no weight
    total += weight[i] * l[i];
  }
  for (int offset = 16; offset > 0; offset /= 2) total += __shfl_xor_sync(kFullMask, total, offset);
  const float inv = total > 0.f ? 1.f / total : 0.f;  // no visible key at all: zeros
  float acc[kDims] = {};
#pragma unroll 4
  for (int split = 0; split < splits; ++split) {
    const float w = __shfl_sync(kFullMask, split < 32 ? weight[0] : weight[1], split % 32);
    const float* sums = partial + (split * a.total_rows + row) * d;
#pragma unroll
    for (int c = 0; c < kDims; ++c)
      if (lane + 32 * c < d) acc[c] += w * sums[lane + 32 * c];
  }
#pragma unroll
  for (int c = 0; c < kDims; ++c)
    if (lane + 32 * c < d) out[row * d + lane + 32 * c] = from_float<T>(acc[c] * inv);
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

template <typename T, bool kKeySplit>
cudaError_t launch_mma(const BlockAttentionShape& s, const BlockAttentionPlan& plan, const Args& a, const void* q,
                       const void* kc, const void* vc, const void* kb, const void* vb, const int64_t* lengths,
                       void* workspace, void* out, cudaStream_t stream) {
  // The header's plan and this kernel agree on the rows a block holds:
  if (plan.tile_rows != mma_tile::block_rows(kKeySplit)) return cudaErrorInvalidConfiguration;
  constexpr size_t smem = mma_tile::bytes<T>(kKeySplit);
  const cudaError_t opted = cudaFuncSetAttribute(mma_attention_kernel<T, kKeySplit>,
                                                 cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
  if (opted != cudaSuccess) return opted;
  return launch_attention<T>(mma_attention_kernel<T, kKeySplit>, smem, s, plan, a, q, kc, vc, kb, vb, lengths,
                             workspace, out, stream);
}

template <typename T>
cudaError_t launch_typed(const BlockAttentionShape& s, const BlockAttentionPlan& plan, const Args& a, const void* q,
                         const void* kc, const void* vc, const void* kb, const void* vb, const int64_t* lengths,
                         void* workspace, void* out, cudaStream_t stream) {
  if constexpr (!std::is_same_v<T, float>) {
    if (plan.key_split) return launch_mma<T, true>(s, plan, a, q, kc, vc, kb, vb, lengths, workspace, out, stream);
    if (plan.mma) return launch_mma<T, false>(s, plan, a, q, kc, vc, kb, vb, lengths, workspace, out, stream);
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
  // The tensor-core kernel loads 16-byte vectors (every input must start on a 16-byte boundary), stores
  // pairs (out and the workspace too), and needs 85 KiB of shared memory per block: past the default
  // 48 KiB, within what SM 8.0-12.x allow.
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  int device = 0, shared_optin = 0;
  const size_t shared_bytes =
      dtype == DType::kFloat16 ? mma_tile::bytes<__half>(false) : mma_tile::bytes<__nv_bfloat16>(false);
  const bool mma = block_attention_mma_fits(s, dtype) && aligned(q) && aligned(k_context) && aligned(v_context) &&
                   aligned(k_block) && aligned(v_block) && aligned(out) && aligned(workspace) &&
                   cudaGetDevice(&device) == cudaSuccess &&
                   cudaDeviceGetAttribute(&shared_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) ==
                       cudaSuccess &&
                   static_cast<size_t>(shared_optin) >= shared_bytes;
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

// dflash::InjectKV v1 CUDA kernels: a split-K projection into float32 scratch (on tensor cores for
// 16-bit dtypes; in float32 on CUDA cores a GEMV-shaped kernel streaming the weights with 16-byte
// loads when the rows are few, a tiled GEMM otherwise), then one warp per (row, kv head) that sums
// the splits, RMS-normalises and RoPEs k and stores k and v.
#include "inject_kv/inject_kv_kernel.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "common/convert.cuh"
#include "common/mma.cuh"

namespace dflash {
namespace {

constexpr int kTile = static_cast<int>(InjectKVPlan::kTile);
constexpr int kProjectThreads = 128;  // 16 x 8 threads, each 2 rows x 4 columns of the 32 x 32 tile
constexpr int kPairsPerLane = static_cast<int>(kInjectKVMaxHeadDim / 64);

struct Launch {
  int64_t tokens, hidden, kv_heads, head_dim;
  int64_t row_begin, row_count;  // this launch's rows
  int64_t splits, k_per_split;
  float epsilon;
};

// partial[split][row - row_begin][c] = sum over this split's K range of hidden[row, k] * W[c, k],
// where W stacks k_weight over v_weight (c < kv*d: a key column, else a value column).
template <typename T>
__global__ void __launch_bounds__(kProjectThreads)
    project_kernel(Launch a, const T* hidden, const T* k_weight, const T* v_weight, float* partial) {
  // Stored [k][row] and [k][column]: the inner loop reads along rows/columns; +1 spreads the
  // transposing stores over all banks.
  __shared__ float x_s[kTile][kTile + 1];
  __shared__ float w_s[kTile][kTile + 1];
  const int64_t kvd = a.kv_heads * a.head_dim, cols = 2 * kvd;
  const int64_t row0 = blockIdx.y * kTile, col0 = blockIdx.x * kTile;
  const int64_t k_begin = blockIdx.z * a.k_per_split;
  const int64_t k_end = min(a.hidden, k_begin + a.k_per_split);
  const int tr = threadIdx.x / 8, tc = threadIdx.x % 8;
  float acc[2][4] = {};

  for (int64_t k0 = k_begin; k0 < k_end; k0 += kTile) {
    // Consecutive threads walk K, which is contiguous in both hidden and the weights.
    for (int e = threadIdx.x; e < kTile * kTile; e += kProjectThreads) {
      const int r = e / kTile, kk = e % kTile;
      const int64_t k = k0 + kk, row = row0 + r, col = col0 + r;
      const bool k_ok = k < k_end;
      x_s[kk][r] = k_ok && row < a.row_count ? load(hidden + (a.row_begin + row) * a.hidden + k) : 0.f;
      const T* w = col < kvd ? k_weight + col * a.hidden : v_weight + (col - kvd) * a.hidden;
      w_s[kk][r] = k_ok && col < cols ? load(w + k) : 0.f;
    }
    __syncthreads();
#pragma unroll 8
    for (int kk = 0; kk < kTile; ++kk) {
      const float x0 = x_s[kk][2 * tr], x1 = x_s[kk][2 * tr + 1];
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const float w = w_s[kk][4 * tc + c];
        acc[0][c] += x0 * w;
        acc[1][c] += x1 * w;
      }
    }
    __syncthreads();
  }
  // Every split writes its whole tile (zeros for an empty K range): the reducer sums all splits.
  float* out = partial + blockIdx.z * a.row_count * cols;
  for (int r = 0; r < 2; ++r) {
    const int64_t row = row0 + 2 * tr + r;
    if (row >= a.row_count) continue;
    for (int c = 0; c < 4; ++c) {
      const int64_t col = col0 + 4 * tc + c;
      if (col < cols) out[row * cols + col] = acc[r][c];
    }
  }
}

// The decode-time shape (rows = b x block, a few dozen): the weights are nearly all the bytes, so
// each warp streams kSkinnyCols weight columns over its split of K with 16-byte loads and multiplies
// them into up to kSkinnyRows rows of hidden (blockIdx.y picks which), each lane summing its own K
// slice; the lanes' sums meet by shuffles at the end. Needs hidden % kVec == 0 and 16-byte aligned
// hidden and weights (skinny_fits).
constexpr int kSkinnyRows = 16, kSkinnyCols = 4, kSkinnyWarps = 4;

template <typename T>
constexpr int kVec = 16 / static_cast<int>(sizeof(T));

template <typename T>
__device__ __forceinline__ void load_vec(const T* p, float (&out)[kVec<T>]) {
  const uint4 raw = __ldg(reinterpret_cast<const uint4*>(p));
  const T* x = reinterpret_cast<const T*>(&raw);
#pragma unroll
  for (int i = 0; i < kVec<T>; ++i) out[i] = to_float(x[i]);
}

template <typename T>
__global__ void __launch_bounds__(kSkinnyWarps * 32)
    skinny_project_kernel(Launch a, const T* hidden, const T* k_weight, const T* v_weight, float* partial) {
  constexpr int V = kVec<T>;
  const int lane = threadIdx.x % 32;
  const int64_t kvd = a.kv_heads * a.head_dim, cols = 2 * kvd;
  const int64_t col0 = (static_cast<int64_t>(blockIdx.x) * kSkinnyWarps + threadIdx.x / 32) * kSkinnyCols;
  const int64_t row0 = static_cast<int64_t>(blockIdx.y) * kSkinnyRows;
  const int rows = static_cast<int>(min(int64_t{kSkinnyRows}, a.row_count - row0));
  const int64_t k_begin = blockIdx.z * a.k_per_split, k_end = min(a.hidden, k_begin + a.k_per_split);
  if (col0 >= cols) return;  // whole warps only: the shuffles below need all 32 lanes

  const T* w[kSkinnyCols];
#pragma unroll
  for (int c = 0; c < kSkinnyCols; ++c) {
    const int64_t col = min(col0 + c, cols - 1);  // a column past the end repeats the last; not stored
    w[c] = col < kvd ? k_weight + col * a.hidden : v_weight + (col - kvd) * a.hidden;
  }
  const T* x = hidden + (a.row_begin + row0) * a.hidden;
  float acc[kSkinnyRows][kSkinnyCols] = {};
  for (int64_t k = k_begin + lane * V; k < k_end; k += 32 * V) {
    float wv[kSkinnyCols][V];
#pragma unroll
    for (int c = 0; c < kSkinnyCols; ++c) load_vec(w[c] + k, wv[c]);
#pragma unroll
    for (int r = 0; r < kSkinnyRows; ++r) {
      if (r >= rows) break;
      float xv[V];
      load_vec(x + r * a.hidden + k, xv);
#pragma unroll
      for (int c = 0; c < kSkinnyCols; ++c)
#pragma unroll
        for (int i = 0; i < V; ++i) acc[r][c] += xv[i] * wv[c][i];
    }
  }
  float* out = partial + (blockIdx.z * a.row_count + row0) * cols;
#pragma unroll
  for (int r = 0; r < kSkinnyRows; ++r) {
    if (r >= rows) break;
#pragma unroll
    for (int c = 0; c < kSkinnyCols; ++c) {
      float sum = acc[r][c];
      for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
      if (lane == 0 && col0 + c < cols) out[r * cols + col0 + c] = sum;
    }
  }
}

// The tensor-core form for 16-bit T (mma.sync m16n8k16, float32 accumulators): a block of 4 warps
// computes up to 16 * RM rows (one row tile for a decode call's few dozen rows, so the weights are
// read once) by 64 columns over its split of K; warp w owns columns 16w..16w+15, two 8-column mma
// tiles. Both operands come straight from global memory in 16-byte loads, a 32-wide slice of K at a
// time (mma_rows: K permuted alike in both, the same sums). A warp issues the weight loads of 8
// slices (256 K; fewer for more rows) before the first product; the rows' hidden, shared by the 4
// warps, is read through L1. Needs hidden % 8 == 0 and 16-byte aligned hidden and weights (mma_fits).
namespace mma_project {
constexpr int kWarps = 4, kCols = 16 * kWarps;
constexpr int kChunk = 256;  // splits cut K in multiples of this
// Slices whose weights a warp has in flight at once: fewer as the rows' accumulators take registers.
__host__ __device__ constexpr int slices_in_flight(int rm) { return rm >= 8 ? 2 : rm >= 4 ? 4 : 8; }
}  // namespace mma_project

template <typename T, int RM>
__global__ void __launch_bounds__(mma_project::kWarps * 32)
    mma_project_kernel(Launch a, const T* hidden, const T* k_weight, const T* v_weight, float* partial) {
  using namespace mma_project;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, group = lane / 4, quad = lane % 4;
  const int64_t kvd = a.kv_heads * a.head_dim, cols = 2 * kvd;
  const int64_t row0 = static_cast<int64_t>(blockIdx.y) * 16 * RM;
  const int64_t k_begin = blockIdx.z * a.k_per_split, k_end = min(a.hidden, k_begin + a.k_per_split);
  // This lane's weight column in each of the warp's two 8-column tiles (a column past the last
  // repeats it; not stored), and its two rows in each 16-row tile (rows past the launch's read zeros).
  const T* w[2];
  int64_t col[2];
#pragma unroll
  for (int t = 0; t < 2; ++t) {
    col[t] = static_cast<int64_t>(blockIdx.x) * kCols + warp * 16 + t * 8 + group;
    const int64_t c = min(col[t], cols - 1);
    w[t] = (c < kvd ? k_weight + c * a.hidden : v_weight + (c - kvd) * a.hidden) + 8 * quad;
  }
  // Row (i, h) of this lane: row0 + 16 i + group + 8 h (past the launch's rows: none, zeros).
  const T* rows[RM][2];
#pragma unroll
  for (int i = 0; i < RM; ++i)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t row = row0 + 16 * i + group + 8 * h;
      rows[i][h] = row < a.row_count ? hidden + (a.row_begin + row) * a.hidden + 8 * quad : nullptr;
    }
  float acc[RM][2][4] = {};
  mma_rows<T, RM, 2, slices_in_flight(RM)>(rows, w, k_begin, k_end, acc);
  // Accumulator (row group (+8), columns 2 quad, +1 of each 8-column tile) into this split's rows;
  // only rows below row_count are stored (a split's region holds exactly row_count rows).
  float* out = partial + blockIdx.z * a.row_count * cols;
#pragma unroll
  for (int i = 0; i < RM; ++i)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t row = row0 + 16 * i + group + 8 * h;
      if (row >= a.row_count) continue;
#pragma unroll
      for (int t = 0; t < 2; ++t) {
        const int64_t c = col[t] - group + 2 * quad;  // the tile's first column + 2 quad
        if (c + 1 < cols)
          *reinterpret_cast<float2*>(out + row * cols + c) = make_float2(acc[i][t][2 * h], acc[i][t][2 * h + 1]);
        else if (c < cols)
          out[row * cols + c] = acc[i][t][2 * h];
      }
    }
}

bool mma_fits(const InjectKVShape& s, const void* hidden, const void* k_weight, const void* v_weight) {
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  return s.hidden % 8 == 0 && aligned(hidden) && aligned(k_weight) && aligned(v_weight);
}

template <typename T>
bool skinny_fits(const InjectKVShape& s, const void* hidden, const void* k_weight, const void* v_weight) {
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  return s.batch * s.tokens <= kInjectKVSkinnyMaxRows && s.hidden % kVec<T> == 0 && aligned(hidden) &&
         aligned(k_weight) && aligned(v_weight);
}

__device__ __forceinline__ float sum_splits(const float* partial, int64_t split_stride, int64_t splits) {
  float total = 0.f;
  for (int64_t s = 0; s < splits; ++s) total += partial[s * split_stride];
  return total;
}

// One warp per (row, kv head): k = rope(rmsnorm(sum of k partials) * k_norm), v = sum of v partials.
// Lane handles the rotate-half pairs (j, j + d/2) for j = lane, lane + 32, ...: both halves of a
// pair are in its registers, so RoPE needs no exchange between lanes.
template <typename T>
__global__ void __launch_bounds__(128)
    norm_rope_kernel(Launch a, const float* partial, const T* k_norm, const T* cos, const T* sin, T* k_out, T* v_out) {
  const int lane = threadIdx.x % 32;
  const int64_t item = blockIdx.x * 4 + threadIdx.x / 32;
  if (item >= a.row_count * a.kv_heads) return;
  const int64_t local = item / a.kv_heads, h = item % a.kv_heads, row = a.row_begin + local;
  const int64_t d = a.head_dim, half = d / 2, cols = 2 * a.kv_heads * d, split_stride = a.row_count * cols;
  const float* k_sum = partial + local * cols + h * d;
  const float* v_sum = k_sum + a.kv_heads * d;

  float lo[kPairsPerLane], hi[kPairsPerLane], square_sum = 0.f;
#pragma unroll
  for (int p = 0; p < kPairsPerLane; ++p) {
    const int64_t j = lane + 32 * p;
    lo[p] = j < half ? sum_splits(k_sum + j, split_stride, a.splits) : 0.f;
    hi[p] = j < half ? sum_splits(k_sum + j + half, split_stride, a.splits) : 0.f;
    square_sum += lo[p] * lo[p] + hi[p] * hi[p];
  }
  for (int offset = 16; offset > 0; offset /= 2) square_sum += __shfl_xor_sync(0xffffffffu, square_sum, offset);
  const float inv_rms = 1.f / sqrtf(square_sum / static_cast<float>(d) + a.epsilon);

  const int64_t b = row / a.tokens, t = row % a.tokens;
  const int64_t out = ((b * a.kv_heads + h) * a.tokens + t) * d;
  const T* c = cos + row * d;
  const T* s = sin + row * d;
#pragma unroll
  for (int p = 0; p < kPairsPerLane; ++p) {
    const int64_t j = lane + 32 * p;
    if (j >= half) continue;
    const float x = lo[p] * inv_rms * load(k_norm + j), y = hi[p] * inv_rms * load(k_norm + j + half);
    k_out[out + j] = from_float<T>(x * load(c + j) - y * load(s + j));
    k_out[out + j + half] = from_float<T>(y * load(c + j + half) + x * load(s + j + half));
  }
  for (int64_t j = lane; j < d; j += 32) v_out[out + j] = from_float<T>(sum_splits(v_sum + j, split_stride, a.splits));
}

// The tensor-core projection (mma_project_kernel, 16 * RM rows a block), kRowsPerLaunch rows at a time,
// each launch followed by norm_rope(its Launch).
template <typename T, int RM, typename NormRope>
cudaError_t launch_mma(const InjectKVShape& s, float epsilon, const void* hidden, const void* k_weight,
                       const void* v_weight, float* partial, cudaStream_t stream, const NormRope& norm_rope) {
  const int64_t rows = s.batch * s.tokens, cols = 2 * s.kv_heads * s.head_dim;
  for (int64_t begin = 0; begin < rows; begin += InjectKVPlan::kRowsPerLaunch) {
    const int64_t count = std::min(InjectKVPlan::kRowsPerLaunch, rows - begin);
    const int64_t col_blocks = ceil_div(cols, mma_project::kCols), row_blocks = ceil_div(count, 16 * RM);
    // Split K until about kTargetBlocks blocks stream the weights; splits x rows stays within the
    // workspace (at most kRowsPerLaunch).
    const int64_t splits = std::clamp<int64_t>(
        InjectKVPlan::kTargetBlocks / (col_blocks * row_blocks), 1,
        std::min({InjectKVPlan::kMaxSplits, ceil_div(s.hidden, mma_project::kChunk),
                  InjectKVPlan::kRowsPerLaunch / count}));
    const int64_t k_per_split = ceil_div(ceil_div(s.hidden, splits), mma_project::kChunk) * mma_project::kChunk;
    const Launch a{s.tokens, s.hidden, s.kv_heads, s.head_dim, begin, count, ceil_div(s.hidden, k_per_split),
                   k_per_split, epsilon};
    const dim3 grid(static_cast<unsigned>(col_blocks), static_cast<unsigned>(row_blocks),
                    static_cast<unsigned>(a.splits));
    mma_project_kernel<T, RM><<<grid, mma_project::kWarps * 32, 0, stream>>>(
        a, static_cast<const T*>(hidden), static_cast<const T*>(k_weight), static_cast<const T*>(v_weight), partial);
    norm_rope(a);
  }
  return cudaGetLastError();
}

template <typename T>
cudaError_t launch_typed(const InjectKVShape& s, const void* hidden, const void* k_weight, const void* v_weight,
                         const void* k_norm, const void* cos, const void* sin, float epsilon, void* workspace,
                         void* k_out, void* v_out, cudaStream_t stream) {
  const InjectKVPlan plan = inject_kv_plan(s);
  const int64_t rows = s.batch * s.tokens, cols = 2 * s.kv_heads * s.head_dim;
  float* partial = static_cast<float*>(workspace);
  const auto norm_rope = [&](const Launch& a) {
    const auto items = static_cast<unsigned>(ceil_div(a.row_count * s.kv_heads, 4));
    norm_rope_kernel<T><<<items, 128, 0, stream>>>(a, partial, static_cast<const T*>(k_norm),
                                                   static_cast<const T*>(cos), static_cast<const T*>(sin),
                                                   static_cast<T*>(k_out), static_cast<T*>(v_out));
  };
  if constexpr (!std::is_same_v<T, float>) {
    if (mma_fits(s, hidden, k_weight, v_weight)) {
      // As few 16-row tiles a block as hold the rows (every block reads its columns' weights), at
      // most 8: a decode call's rows in one block row, a prefill's 128 at a time.
      if (rows <= 16) return launch_mma<T, 1>(s, epsilon, hidden, k_weight, v_weight, partial, stream, norm_rope);
      if (rows <= 32) return launch_mma<T, 2>(s, epsilon, hidden, k_weight, v_weight, partial, stream, norm_rope);
      if (rows <= 64) return launch_mma<T, 4>(s, epsilon, hidden, k_weight, v_weight, partial, stream, norm_rope);
      return launch_mma<T, 8>(s, epsilon, hidden, k_weight, v_weight, partial, stream, norm_rope);
    }
  }
  if (skinny_fits<T>(s, hidden, k_weight, v_weight)) {
    const int64_t col_blocks = ceil_div(cols, kSkinnyCols * kSkinnyWarps), row_blocks = ceil_div(rows, kSkinnyRows);
    // Split K until about kTargetBlocks blocks stream the weights, each lane keeping at least 4
    // loads per column in flight; splits x rows stays within the workspace (at most kRowsPerLaunch).
    const int64_t per_lane = 32 * kVec<T> * 4;
    const int64_t splits = std::clamp<int64_t>(
        InjectKVPlan::kTargetBlocks / (col_blocks * row_blocks), 1,
        std::min({InjectKVPlan::kMaxSplits, ceil_div(s.hidden, per_lane), InjectKVPlan::kRowsPerLaunch / rows}));
    const int64_t k_per_split = ceil_div(ceil_div(s.hidden, splits), kVec<T> * 32) * kVec<T> * 32;
    const Launch a{s.tokens, s.hidden, s.kv_heads, s.head_dim, 0, rows, ceil_div(s.hidden, k_per_split),
                   k_per_split, epsilon};
    const dim3 grid(static_cast<unsigned>(col_blocks), static_cast<unsigned>(row_blocks),
                    static_cast<unsigned>(a.splits));
    skinny_project_kernel<T><<<grid, kSkinnyWarps * 32, 0, stream>>>(
        a, static_cast<const T*>(hidden), static_cast<const T*>(k_weight), static_cast<const T*>(v_weight), partial);
    norm_rope(a);
    return cudaGetLastError();
  }
  for (int64_t begin = 0; begin < rows; begin += plan.rows_per_launch) {
    const Launch a{
        s.tokens,    s.hidden,         s.kv_heads, s.head_dim, begin, std::min(plan.rows_per_launch, rows - begin),
        plan.splits, plan.k_per_split, epsilon};
    const dim3 grid(static_cast<unsigned>(ceil_div(cols, kTile)), static_cast<unsigned>(ceil_div(a.row_count, kTile)),
                    static_cast<unsigned>(plan.splits));
    project_kernel<T><<<grid, kProjectThreads, 0, stream>>>(
        a, static_cast<const T*>(hidden), static_cast<const T*>(k_weight), static_cast<const T*>(v_weight), partial);
    norm_rope(a);
  }
  return cudaGetLastError();
}

}  // namespace

cudaError_t inject_kv_launch(const InjectKVShape& s, DType dtype, const void* hidden, const void* k_weight,
                             const void* v_weight, const void* k_norm, const void* cos, const void* sin, float epsilon,
                             void* workspace, void* k_out, void* v_out, cudaStream_t stream) {
  if (inject_kv_unsupported(s) != nullptr) return cudaErrorInvalidValue;
  if (s.batch * s.tokens == 0) return cudaSuccess;
  return dispatch_dtype(dtype, [&](auto tag) {
    return launch_typed<typename decltype(tag)::type>(s, hidden, k_weight, v_weight, k_norm, cos, sin, epsilon,
                                                      workspace, k_out, v_out, stream);
  });
}

}  // namespace dflash

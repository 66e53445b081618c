// dflash::MoE v1 CUDA kernels, grouped by expert so that the experts the tokens picked are read once
// per call, not once per token (a warp passes over its weight rows once per 16 pairs, kTokens on CUDA cores):
//   route    one block: a warp routes a token; then each expert's pairs (token, slot) in token order,
//            and the list of picked experts
//   gate/up  a block per (picked expert, rows of I): every pair of that expert, silu(gate) * up
//            rounded to T into the scratch (on tensor cores for 16-bit T: 16 pairs a pass)
//   down     a block per (picked expert, rows of H): every pair's float32 partial (likewise)
//   combine  a thread per output element: the token's top_k partials times their weights, in slot order
// Grids span every expert slot a call could pick; blocks past the picked ones return at once, so
// nothing is read back to the host. No float atomics, and each dot product is summed in one fixed
// order per (expert, output element): the output is deterministic, and a token's does not depend on
// which other tokens share the call.
#include "moe/moe_kernel.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <climits>
#include <cmath>
#include <type_traits>

#include "common/convert.cuh"
#include "common/mma.cuh"

namespace dflash {
namespace {

constexpr int kRouteThreads = static_cast<int>(kMoEMaxExperts);  // the list phase: a thread an expert
constexpr int kRouteWarps = kRouteThreads / 32;
constexpr int kLogitsPerLane = static_cast<int>(kMoEMaxExperts / 32);
constexpr int kWarps = 4, kThreads = 32 * kWarps;
constexpr int kGateRows = 2;  // rows of I a warp computes: their gate and up rows, 4 weight rows
constexpr int kDownRows = 4;  // rows of H a warp computes
constexpr int kTokens = 4;    // pairs a warp computes per pass over its weight rows (their registers)
constexpr int kCombineThreads = 256;

// One launch: at most kMoETokensPerLaunch tokens, and where its scratch lives.
struct Launch {
  int64_t tokens, hidden, experts, inter, top_k;
  bool normalize;
  int32_t *ids, *counts, *picked, *lists;  // picked[experts]: how many experts were picked
  float *weights, *partial;
  void* act;
};

// Routes token t with one warp: moe_route_token's float32 expressions, in its order wherever the
// order changes the bits (the sum of the exponentials, the kept total), so a token is routed and
// weighed exactly as moe_route_token routes it on the device. Not a call: one thread running it
// spends top_k x E exponentials and divisions in sequence (~100 us at E 256, top-8), ten times a
// decode step's weight reads. Lane l holds experts l, l + 32, ...; `exps` is the warp's [E] scratch.
template <typename T>
__device__ void route_token(const Launch& a, const T* logits, float* exps, int64_t t) {
  const int lane = threadIdx.x % 32, experts = static_cast<int>(a.experts);
  float x[kLogitsPerLane];
  float peak = -INFINITY;  // fmaxf in any order is the same value
#pragma unroll
  for (int i = 0; i < kLogitsPerLane; ++i) {
    const int e = lane + 32 * i;
    x[i] = e < experts ? load(logits + t * a.experts + e) : -INFINITY;
    peak = fmaxf(peak, x[i]);
  }
  for (int offset = 16; offset > 0; offset /= 2) peak = fmaxf(peak, __shfl_xor_sync(0xffffffffu, peak, offset));
#pragma unroll
  for (int i = 0; i < kLogitsPerLane; ++i) {
    const int e = lane + 32 * i;
    if (e < experts) exps[e] = x[i] = expf(x[i] - peak);
  }
  __syncwarp();
  float total = 0.f;
  if (lane == 0)
    for (int e = 0; e < experts; ++e) total += exps[e];  // in expert order, as moe_route_token
  total = __shfl_sync(0xffffffffu, total, 0);
  __syncwarp();  // the warp's next token overwrites exps
#pragma unroll
  for (int i = 0; i < kLogitsPerLane; ++i) x[i] /= total;  // the probabilities

  unsigned taken = 0;  // bit i: expert lane + 32 i is picked already
  float kept = 0.f, my_weight = 0.f;
  int my_id = -1;  // lane j keeps pick j
  for (int j = 0; j < a.top_k; ++j) {
    // The lane's best: the first of its experts with the highest probability (a NaN never is).
    float best_p = -1.f;
    int best = -1;
#pragma unroll
    for (int i = 0; i < kLogitsPerLane; ++i) {
      const int e = lane + 32 * i;
      if (e < experts && !(taken >> i & 1u) && x[i] > best_p) {
        best = e;
        best_p = x[i];
      }
    }
    // The warp's: a probability's bits order as the probability does (it is >= 0); 0: no candidate.
    // Among equal probabilities the lowest index, moe_route_token's strict > in expert order.
    const unsigned key = best >= 0 ? __float_as_uint(best_p) + 1u : 0u;
    const unsigned top = __reduce_max_sync(0xffffffffu, key);
    best = static_cast<int>(__reduce_min_sync(0xffffffffu, key == top ? static_cast<unsigned>(best) : UINT_MAX));
    best_p = top == 0 ? -1.f : __uint_as_float(top - 1u);  // none (NaN probabilities): best is -1 too
    if (best >= 0 && best % 32 == lane) taken |= 1u << (best / 32);
    if (lane == j) {
      my_id = best;
      my_weight = best_p;
    }
    kept += best_p;
  }
  if (lane < a.top_k) {
    a.ids[t * a.top_k + lane] = my_id;
    a.weights[t * a.top_k + lane] = a.normalize ? my_weight / kept : my_weight;
  }
}

// Routes every token, then lists each expert's pairs p = token * top_k + slot in token order (an
// expert is at most once among a token's picks, so at most `tokens` of them) and the picked experts
// in ascending order: the work of the grouped kernels, fixed without a host sync or an atomic.
template <typename T>
__global__ void __launch_bounds__(kRouteThreads) route_kernel(Launch a, const T* logits) {
  // A warp's exponentials while routing; then the pairs' experts, staged a slice at a time.
  constexpr int kStaged = kRouteWarps * static_cast<int>(kMoEMaxExperts);
  __shared__ union {
    float exps[kRouteWarps][kMoEMaxExperts];
    int32_t ids[kStaged];
  } s;
  __shared__ int32_t warp_picked[kRouteWarps];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  for (int64_t t = warp; t < a.tokens; t += kRouteWarps) route_token(a, logits, s.exps[warp], t);
  __syncthreads();  // also makes the block's global writes (ids) visible to all of it

  const int e = threadIdx.x;  // experts <= kRouteThreads
  const int pairs = static_cast<int>(a.tokens * a.top_k);
  int32_t* list = a.lists + e * a.tokens;
  int count = 0;
  for (int base = 0; base < pairs; base += kStaged) {
    const int n = min(kStaged, pairs - base);
    for (int i = threadIdx.x; i < n; i += kRouteThreads) s.ids[i] = a.ids[base + i];
    __syncthreads();
    if (e < a.experts)
      for (int i = 0; i < n; ++i)
        if (s.ids[i] == e) list[count++] = base + i;
    __syncthreads();
  }
  const bool picked = e < a.experts && count > 0;
  const unsigned ballot = __ballot_sync(0xffffffffu, picked);
  if (lane == 0) warp_picked[warp] = __popc(ballot);
  __syncthreads();
  int rank = __popc(ballot & ((1u << lane) - 1u)), total = 0;
  for (int w = 0; w < kRouteWarps; ++w) {
    rank += w < warp ? warp_picked[w] : 0;
    total += warp_picked[w];
  }
  if (picked) a.picked[rank] = e;
  if (e < a.experts) a.counts[e] = count;
  if (threadIdx.x == 0) a.picked[a.experts] = total;
}

template <typename T>
constexpr int kVec = 16 / static_cast<int>(sizeof(T));

// Elements k .. k + V - 1 of a row of n, as stored: one 16-byte load where the rows allow it
// (kVector), else one load each, zero past the row's end. The same values either way, so the sums
// below do not depend on which. Kept as stored until used: half the registers of floats.
template <typename T, bool kVector>
__device__ __forceinline__ uint4 load_span(const T* row, int64_t k, int64_t n) {
  if constexpr (kVector) {
    return __ldg(reinterpret_cast<const uint4*>(row + k));
  } else {
    uint4 raw = make_uint4(0, 0, 0, 0);  // zero bits: +0 in every T
    T* x = reinterpret_cast<T*>(&raw);
#pragma unroll
    for (int i = 0; i < kVec<T>; ++i)
      if (k + i < n) x[i] = __ldg(row + k + i);
    return raw;
  }
}

template <typename T>
__device__ __forceinline__ float element(const uint4& raw, int i) {
  return to_float(reinterpret_cast<const T*>(&raw)[i]);
}

__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) x += __shfl_xor_sync(0xffffffffu, x, offset);
  return x;
}

// acc[c][r] = rows[r] . inputs[c] over n elements, for up to kTokens inputs and kRows rows: each lane
// sums its own vectors (lane l: elements 32 V i + V l ..) in order, then the lanes by shuffles. That
// order depends on n alone, never on how many inputs there are: what makes the output batch-invariant.
template <typename T, bool kVector, int kRows>
__device__ __forceinline__ void dot_rows(const T* const (&rows)[kRows], const T* const (&inputs)[kTokens], int count,
                                         int64_t n, float (&acc)[kTokens][kRows]) {
  constexpr int V = kVec<T>;
#pragma unroll
  for (int c = 0; c < kTokens; ++c)
#pragma unroll
    for (int r = 0; r < kRows; ++r) acc[c][r] = 0.f;
#pragma unroll(kVector ? 2 : 1)  // two vectors a row in flight a lane
  for (int64_t k = (threadIdx.x % 32) * V; k < n; k += 32 * V) {
    uint4 w[kRows];
#pragma unroll
    for (int r = 0; r < kRows; ++r) w[r] = load_span<T, kVector>(rows[r], k, n);
#pragma unroll
    for (int c = 0; c < kTokens; ++c) {
      if (c >= count) break;
      const uint4 raw = load_span<T, kVector>(inputs[c], k, n);
      float x[V];
#pragma unroll
      for (int i = 0; i < V; ++i) x[i] = element<T>(raw, i);
#pragma unroll
      for (int r = 0; r < kRows; ++r)
#pragma unroll
        for (int i = 0; i < V; ++i) acc[c][r] += x[i] * element<T>(w[r], i);
    }
  }
#pragma unroll
  for (int c = 0; c < kTokens; ++c) {
    if (c >= count) break;
#pragma unroll
    for (int r = 0; r < kRows; ++r) acc[c][r] = warp_sum(acc[c][r]);
  }
}

// The picked expert of block row blockIdx.y and its pair count; -1 past the picked ones.
__device__ __forceinline__ int block_expert(const Launch& a, int* count) {
  if (static_cast<int>(blockIdx.y) >= a.picked[a.experts]) return -1;
  const int e = a.picked[blockIdx.y];
  *count = a.counts[e];
  return e;
}

// act[p, i] = silu(gate[e, i] . x) * (up[e, i] . x), rounded to T, for each pair p of expert e and
// the warp's kGateRows rows i.
template <typename T, bool kVector>
__global__ void __launch_bounds__(kThreads) gate_up_kernel(Launch a, const T* hidden, const T* gate_up) {
  int count = 0;
  const int e = block_expert(a, &count);
  const int64_t i0 = (static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32) * kGateRows;
  if (e < 0 || i0 >= a.inter) return;  // whole warps: dot_rows shuffles
  const int64_t h = a.hidden, n = a.inter;
  const T* rows[2 * kGateRows];
#pragma unroll
  for (int r = 0; r < kGateRows; ++r) {
    const int64_t i = min(i0 + r, n - 1);  // a row past the end repeats the last; not stored
    rows[r] = gate_up + (e * 2 * n + i) * h;
    rows[kGateRows + r] = rows[r] + n * h;
  }
  const int32_t* list = a.lists + e * a.tokens;
  T* act = static_cast<T*>(a.act);
  for (int c0 = 0; c0 < count; c0 += kTokens) {
    const int m = min(kTokens, count - c0);
    int32_t pair[kTokens];
    const T* x[kTokens];
#pragma unroll
    for (int c = 0; c < kTokens; ++c) {
      pair[c] = __ldg(list + c0 + min(c, m - 1));
      x[c] = hidden + pair[c] / a.top_k * h;
    }
    float acc[kTokens][2 * kGateRows];
    dot_rows<T, kVector>(rows, x, m, h, acc);
#pragma unroll
    for (int c = 0; c < kTokens; ++c) {
      if (c >= m) break;
      // One lane stores: picking a row's lane would index acc at run time (local memory).
#pragma unroll
      for (int r = 0; r < kGateRows; ++r)
        if (threadIdx.x % 32 == 0 && i0 + r < n)
          act[pair[c] * n + i0 + r] = from_float<T>(moe_silu(acc[c][r]) * acc[c][kGateRows + r]);
    }
  }
}

// partial[p, j] = down[e, j] . act[p] in float32, for each pair p of expert e and the warp's
// kDownRows rows j of H.
template <typename T, bool kVector>
__global__ void __launch_bounds__(kThreads) down_kernel(Launch a, const T* down) {
  int count = 0;
  const int e = block_expert(a, &count);
  const int64_t j0 = (static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32) * kDownRows;
  if (e < 0 || j0 >= a.hidden) return;  // whole warps: dot_rows shuffles
  const int64_t h = a.hidden, n = a.inter;
  const T* rows[kDownRows];
#pragma unroll
  for (int r = 0; r < kDownRows; ++r) rows[r] = down + (e * h + min(j0 + r, h - 1)) * n;
  const int32_t* list = a.lists + e * a.tokens;
  const T* act = static_cast<const T*>(a.act);
  for (int c0 = 0; c0 < count; c0 += kTokens) {
    const int m = min(kTokens, count - c0);
    int32_t pair[kTokens];
    const T* y[kTokens];
#pragma unroll
    for (int c = 0; c < kTokens; ++c) {
      pair[c] = __ldg(list + c0 + min(c, m - 1));
      y[c] = act + pair[c] * n;
    }
    float acc[kTokens][kDownRows];
    dot_rows<T, kVector>(rows, y, m, n, acc);
#pragma unroll
    for (int c = 0; c < kTokens; ++c) {
      if (c >= m) break;
#pragma unroll
      for (int r = 0; r < kDownRows; ++r)
        if (threadIdx.x % 32 == 0 && j0 + r < h) a.partial[pair[c] * h + j0 + r] = acc[c][r];
    }
  }
}

// Tensor-core forms of gate/up and down for 16-bit T (H and I multiples of 8, 16-byte aligned rows:
// mma_fits): `mma.sync` m16n8k16 (common/mma.cuh) with an expert's pairs as the 16 rows of A, up to
// 16 a pass, so a warp reads its weight rows once per 16 pairs, not per 4. Both operands come from
// global memory in 16-byte loads, a 32-wide slice of K at a time (mma_rows). A pair's sums run over
// K in one fixed order and a product's rows never mix, so a token's output still depends on neither
// the other tokens nor where its pairs sit in a pass.
constexpr int kPass = 16;  // pairs a pass: the 16 rows of A

// For each pass over an expert's `count` pairs (in list order), the products of its pairs' operand
// rows (row_of(pair)) with the warp's two weight tiles w over K = [0, n), 8 slices in flight, then
// store(pair, acc): pair[h] is the pair in this lane's row group + 8 h of the pass (-1 past the count),
// acc[t] its tile t's accumulator (rows group, group + 8; columns 2 quad, 2 quad + 1).
template <typename T, typename RowOf, typename Store>
__device__ __forceinline__ void mma_passes(const int32_t* list, int count, RowOf row_of, const T* const (&w)[2],
                                           int64_t n, Store store) {
  const int lane = threadIdx.x % 32;
  for (int c0 = 0; c0 < count; c0 += kPass) {
    int32_t pair[2];
    const T* rows[1][2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int at = c0 + lane / 4 + 8 * h;
      pair[h] = at < count ? __ldg(list + at) : -1;
      rows[0][h] = pair[h] < 0 ? nullptr : row_of(pair[h]) + 8 * (lane % 4);
    }
    float acc[1][2][4] = {};
    mma_rows<T, 1, 2, 8>(rows, w, 0, n, acc);
    store(pair, acc[0]);
  }
}

// act[p, i] = silu(gate[e, i] . x) * (up[e, i] . x), rounded to T: a warp's 8 rows i of I, their
// gate rows as one 8-column tile and their up rows as another, so a lane holds both of an element.
template <typename T>
__global__ void __launch_bounds__(kThreads) gate_up_mma_kernel(Launch a, const T* hidden, const T* gate_up) {
  int count = 0;
  const int e = block_expert(a, &count);
  const int lane = threadIdx.x % 32, group = lane / 4, quad = lane % 4;
  const int64_t i0 = (static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32) * 8;
  if (e < 0 || i0 >= a.inter) return;  // whole warps: mma.sync
  const int64_t h = a.hidden, n = a.inter;
  const T* gate = gate_up + (e * 2 * n + i0 + group) * h + 8 * quad;  // I % 8 == 0: every row is there
  const T* const w[2] = {gate, gate + n * h};
  T* act = static_cast<T*>(a.act);
  mma_passes(a.lists + e * a.tokens, count, [&](int32_t p) { return hidden + p / a.top_k * h; }, w, h,
             [&](const int32_t (&pair)[2], const float (&acc)[2][4]) {
#pragma unroll
               for (int r = 0; r < 2; ++r)  // accumulator row group (+ 8), columns 2 quad, 2 quad + 1
                 if (pair[r] >= 0)
                   *reinterpret_cast<uint32_t*>(act + pair[r] * n + i0 + 2 * quad) = pack<T>(
                       moe_silu(acc[0][2 * r]) * acc[1][2 * r], moe_silu(acc[0][2 * r + 1]) * acc[1][2 * r + 1]);
             });
}

// partial[p, j] = down[e, j] . act[p] in float32: a warp's 16 rows j of H, two 8-column tiles.
template <typename T>
__global__ void __launch_bounds__(kThreads) down_mma_kernel(Launch a, const T* down) {
  int count = 0;
  const int e = block_expert(a, &count);
  const int lane = threadIdx.x % 32, group = lane / 4, quad = lane % 4;
  const int64_t j0 = (static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32) * 16;
  if (e < 0 || j0 >= a.hidden) return;  // whole warps: mma.sync
  const int64_t h = a.hidden, n = a.inter;
  // H % 8 == 0: a tile is all there or all past H (that one repeats the last row; not stored).
  const T* const w[2] = {down + (e * h + j0 + group) * n + 8 * quad,
                         down + (e * h + min(j0 + 8 + group, h - 1)) * n + 8 * quad};
  const T* act = static_cast<const T*>(a.act);
  mma_passes(a.lists + e * a.tokens, count, [&](int32_t p) { return act + p * n; }, w, n,
             [&](const int32_t (&pair)[2], const float (&acc)[2][4]) {
#pragma unroll
               for (int r = 0; r < 2; ++r)
#pragma unroll
                 for (int t = 0; t < 2; ++t)
                   if (pair[r] >= 0 && j0 + 8 * t < h)
                     *reinterpret_cast<float2*>(a.partial + pair[r] * h + j0 + 8 * t + 2 * quad) =
                         make_float2(acc[t][2 * r], acc[t][2 * r + 1]);
             });
}

// out[t, j] = sum over slots s in order of weight[t, s] * partial[t * top_k + s, j], rounded to T once.
template <typename T>
__global__ void __launch_bounds__(kCombineThreads) combine_kernel(Launch a, T* out) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * kCombineThreads + threadIdx.x;
  if (idx >= a.tokens * a.hidden) return;
  const int64_t t = idx / a.hidden, j = idx % a.hidden;
  float sum = 0.f;
  for (int64_t slot = 0; slot < a.top_k; ++slot) {
    const int64_t p = t * a.top_k + slot;
    // NaN logits make every probability NaN and the routing rule picks nothing: NaN out, as HF gives.
    sum = a.ids[p] < 0 ? NAN : sum + a.weights[p] * a.partial[p * a.hidden + j];
  }
  out[idx] = from_float<T>(sum);
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

template <typename T>
cudaError_t launch_typed(const MoEShape& s, bool normalize, const T* hidden, const T* logits, const T* gate_up,
                         const T* down, char* workspace, T* out, cudaStream_t stream) {
  const MoEScratch w = moe_scratch(s);
  const int64_t h = s.hidden, n = s.inter;
  // 16-byte loads where every row starts on 16 bytes; the sums are the same either way.
  const bool vector_h = h % kVec<T> == 0 && aligned16(hidden) && aligned16(gate_up);
  const bool vector_i = n % kVec<T> == 0 && aligned16(down) && aligned16(workspace + w.act);
  // Tensor cores for 16-bit T where both projections' rows are whole 16-byte vectors.
  const bool mma = !std::is_same_v<T, float> && vector_h && vector_i && h % 8 == 0 && n % 8 == 0;
  const auto gate_up_launch = vector_h ? gate_up_kernel<T, true> : gate_up_kernel<T, false>;
  const auto down_launch = vector_i ? down_kernel<T, true> : down_kernel<T, false>;
  for (int64_t t0 = 0; t0 < s.tokens; t0 += kMoETokensPerLaunch) {
    const int64_t tokens = std::min(kMoETokensPerLaunch, s.tokens - t0);
    const Launch a{tokens,
                   h,
                   s.experts,
                   n,
                   s.top_k,
                   normalize,
                   reinterpret_cast<int32_t*>(workspace + w.ids),
                   reinterpret_cast<int32_t*>(workspace + w.counts),
                   reinterpret_cast<int32_t*>(workspace + w.picked),
                   reinterpret_cast<int32_t*>(workspace + w.lists),
                   reinterpret_cast<float*>(workspace + w.weights),
                   reinterpret_cast<float*>(workspace + w.partial),
                   workspace + w.act};
    const auto slots = static_cast<unsigned>(std::min(tokens * s.top_k, s.experts));  // experts it may pick
    route_kernel<T><<<1, kRouteThreads, 0, stream>>>(a, logits + t0 * s.experts);
    if constexpr (!std::is_same_v<T, float>) {
      if (mma) {
        const auto gate_blocks = static_cast<unsigned>((n + kWarps * 8 - 1) / (kWarps * 8));
        gate_up_mma_kernel<T><<<dim3(gate_blocks, slots), kThreads, 0, stream>>>(a, hidden + t0 * h, gate_up);
        const auto down_blocks = static_cast<unsigned>((h + kWarps * 16 - 1) / (kWarps * 16));
        down_mma_kernel<T><<<dim3(down_blocks, slots), kThreads, 0, stream>>>(a, down);
      }
    }
    if (!mma) {
      const int64_t gate_blocks = (n + kWarps * kGateRows - 1) / (kWarps * kGateRows);
      gate_up_launch<<<dim3(static_cast<unsigned>(gate_blocks), slots), kThreads, 0, stream>>>(a, hidden + t0 * h,
                                                                                                 gate_up);
      const int64_t down_blocks = (h + kWarps * kDownRows - 1) / (kWarps * kDownRows);
      down_launch<<<dim3(static_cast<unsigned>(down_blocks), slots), kThreads, 0, stream>>>(a, down);
    }
    const int64_t combine_blocks = (tokens * h + kCombineThreads - 1) / kCombineThreads;
    combine_kernel<T><<<static_cast<unsigned>(combine_blocks), kCombineThreads, 0, stream>>>(a, out + t0 * h);
    if (const cudaError_t status = cudaGetLastError(); status != cudaSuccess) return status;
  }
  return cudaSuccess;
}

}  // namespace

cudaError_t moe_launch(const MoEShape& s, DType dtype, bool normalize, const void* hidden, const void* router_logits,
                       const void* gate_up, const void* down, void* workspace, void* out, cudaStream_t stream) {
  if (moe_unsupported(s) != nullptr) return cudaErrorInvalidValue;
  if (s.tokens == 0) return cudaSuccess;
  return dispatch_dtype(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    return launch_typed<T>(s, normalize, static_cast<const T*>(hidden), static_cast<const T*>(router_logits),
                           static_cast<const T*>(gate_up), static_cast<const T*>(down),
                           static_cast<char*>(workspace), static_cast<T*>(out), stream);
  });
}

}  // namespace dflash

// Tensor-core products by `mma.sync` m16n8k16 with float32 accumulators, for 16-bit T (float16 or
// bfloat16), whose register layout the PTX ISA documents: with group = lane / 4 and quad = lane % 4,
// A (16x16, row-major) registers a0..a3 hold rows group, group + 8, group, group + 8 at columns
// 2 quad (+1), 2 quad (+1), 2 quad + 8 (+9), 2 quad + 8 (+9); B (16x8, column-major) registers b0, b1
// hold column `group` at rows 2 quad (+1) and 2 quad + 8 (+9); D (16x8) holds rows group (d0, d1) and
// group + 8 (d2, d3) at columns 2 quad (+1). Each register packs two values, the lower index in the
// low half. Included by the .cu files only.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

namespace dflash {

// d += a b.
template <typename T>
__device__ __forceinline__ void mma_16816(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                          uint32_t b0, uint32_t b1) {
  static_assert(std::is_same_v<T, __nv_bfloat16> || std::is_same_v<T, __half>, "16-bit operands");
  if constexpr (std::is_same_v<T, __nv_bfloat16>)
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  else
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

template <typename T>
__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  mma_16816<T>(d, a[0], a[1], a[2], a[3], b0, b1);
}

// One 32-wide slice of K with both operands in 16-byte loads: the lane of quad q holds 8 consecutive
// values (8q..8q+7 of the slice) of its two A rows (lo: row group, hi: group + 8) and of its B column
// `group`, and uses them as the logical k = 2q, 2q+1, 2q+8, 2q+9 of two k16 steps, exactly the
// registers the layout above gives each lane. A and B are permuted alike, so acc gains the same sum
// over the slice, in an order that depends on nothing but K.
template <typename T>
__device__ __forceinline__ void mma_slice(float (&acc)[4], const uint4& lo, const uint4& hi, const uint4& w) {
  mma_16816<T>(acc, lo.x, hi.x, lo.y, hi.y, w.x, w.y);
  mma_16816<T>(acc, lo.z, hi.z, lo.w, hi.w, w.z, w.w);
}

// 16 bytes at p through the read-only cache, or zeros where `ok` is false (p is then never read).
__device__ __forceinline__ uint4 load16(const void* p, bool ok) {
  return ok ? __ldg(static_cast<const uint4*>(p)) : make_uint4(0, 0, 0, 0);
}

// acc[i][t] += (A rows of tile i) x (weight tile t)^T over K = [k_begin, k_end), a 32-wide slice at a time
// (mma_slice), the weights of SLICES slices all in flight before their products. rows[i][h]: this
// lane's A row group + 8 h of tile i (null: a row past the call's, zeros); w[t]: its column `group` of
// weight tile t; both offset to the lane's 8 values (8 * quad) and 16-byte aligned, and k_end - k_begin
// a multiple of 8 (K past k_end reads zeros).
template <typename T, int RM, int kTiles, int SLICES>
__device__ __forceinline__ void mma_rows(const T* const (&rows)[RM][2], const T* const (&w)[kTiles], int64_t k_begin,
                                         int64_t k_end, float (&acc)[RM][kTiles][4]) {
  constexpr int kSlice = 32;
  const int quad = threadIdx.x % 4;
  for (int64_t k0 = k_begin; k0 < k_end; k0 += SLICES * kSlice) {
    uint4 wv[SLICES][kTiles];
#pragma unroll
    for (int j = 0; j < SLICES; ++j) {
      const int64_t k = k0 + j * kSlice;
#pragma unroll
      for (int t = 0; t < kTiles; ++t) wv[j][t] = load16(w[t] + k, k + 8 * quad < k_end);
    }
#pragma unroll
    for (int j = 0; j < SLICES; ++j) {
      const int64_t k = k0 + j * kSlice;
      if (k >= k_end) break;
      const bool ok = k + 8 * quad < k_end;
#pragma unroll
      for (int i = 0; i < RM; ++i) {
        const uint4 lo = load16(rows[i][0] + k, ok && rows[i][0] != nullptr);
        const uint4 hi = load16(rows[i][1] + k, ok && rows[i][1] != nullptr);
#pragma unroll
        for (int t = 0; t < kTiles; ++t) mma_slice<T>(acc[i][t], lo, hi, wv[j][t]);
      }
    }
  }
}

// Two float32 values as a packed pair of T (the first in the low half, as mma operands hold them).
template <typename T>
__device__ __forceinline__ uint32_t pack(float lo, float hi) {
  uint32_t out;
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    const __nv_bfloat162 pair = __floats2bfloat162_rn(lo, hi);
    memcpy(&out, &pair, sizeof out);
  } else {
    const __half2 pair = __floats2half2_rn(lo, hi);
    memcpy(&out, &pair, sizeof out);
  }
  return out;
}

}  // namespace dflash

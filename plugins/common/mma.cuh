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

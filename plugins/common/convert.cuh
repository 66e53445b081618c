// Device-side loads and stores between the kernels' storage types and float32, the type every
// dflash kernel computes in. Included by the .cu files only.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace dflash {

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ __half from_float<__half>(float x) {
  return __float2half_rn(x);
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

// Read-only loads through the non-coherent cache: every kernel input is read-only for its launch.
template <typename T>
__device__ __forceinline__ float load(const T* p) {
  return to_float(__ldg(p));
}

}  // namespace dflash

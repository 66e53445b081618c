// Device-side loads and stores between the kernels' storage types and float32, the type every
// dflash kernel computes in. Included by the .cu files only.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include "common/dtype.h"

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

// Calls launch(TypeTag<T>{}) with T the storage type `dtype` names: one switch for every launcher.
template <typename T>
struct TypeTag {
  using type = T;
};

template <typename Launch>
cudaError_t dispatch_dtype(DType dtype, Launch&& launch) {
  switch (dtype) {
    case DType::kFloat32:
      return launch(TypeTag<float>{});
    case DType::kFloat16:
      return launch(TypeTag<__half>{});
    case DType::kBFloat16:
      return launch(TypeTag<__nv_bfloat16>{});
  }
  return cudaErrorInvalidValue;
}

}  // namespace dflash

// The element types the dflash CUDA kernels take, as our own enum: kernels and their launchers hold
// no TensorRT (or ONNX Runtime) types; each wrapper maps its framework's dtype onto this.
#pragma once

#include <cstddef>
#include <cstdint>

namespace dflash {

// Floating tensors of one op call all share one of these; kernels accumulate in float32 whatever it is.
enum class DType : int32_t { kFloat32 = 0, kFloat16 = 1, kBFloat16 = 2 };

inline size_t dtype_size(DType dtype) { return dtype == DType::kFloat32 ? 4 : 2; }

}  // namespace dflash

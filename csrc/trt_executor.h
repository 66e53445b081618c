// trt_executor.h: the TensorRT Executor over a graph-contract-2 engine bundle (`dflash-trt build
// --engine tensorrt` of a `--flavour slots-trt` export): the slot executor (slot_executor.h) with
// TensorRT engines as its graphs and a CUDA device holding every slot buffer (trt_api.h).
//
// Compiled when the TensorRT and CUDA headers are present (DFLASH_WITH_TRT); TensorRT and the CUDA
// driver are loaded at run time, so the core builds and imports on machines without either.
#pragma once

#include "slot_executor.h"

namespace dflash {

class TrtExecutor final : public SlotExecutor {
 public:
  explicit TrtExecutor(const SlotExecutorConfig& config);
};

}  // namespace dflash

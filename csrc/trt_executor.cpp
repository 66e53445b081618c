// trt_executor.cpp: the TensorRT backend under the slot executor.
#include "trt_executor.h"

#include <memory>

#include "trt_api.h"

namespace dflash {

namespace {

constexpr char kWhy[] = "the C++ TensorRT executor";

// Every check before the GPU or TensorRT is touched: refusals come before any work.
std::unique_ptr<GraphBackend> checked_backend(const SlotExecutorConfig& config) {
  config.validate(kWhy);
  return std::make_unique<trt::TrtBackend>(config.library_path, config.driver_path, config.cuda_graphs);
}

}  // namespace

TrtExecutor::TrtExecutor(const SlotExecutorConfig& config) : SlotExecutor(config, checked_backend(config), kWhy) {}

}  // namespace dflash

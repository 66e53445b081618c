// ort_executor.h: the onnxruntime Executor over a graph-contract-2 ("slots") bundle: the slot
// executor (slot_executor.h) with onnxruntime's CPU provider as its graph backend.
//
// Every graph is a CPU session over host memory, so the slot buffers are host memory and each
// phase binds them directly through an IOBinding (no staging copies). float32 and float16 bundles:
// onnxruntime's CPU GroupQueryAttention has no bfloat16 kernel, so a bfloat16 bundle is refused
// before anything loads. Every phase runs without Python.
#pragma once

#include <memory>
#include <string>

#include "ort_api.h"
#include "slot_executor.h"

namespace dflash {

class OrtBackend final : public GraphBackend {
 public:
  OrtBackend(const std::string& library_path, int64_t threads);
  Device& device() override { return host_; }
  std::unique_ptr<Graph> open(const std::string& path) override;
  std::string name() const override { return "onnxruntime"; }
  std::string version() const override { return runtime_->version(); }

 private:
  HostDevice host_;
  std::shared_ptr<ort::Runtime> runtime_;
  int64_t threads_;
};

class OrtExecutor final : public SlotExecutor {
 public:
  explicit OrtExecutor(const SlotExecutorConfig& config);
};

}  // namespace dflash

// trt_api.h: TensorRT, loaded at run time, as a slot executor's backend on a CudaDevice.
//
// Compiled only when setup.py finds the TensorRT headers (scripts/fetch_headers.sh trt) and the
// CUDA headers (DFLASH_WITH_TRT); nothing links to TensorRT or CUDA. At run time we dlopen the
// TensorRT library whose major version the headers name (libnvinfer.so.<major>;
// dflash_trt/runtime/ort_executor.py finds it) and take `createInferRuntime_INTERNAL` from it, which
// is what the headers' inline `createInferRuntime` calls. Engines run on the device's stream.
#pragma once

#include <NvInferRuntime.h>

#include <memory>
#include <string>
#include <vector>

#include "cuda_device.h"
#include "graph.h"

namespace dflash::trt {

// TensorRT's messages; the last error is added to the exception a failed call raises.
class Logger final : public nvinfer1::ILogger {
 public:
  void log(Severity severity, const char* message) noexcept override;
  std::string last_error() const { return last_error_; }

 private:
  std::string last_error_;
};

class TrtBackend final : public GraphBackend {
 public:
  // cuda_graphs: decode-sized runs captured as CUDA graphs around enqueueV3 (TrtGraph)
  TrtBackend(const std::string& library_path, const std::string& driver_path, bool cuda_graphs = true);
  ~TrtBackend() override;
  Device& device() override { return *device_; }
  std::unique_ptr<Graph> open(const std::string& path) override;
  std::string name() const override { return "TensorRT"; }
  std::string version() const override { return version_; }

 private:
  std::unique_ptr<CudaDevice> device_;  // first: no TensorRT work without a GPU
  Logger logger_;
  void* library_ = nullptr;
  nvinfer1::IRuntime* runtime_ = nullptr;
  std::string version_;
  bool cuda_graphs_;
};

}  // namespace dflash::trt

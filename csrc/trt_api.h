// trt_api.h: TensorRT and the CUDA driver, both loaded at run time, as a slot executor's backend.
//
// Compiled only when setup.py finds the TensorRT headers (scripts/fetch_headers.sh trt) and the
// CUDA headers (DFLASH_WITH_TRT); nothing links to TensorRT or CUDA. At run time we dlopen the CUDA
// driver (libcuda.so.1, present wherever an NVIDIA driver is) and the TensorRT library whose major
// version the headers name (libnvinfer.so.<major>; dflash_trt/runtime/ort_executor.py finds it),
// and take `createInferRuntime_INTERNAL` from it, which is what the headers' inline
// `createInferRuntime` calls. Device memory comes from the driver's primary context of device 0
// (the one the CUDA runtime inside TensorRT uses too) and every copy and run goes on one stream, so
// a phase's calls are ordered without any synchronisation but the one before the host reads.
#pragma once

#include <NvInferRuntime.h>
#include <cuda.h>

#include <memory>
#include <string>
#include <vector>

#include "graph.h"

namespace dflash::trt {

// The CUDA driver calls the device needs, resolved from libcuda.so.1.
struct Driver;

// Device memory on one stream of the primary context.
class CudaDevice final : public Device {
 public:
  // The driver library at `driver_path` (libcuda.so.1); one line (dflash::Error) without a driver or a GPU.
  explicit CudaDevice(const std::string& driver_path);
  ~CudaDevice() override;
  bool is_host() const override { return false; }
  void* allocate(size_t bytes) override;
  void free(void* p) noexcept override;
  void copy(void* dst, const void* src, size_t bytes) override;
  void copy_rows(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t width,
                 size_t rows) override;
  void upload(void* dst, const void* src, size_t bytes) override;
  void download(void* dst, const void* src, size_t bytes) override;
  void zero(void* dst, size_t bytes) override;
  void synchronize() override;
  CUstream stream() const { return stream_; }

 private:
  void check(CUresult result, const char* what) const;
  void bind() const;  // our context current on the calling thread
  std::shared_ptr<const Driver> driver_;
  CUcontext context_ = nullptr;
  CUstream stream_ = nullptr;
};

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
  TrtBackend(const std::string& library_path, const std::string& driver_path);
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
};

}  // namespace dflash::trt

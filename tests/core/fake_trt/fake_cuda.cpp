// A fake CUDA driver (libcuda.so.1) for the C++ TensorRT executor's tests on a CPU: the calls
// csrc/trt_api.cpp resolves, over host memory ("device" pointers are host pointers), each copy done
// at once (the one stream is then trivially ordered). Memory calls need a current context on the calling
// thread, as the real driver's do. fake_cuda_live() counts live allocations, so a
// test can see that an executor frees every buffer it made.
#include <cuda.h>

#include <atomic>
#include <cstdlib>
#include <cstring>

#define EXPORT extern "C" __attribute__((visibility("default")))

namespace {
std::atomic<long> live{0};
// Like the real driver, memory calls act on the calling thread's current context: none, none work.
thread_local CUcontext current = nullptr;
}

#define NEEDS_CONTEXT \
  if (!current) return CUDA_ERROR_INVALID_CONTEXT

EXPORT long fake_cuda_live() { return live.load(); }
EXPORT CUresult cuInit(unsigned int) { return CUDA_SUCCESS; }
EXPORT CUresult cuDeviceGet(CUdevice* device, int ordinal) {
  *device = ordinal;
  return ordinal == 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE;
}
EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext* context, CUdevice) {
  static int primary;
  *context = reinterpret_cast<CUcontext>(&primary);
  return CUDA_SUCCESS;
}
EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice) { return CUDA_SUCCESS; }
EXPORT CUresult cuCtxSetCurrent(CUcontext context) {
  current = context;
  return CUDA_SUCCESS;
}
EXPORT CUresult cuStreamCreate(CUstream* stream, unsigned int) {
  static int one;
  *stream = reinterpret_cast<CUstream>(&one);
  return CUDA_SUCCESS;
}
EXPORT CUresult cuStreamDestroy_v2(CUstream) { return CUDA_SUCCESS; }
EXPORT CUresult cuStreamSynchronize(CUstream) {
  NEEDS_CONTEXT;
  return CUDA_SUCCESS;
}
EXPORT CUresult cuMemAlloc_v2(CUdeviceptr* p, size_t bytes) {
  NEEDS_CONTEXT;
  void* memory = std::malloc(bytes);
  if (!memory) return CUDA_ERROR_OUT_OF_MEMORY;
  std::memset(memory, 0xA5, bytes);  // garbage, as cuMemAlloc's memory is: the executor must zero it
  *p = reinterpret_cast<CUdeviceptr>(memory);
  ++live;
  return CUDA_SUCCESS;
}
EXPORT CUresult cuMemFree_v2(CUdeviceptr p) {
  NEEDS_CONTEXT;
  std::free(reinterpret_cast<void*>(p));
  --live;
  return CUDA_SUCCESS;
}
EXPORT CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t bytes, CUstream) {
  NEEDS_CONTEXT;
  std::memmove(reinterpret_cast<void*>(dst), reinterpret_cast<void*>(src), bytes);
  return CUDA_SUCCESS;
}
EXPORT CUresult cuMemcpy2DAsync_v2(const CUDA_MEMCPY2D* copy, CUstream) {
  NEEDS_CONTEXT;
  if (copy->srcMemoryType != CU_MEMORYTYPE_DEVICE || copy->dstMemoryType != CU_MEMORYTYPE_DEVICE ||
      copy->WidthInBytes > copy->srcPitch || copy->WidthInBytes > copy->dstPitch)
    return CUDA_ERROR_INVALID_VALUE;  // what the real driver refuses too
  for (size_t r = 0; r < copy->Height; ++r)
    std::memmove(reinterpret_cast<char*>(copy->dstDevice) + copy->dstXInBytes + (copy->dstY + r) * copy->dstPitch,
                 reinterpret_cast<const char*>(copy->srcDevice) + copy->srcXInBytes + (copy->srcY + r) * copy->srcPitch,
                 copy->WidthInBytes);
  return CUDA_SUCCESS;
}
EXPORT CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void* src, size_t bytes, CUstream) {
  NEEDS_CONTEXT;
  std::memcpy(reinterpret_cast<void*>(dst), src, bytes);
  return CUDA_SUCCESS;
}
EXPORT CUresult cuMemcpyDtoHAsync_v2(void* dst, CUdeviceptr src, size_t bytes, CUstream) {
  NEEDS_CONTEXT;
  std::memcpy(dst, reinterpret_cast<void*>(src), bytes);
  return CUDA_SUCCESS;
}
EXPORT CUresult cuMemsetD8Async(CUdeviceptr p, unsigned char value, size_t bytes, CUstream) {
  NEEDS_CONTEXT;
  std::memset(reinterpret_cast<void*>(p), value, bytes);
  return CUDA_SUCCESS;
}
EXPORT CUresult cuGetErrorString(CUresult, const char** message) {
  *message = "fake CUDA error";
  return CUDA_SUCCESS;
}

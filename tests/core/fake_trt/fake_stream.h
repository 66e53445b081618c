// The fake CUDA driver's stream (fake_cuda.cpp), as the other fakes see a CUstream / cudaStream_t: work
// queued on it runs in order at a synchronisation, so a fake library that runs work of its own on the
// stream (fake_nvinfer.cpp's enqueueV3, the test's Python graphs) first runs what is queued before it.
#pragma once

struct FakeStream {
  void (*flush)();
};

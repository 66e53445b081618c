// The fake CUDA driver's stream (fake_cuda.cpp), as the other fakes see a CUstream / cudaStream_t: work
// queued on it runs in order at a synchronisation, so a fake library that runs work of its own on the
// stream (fake_nvinfer.cpp's enqueueV3, the test's Python graphs) first runs what is queued before it.
#pragma once

#include <functional>

// While a CUDA graph is being captured (cuStreamBeginCapture on the fake stream), work is recorded into
// the graph instead of running: a fake library queues its own work with `enqueue`, which records it then
// and queues it otherwise (to run at the next flush, after what was queued before it).
struct FakeStream {
  void (*flush)();
  bool (*capturing)();
  void (*enqueue)(std::function<void()> work);
};

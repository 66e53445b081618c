// cuda_device.h: GPU memory for the slot executor through the CUDA driver, loaded at run time.
//
// Compiled when setup.py finds the CUDA toolkit's headers (cuda.h: DFLASH_WITH_CUDA); nothing links
// to CUDA. At run time we dlopen the driver (libcuda.so.1, present wherever an NVIDIA driver is).
// Memory comes from the primary context of device 0, the one the CUDA runtime inside TensorRT and
// PyTorch use too, so their kernels read our buffers; every copy goes on one stream, which the graph
// backends also run on, so a phase's calls are ordered without any synchronisation but the one
// before the host reads.
#pragma once

#include <cuda.h>

#include <functional>
#include <memory>
#include <string>

#include "device.h"

namespace dflash {

// The CUDA driver calls the device needs, resolved from libcuda.so.1.
struct Driver;

// Device memory on one stream of the primary context.
class CudaDevice final : public Device {
 public:
  // The driver library at `driver_path` (libcuda.so.1); one line (dflash::Error, naming `who`) without
  // a driver or a GPU.
  CudaDevice(const std::string& driver_path, const std::string& who);
  ~CudaDevice() override;
  bool is_host() const override { return false; }
  void* allocate(size_t bytes) override;
  void free(void* p) noexcept override;
  void copy(void* dst, const void* src, size_t bytes) override;
  void copy_rows(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t width,
                 size_t rows) override;
  void upload(void* dst, const void* src, size_t bytes) override;
  void download(void* dst, const void* src, size_t bytes) override;
  void* host_allocate(size_t bytes) override;  // page-locked (cuMemHostAlloc)
  void host_free(void* p) noexcept override;
  void zero(void* dst, size_t bytes) override;
  void synchronize() override;
  bool decides() const override;  // where setup.py built decide_kernel.cu (nvcc found)
  void penalize(float* logits, int64_t vocab, const PenaltyRow* rows, int64_t count, int64_t positions,
                const PenaltyEntry* entries, const int32_t* tokens, const uint32_t* masks) override;
  void decide(const float* logits, int64_t vocab, const DecideRow* rows, int64_t count, int64_t positions,
              const int64_t* drafts, const DraftQ& drafter, float* probs, int32_t* order, Verdict* out,
              TokenLogprob* logprobs) override;
  void score(const float* logits, int64_t vocab, const DecideRow* rows, int64_t count, int64_t positions,
             const int64_t* drafts, const Verdict* verdicts, int32_t* order, TokenLogprob* logprobs) override;
  void draw_drafts(const float* scores, const int64_t* columns, int64_t top_k, const DecideRow* rows, int64_t count,
                   int64_t drafts, const int64_t* ids, const DraftQ& q, float* probs, int32_t* order,
                   int64_t* tokens) override;
  void rebuild_states(const StateRebuild& job) override;  // state_kernel.cu (built with the decision kernels)
  CUstream stream() const { return stream_; }
  // A CUDA graph of the work enqueue() queues on this stream (captured, not run), instantiated; null if
  // enqueue() said it failed or the driver could not capture or instantiate it: that work was not
  // queued, so the caller queues it again eagerly.
  CUgraphExec capture(const std::function<bool()>& enqueue);
  void launch(CUgraphExec graph);  // queues the graph's work on this stream
  void destroy(CUgraphExec graph) noexcept;

  static constexpr unsigned kDecideThreads = 512;  // decide_kernel.cu's kThreads (its block-wide kernels)
  // The most (row, position) pairs dflash_target_tokens_wide decides: one wave of clusters of 8 blocks
  // (of 512 threads, 128 registers: a block an SM). On an H200, 16 pairs (1 row x 16) took 0.26 ms
  // against 0.45 with a block each at T=0.8; 32 (2 rows) with clusters took longer than 8 rows' 128 blocks.
  static constexpr int64_t kWidePairs = 16;
  // The threads of a block-per-pair decision kernel for `pairs` blocks: kDecideThreads while they fit one
  // block an SM; past that, half as many, two blocks an SM (each block's result is the same whatever its
  // threads: decide.h), so the blocks past the SMs run beside the others, not in a wave after them.
  unsigned decide_threads(int64_t pairs) const;

 private:
  void check(CUresult result, const char* what) const;
  void bind() const;  // our context current on the calling thread
  void load_decide_module();  // the decision kernels, once
  // A decision kernel with a block per (row, y) pair of its grid, or, where its cluster form `wide`
  // exists (null: none) and the pairs are at most wide_pairs_, that form with a cluster per pair.
  void launch_pairs(CUfunction block, CUfunction wide, int64_t rows, int64_t y, void** args, const char* what);
  std::string who_;
  std::shared_ptr<const Driver> driver_;
  CUcontext context_ = nullptr;
  CUstream stream_ = nullptr;
  CUmodule module_ = nullptr;  // the decision kernels', loaded at the first decide
  CUfunction tokens_ = nullptr;
  CUfunction tokens_wide_ = nullptr;  // null where the GPU's image lacks it (before SM 9.0)
  int64_t wide_pairs_ = kWidePairs;  // DFLASH_DECIDE_WIDE_PAIRS overrides it (benchmarks)
  int64_t sms_ = 0;                  // GPU 0's streaming multiprocessors
  unsigned decide_threads_ = 0;      // DFLASH_DECIDE_THREADS: decide_threads' answer always (benchmarks)
  CUfunction decide_ = nullptr;
  CUfunction logprobs_ = nullptr;
  CUfunction draw_ = nullptr;
  CUfunction draw_wide_ = nullptr;  // as tokens_wide_
  CUfunction penalize_ = nullptr;
  static constexpr unsigned kPenaltyThreads = 256;  // a position's history, strided over a block
  CUmodule state_module_ = nullptr;  // the state kernels', loaded at the first partial commit
  CUfunction rebuild_delta_ = nullptr;
  CUfunction rebuild_conv_ = nullptr;
};

}  // namespace dflash

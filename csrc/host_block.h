// host_block.h: a CUDA block's semantics on host threads, so that decide.h's block code (what the decision
// kernel runs with BlockThreads: strided loops, barriers, shared-memory atomics, the bitonic sort) runs with
// many threads on a CPU. Tests only (bindings.cpp's block_* functions): it proves the block algorithm and
// its barriers, not the CUDA compiler or a GPU.
#pragma once

#include <pthread.h>

#include <cstdint>
#include <thread>
#include <vector>

#include "decide.h"

namespace dflash {

struct HostBlock {
  static int id() { return id_; }
  // the chunk walkers in reverse: like a cluster's (decide_kernel.cu), not the ids' order
  static int worker() { return count_ - 1 - id_; }
  static int count() { return count_; }
  static void sync() { pthread_barrier_wait(&barrier_); }  // a full memory barrier, as __syncthreads
  static unsigned add(unsigned* at, unsigned value) { return __atomic_fetch_add(at, value, __ATOMIC_SEQ_CST); }
  static void sort(int32_t* order, int64_t n, const float* p) { decide_detail::bitonic_sort<HostBlock>(order, n, p); }

  // Runs body() on `threads` threads at once (1..kMaxThreads), as one block; one block at a time.
  template <class Body>
  static void run(int threads, Body body) {
    count_ = threads;
    pthread_barrier_init(&barrier_, nullptr, unsigned(threads));
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t)
      pool.emplace_back([t, &body] {
        id_ = t;
        body();
      });
    for (std::thread& thread : pool) thread.join();
    pthread_barrier_destroy(&barrier_);
  }

 private:
  static inline thread_local int id_ = 0;
  static inline int count_ = 1;
  static inline pthread_barrier_t barrier_;
};

}  // namespace dflash

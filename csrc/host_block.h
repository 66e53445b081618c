// host_block.h: a CUDA block's semantics on host threads, so that decide.h's block code (what the decision
// kernel runs with BlockThreads: strided loops, barriers, shared-memory atomics, the bitonic sort) runs with
// many threads on a CPU; split into `blocks` groups, a cluster's (ClusterThreads: each group adds its radix
// bins apart and gathers them into the shared ones). Tests only (bindings.cpp's block_* functions): it
// proves the block algorithm and its barriers, not the CUDA compiler or a GPU.
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
  // group g > 0 adds into bins of its own, gathered into s.bins (group 0's) after a pass
  static unsigned (*bins(RowShared& s))[256] { return group() == 0 ? s.bins : own_bins_[group()].bins; }
  static void clear_bins(RowShared& s, int ways) {
    unsigned (*mine)[256] = bins(s);
    for (int b = id_ % group_size(); b < 256 * ways; b += group_size()) mine[b / 256][b % 256] = 0;
  }
  static void gather_bins(RowShared& s, int ways) {
    sync();
    if (group() == 0) return;
    for (int b = id_ % group_size(); b < 256 * ways; b += group_size())
      if (const unsigned value = own_bins_[group()].bins[b / 256][b % 256]) add(&s.bins[b / 256][b % 256], value);
  }

  // Runs body() on `threads` threads at once (1..kMaxThreads), as one block split into `blocks` groups
  // (a divisor of threads); one at a time.
  template <class Body>
  static void run(int threads, Body body, int blocks = 1) {
    count_ = threads;
    blocks_ = blocks;
    own_bins_.assign(size_t(blocks), GroupBins{});
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
  struct GroupBins {
    unsigned bins[2][256];
  };
  static int group_size() { return count_ / blocks_; }
  static int group() { return id_ / group_size(); }
  static inline thread_local int id_ = 0;
  static inline int count_ = 1, blocks_ = 1;
  static inline std::vector<GroupBins> own_bins_;
  static inline pthread_barrier_t barrier_;
};

}  // namespace dflash

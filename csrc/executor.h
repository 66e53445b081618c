// executor.h: what the scheduler asks of a backend, and nothing about which backend it is.
//
// An executor owns the models and their caches; the scheduler owns the books (requests, slots,
// tokens, randomness). Every call is one batched phase over rows, and a row is a KV slot index
// (SlotAllocator), stable from a request's prefill to its release. Rows in one call are distinct
// and in ascending order. The executor keeps whatever it needs between phases (the target's
// tapped features for the drafter, its caches); the scheduler sees token ids and logits only.
//
// Per row the life is:
//   prefill+ -> (draft? -> verify -> commit)* -> release
// `draft` is skipped in a step where the row verifies only its bonus token (block of 1: plain
// decoding, or no room left for drafts), so an executor must carry the features of committed
// positions forward until the next draft.
//
// Implemented in C++ (onnxruntime / TensorRT executors, to come) or in Python through the
// pybind11 trampoline in bindings.cpp (dflash_trt/runtime/core_engine.py wraps the torch and
// onnxruntime per-request sessions).
#pragma once

#include <cstdint>
#include <vector>

#include "errors.h"

namespace dflash {

// Float32 logits rows [rows, vocab], row-major, owned. Logits cross from an executor once per
// phase; for a Python executor this is one copy out of the numpy array (small next to the model).
struct LogitsRows {
  int64_t rows = 0;
  int64_t vocab = 0;
  std::vector<float> data;

  const float* row(int64_t r) const {
    DFLASH_INVARIANT(r >= 0 && r < rows);
    return data.data() + r * vocab;
  }
};

class Executor {
 public:
  virtual ~Executor() = default;

  // Run and commit each row's prompt chunk after what its slot holds -> the chunk's last position's
  // logits, one row per request ([1, vocab]). A row the executor does not hold yet starts fresh
  // (after a release, or never used); a long prompt may come in several chunks over several steps
  // (SchedulerConfig::prefill_chunk), each after the previous one's tokens.
  virtual std::vector<LogitsRows> prefill(const std::vector<int64_t>& rows,
                                          const std::vector<std::vector<int64_t>>& prompts) = 0;
  // Inject the features of the positions committed since the row's last draft, then draft
  // block_size - 1 tokens after each row's bonus token -> block_size - 1 token ids per row.
  virtual std::vector<std::vector<int64_t>> draft(const std::vector<int64_t>& rows,
                                                  const std::vector<int64_t>& bonus, int64_t block_size) = 0;
  // Feed each row's block [bonus, drafts...] after its committed prefix -> logits [len(block), vocab].
  // The block's cache entries stay pending until commit.
  virtual std::vector<LogitsRows> verify(const std::vector<int64_t>& rows,
                                         const std::vector<std::vector<int64_t>>& blocks) = 0;
  // Keep the first kept[i] positions of row i's last verify block; drop the rest.
  virtual void commit(const std::vector<int64_t>& rows, const std::vector<int64_t>& kept) = 0;
  // The row's request finished or was aborted: drop its state; the slot may be reused at once.
  virtual void release(int64_t row) = 0;
};

}  // namespace dflash

// scheduler.h: requests join and leave between steps; one step runs every live request through
// pick rows -> prefill (new ones) -> draft -> verify -> accept -> commit -> emit.
//
// The scheduler keeps the books and makes every decision about tokens; the Executor runs models.
// A request's tokens depend only on its prompt, its params and the logits its own rows produce:
// block sizes are a function of the request's own state, and randomness comes from the counter
// RNG keyed by (seed, stream, position) (rng.h), so the batch around a request never changes it.
//
// Block size is fixed per engine for now (`block_size`, 1 = plain decoding); near the end of a
// request a row's block shrinks to the tokens it may still emit. Adaptive speculation (choosing the
// block per step from calibrated step cost and per-slot acceptance) comes later (csrc/README.md).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "executor.h"
#include "metrics.h"
#include "sampling.h"
#include "slots.h"

namespace dflash {

struct SchedulerConfig {
  int64_t max_batch = 8;   // KV slots: live requests at once
  int64_t capacity = 2048; // tokens per slot (prompt + max_tokens must fit)
  int64_t block_size = 4;  // verify block (bonus + block_size - 1 drafts); 1: no drafter
  uint64_t engine_seed = 0;  // the seed of requests that bring none
};

struct RequestParams {
  SamplingParams sampling;  // temperature, top_k, top_p, seed
  bool seeded = false;      // false: sampling.seed is ignored; the engine seed and request id are used
  int64_t max_tokens = 256;
  std::vector<int64_t> stop_token_ids;
  std::vector<int64_t> eos_token_ids;
  bool ignore_eos = false;
};

enum class Finish { kNone, kStop, kLength, kAbort };
const char* finish_name(Finish f);  // "", "stop", "length", "abort"

// What one step says about one request: the tokens it committed this step (after the stop rule
// cut them) and, once, why it finished.
struct RequestOutput {
  int64_t request = -1;
  std::vector<int64_t> new_tokens;
  int64_t num_tokens = 0;  // output tokens so far, these included
  Finish finish = Finish::kNone;
  SpecMetrics metrics;
};

class Scheduler {
 public:
  // `executor` must outlive the scheduler.
  Scheduler(Executor& executor, const SchedulerConfig& config);

  // Admit a request (it prefills at the next step) -> its id. Refused with one line (dflash::Error),
  // before any work, when it can never fit a slot or every slot is taken.
  int64_t add_request(const std::vector<int64_t>& prompt, const RequestParams& params);
  // Finish a live request now: its slot is free on return; its "abort" output comes with the next
  // step. False when the id is not live (unknown, finished or aborted already).
  bool abort(int64_t request);
  // One step over every live request.
  std::vector<RequestOutput> step();

  int64_t num_live() const { return int64_t(live_.size()); }
  bool has_work() const { return !live_.empty() || !aborted_.empty(); }
  const SlotAllocator& slots() const { return slots_; }
  const SchedulerConfig& config() const { return config_; }

 private:
  struct Request {
    int64_t id = -1;
    int64_t slot = -1;
    std::vector<int64_t> prompt;
    RequestParams params;
    uint64_t seed = 0, stream = 0;  // counter RNG key
    std::vector<int64_t> tokens;    // output so far; tokens.back() is the bonus, not yet in the cache
    bool prefilled = false;
    Finish finish = Finish::kNone;
    SpecMetrics metrics;
    // this step's work
    int64_t block = 0;  // verify block size
    std::vector<int64_t> drafts;
    int64_t accepted = 0;
    int64_t next = -1;  // the target's token after the accepted drafts
  };

  // The phases of step(), in order.
  std::vector<Request*> pick_rows(bool prefilled);
  void prefill(const std::vector<Request*>& rows, std::vector<RequestOutput>& out);
  void draft(const std::vector<Request*>& rows);
  std::vector<LogitsRows> verify(const std::vector<Request*>& rows);
  void accept(const std::vector<Request*>& rows, const std::vector<LogitsRows>& logits);
  void commit(const std::vector<Request*>& rows);
  void emit(const std::vector<Request*>& rows, std::vector<RequestOutput>& out);
  // Append tokens one at a time through the stop rule; finishing frees the slot.
  void emit_tokens(Request& r, const std::vector<int64_t>& tokens, std::vector<RequestOutput>& out);

  void finish(Request& r, Finish why);  // frees the slot and the executor's row
  void rollback_reserved();             // after an executor error: no slot keeps a claim
  int64_t block_for(const Request& r) const;

  Executor& executor_;
  SchedulerConfig config_;
  SlotAllocator slots_;
  int64_t next_id_ = 0;
  std::vector<Request> live_;               // in admission order
  std::vector<RequestOutput> aborted_;      // emitted at the next step
};

}  // namespace dflash

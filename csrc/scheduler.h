// scheduler.h: requests join and leave between steps; one step runs every live request through
// admit -> pick rows -> prefill (new ones, or their next prompt chunk) -> choose block -> draft -> verify -> accept -> commit -> emit.
//
// The scheduler keeps the books and makes every decision about tokens; the Executor runs models.
// A request's tokens depend only on its prompt, its params and the logits its own rows produce:
// randomness comes from the counter RNG keyed by (seed, stream, position) (rng.h), and the token at
// a position is the target's draw there whatever was drafted (acceptance.h), so neither the batch
// around a request nor the block size a step picks changes it.
//
// Requests beyond the free slots wait and are admitted at the start of a step: first come first
// served, or by priority (SchedulerConfig::by_priority), where a waiting request also preempts a
// running one of a lower priority: that one gives up its slot and, readmitted, prefills its prompt and
// the tokens it had committed again (recomputation, as vLLM's preemption) and goes on where it stopped.
// The verify block is either fixed (`block_size`, 1 = plain decoding) or chosen per step by the
// adaptive policy (adaptive.h) from the acceptance estimate and the timed cost of executor calls
// (cost_model.h); near the end of a request a row's block shrinks to the tokens it may still emit.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "adaptive.h"
#include "constraint.h"
#include "cost_model.h"
#include "executor.h"
#include "metrics.h"
#include "sampling.h"
#include "slots.h"

namespace dflash {

struct SchedulerConfig {
  int64_t max_batch = 8;   // KV slots: running requests at once
  int64_t capacity = 2048; // tokens per slot (prompt + max_tokens must fit)
  int64_t block_size = 4;  // verify block (bonus + block_size - 1 drafts); adaptive: the largest; 1: no drafter
  uint64_t engine_seed = 0;  // the seed of requests that bring none
  bool adaptive = false;     // choose the block per step in 1..block_size (adaptive.h)
  int64_t max_waiting = -1;  // requests queued beyond the slots; -1: no cap, 0: refuse when full
  // Prompt tokens a request prefills per step; 0: the whole prompt at once. A long prompt then takes
  // several steps, and the running requests keep decoding in each of them instead of waiting for it.
  int64_t prefill_chunk = 0;
  // A finished request's slot keeps what its cache holds; a request whose prompt starts with those
  // tokens takes that slot and prefills only the rest (RequestOutput::cached_tokens).
  bool prefix_reuse = true;
  // With prefix_reuse: a waiting request whose prompt shares at least this many more tokens with the
  // prompt of a request still prefilling than any slot holds now waits (and the queue behind it) for
  // that prefill, then starts on its positions; n choices of one long prompt prefill it once. Waiting
  // costs a step, so a short shared head is prefilled again instead: on a GPU a prefill of up to ~128
  // tokens costs about a step (the weights' read; an estimate), on a CPU far more (measured:
  // docs/batching.md). 0: never wait.
  int64_t prefix_wait_tokens = 128;
  // vLLM's "priority" policy: waiting requests are admitted by (priority, arrival), lower values first,
  // and one that finds no free slot preempts the running request of the lowest priority (largest value,
  // latest arrival on a tie) below its own. false: first come first served; priorities must be 0.
  bool by_priority = false;
};

struct RequestParams {
  SamplingParams sampling;  // temperature, top_k, top_p, seed
  bool seeded = false;      // false: sampling.seed is ignored; the engine seed and request id are used
  int64_t max_tokens = 256;
  // The largest block this request verifies; 0: the scheduler's block_size. 1 is plain decoding:
  // plain and speculative requests share one scheduler, one executor and its KV slots.
  int64_t max_block = 0;
  std::vector<int64_t> stop_token_ids;
  std::vector<int64_t> eos_token_ids;
  bool ignore_eos = false;
  // penalties.h: added to a token's logit (OpenAI's logit_bias, in [-100, 100]), and the output tokens
  // before which the stop tokens (EOS unless ignore_eos, stop_token_ids) cannot come (vLLM's min_tokens)
  std::vector<std::pair<int64_t, double>> logit_bias;
  int64_t min_tokens = 0;
  // structured output: the grammar its output follows (constraint.h); null: none
  std::shared_ptr<OutputConstraint> constraint;
  // -1: none; n in [0, kMaxLogprobs]: the prompt's tokens after its first get 1 + n entries each
  // (RowSampling::prompt_logprobs). Its prompt is prefilled from its first token (no prefix reuse),
  // kScoredChunk tokens a step at most.
  int32_t prompt_logprobs = -1;
  // SchedulerConfig::by_priority: lower values are served first (vLLM's); else it must be 0
  int64_t priority = 0;
  // vLLM's cache_salt: a request reuses only positions a request of the same salt left or holds, so
  // that one tenant cannot time another's prompts through the prefix cache ("": the unsalted share)
  std::string cache_salt;
};

// A prompt scored (RequestParams::prompt_logprobs) is prefilled at most this many tokens a step: its Run
// holds every position's logits, rows x chunk x vocab floats.
constexpr int64_t kScoredChunk = 256;

// kError: the target gave the request no token (its logits were NaN, or every token was masked out)
enum class Finish { kNone, kStop, kLength, kAbort, kError };
const char* finish_name(Finish f);  // "", "stop", "length", "abort", "error"

// What one step says about one request: the tokens it committed this step (after the stop rule
// cut them) and, once, why it finished.
struct RequestOutput {
  int64_t request = -1;
  std::vector<int64_t> new_tokens;
  // SamplingParams::logprobs n >= 0: 1 + n entries per new token (its own, then the top n); else empty
  std::vector<TokenLogprob> new_logprobs;
  // RequestParams::prompt_logprobs n >= 0, in its first output: 1 + n entries per prompt token after the first
  std::vector<TokenLogprob> prompt_logprobs;
  int64_t prompt_scored = 0;  // those tokens
  int64_t num_tokens = 0;  // output tokens so far, these included
  int64_t cached_tokens = 0;  // prompt tokens its slot held already (prefix reuse), not prefilled
  int64_t preemptions = 0;  // times it gave its slot to a request of a higher priority, so far
  Finish finish = Finish::kNone;
  std::string error;  // Finish::kError: why, in one line
  SpecMetrics metrics;
  RequestTiming timing;
};

// Seconds spent, summed over every step: in the executor's phases and in whole steps. The rest of a
// step (step - the phases) is the core's own overhead: scheduling, acceptance, sampling, emitting.
struct PhaseSeconds {
  double prefill = 0, draft = 0, verify = 0, commit = 0, step = 0;
  int64_t steps = 0;
};

// What the adaptive bookkeeping has learnt, for benches and logs.
struct SchedulerStats {
  PhaseSeconds seconds;
  int64_t prompt_tokens = 0, cached_tokens = 0;  // admitted requests' prompts, and what prefix reuse spared
  int64_t preemptions = 0;               // running requests that gave their slot to one of a higher priority
  int64_t last_block = 0;                // the block of the latest step that verified (0: none yet)
  std::vector<int64_t> steps_per_block;  // [B - 1]: verify steps that chose B
  std::vector<double> acceptance;        // a_1..a_{max - 1}
  std::vector<CostModel::Cell> verify_cost, draft_cost;
};

class Scheduler {
 public:
  // `executor` must outlive the scheduler.
  Scheduler(Executor& executor, const SchedulerConfig& config);

  // Queue a request -> its id; it takes a free slot now if none is waiting before it, else at the
  // start of a later step. Refused with one line (dflash::Error), before any work, when it can never
  // fit a slot or the waiting queue is full.
  int64_t add_request(const std::vector<int64_t>& prompt, const RequestParams& params);
  // Finish a running or waiting request now: its slot is free on return; its "abort" output comes
  // with the next step. False when the id is not live (unknown, finished or aborted already).
  bool abort(int64_t request);
  // One step over every running request.
  std::vector<RequestOutput> step();

  // Seed the cost model with a calibration: one `phase` call ("verify" or "draft") over `rows` rows
  // at block `block` took `seconds`. Live timings join the same model.
  void seed_cost(const std::string& phase, int64_t rows, int64_t block, double seconds);
  SchedulerStats stats() const;

  int64_t num_running() const { return int64_t(live_.size()); }
  int64_t num_waiting() const { return int64_t(waiting_.size()); }
  int64_t num_preemptions() const { return preemptions_; }
  bool has_work() const { return !live_.empty() || !waiting_.empty() || !aborted_.empty(); }
  const SlotAllocator& slots() const { return slots_; }
  const SchedulerConfig& config() const { return config_; }

 private:
  struct Request {
    int64_t id = -1;
    int64_t slot = -1;  // -1 while waiting
    std::vector<int64_t> prompt;
    // what a prefill puts in its cache: the prompt, and after a preemption the tokens it had committed
    std::vector<int64_t> context;
    int64_t preemptions = 0;  // times it gave its slot up (SchedulerConfig::by_priority)
    RequestParams params;
    uint64_t seed = 0, stream = 0;  // counter RNG key
    std::vector<int64_t> tokens;    // output so far; tokens.back() is the bonus, not yet in the cache
    int64_t prompt_done = 0;  // prompt tokens in the cache (prefill_chunk at a time)
    int64_t cached = 0;       // of those, what its slot held before it (prefix reuse)
    bool prefilled = false;   // the whole prompt is in, and its first token sampled
    Finish finish = Finish::kNone;
    SpecMetrics metrics;
    RequestTiming timing;
    // this step's work
    int64_t block = 0;  // verify block size
    std::vector<int64_t> drafts;
    int64_t accepted = 0;
    int64_t next = -1;  // the target's token after the accepted drafts
    std::vector<TokenLogprob> logprobs;  // the executor's entries for the tokens this step decided
    std::vector<TokenLogprob> prompt_logprobs;  // its prompt's, as its chunks are prefilled (until emitted)
    // what its logits get before a decision (penalties.h), when its params ask: each token's count in
    // `tokens` (the first `counted` of them), whether the prompt holds it, a stop token's flag, its bias
    bool adjusts = false;
    PenaltyHistory history;
    size_t counted = 0;
    std::vector<uint32_t> masks;  // with a constraint: this phase's positions' allowed tokens
  };
  // A row's RowSampling for a decision at sequence position `position`; its penalty history brought
  // up to its tokens first.
  static RowSampling row_sampling(Request& r, uint32_t position);
  // With a constraint: the masks of a phase's positions into r.masks (the first follows the output so
  // far, position k the drafts before it; past a draft the grammar refuses, none is ever reached), and
  // r.drafts' refused drafts replaced by forced tokens where that stays lossless (constraint.h).
  void constrain(Request& r);

  // The phases of step(), in order.
  void admit();
  // The waiting request admitted next: the first, or by (priority, arrival).
  std::deque<Request>::iterator next_waiting();
  // A running request that a waiting one of priority `priority` preempts when no slot is free (the
  // lowest below it), or null.
  Request* preemptible(int64_t priority);
  // Give `r`'s slot up and queue it again; readmitted, it prefills its context and goes on.
  void preempt(Request& r);
  // Where a request starts: its free slot, and the first `held` prompt tokens it reuses from slot
  // `source`'s positions (-1: none).
  struct Admission {
    int64_t slot = -1, source = -1, held = 0;
  };
  // The longest reusable head among every slot's positions, free or running. The request takes a free
  // source when that loses no more kept tokens (its tail past the head: none for a chat's next turn)
  // than the other free slot worth least (keeping nothing, else released longest ago) would; else that
  // slot, and the head is copied there.
  // Only positions of r's cache salt count; reuse false: held 0.
  Admission choose_slot(const Request& r, bool reuse) const;
  // Whether r, which can reuse `reusable_now` tokens, should wait for the prefill of a running request
  // of its salt (SchedulerConfig::prefix_wait_tokens).
  bool waits_for_prefill(const Request& r, int64_t reusable_now) const;
  // The tokens at a slot's cache positions that a request salted `salt` may reuse: a running request's
  // committed ones, or what a finished one left (kept_tokens_); none of another salt.
  std::vector<int64_t> held_tokens(int64_t slot, const std::string& salt) const;
  // A request's tokens at its slot's committed positions: its prompt, then the output tokens fed since
  // (a stop may have cut the output before the last committed position; past it nothing is known).
  std::vector<int64_t> cached_positions(const Request& r) const;
  std::vector<Request*> pick_rows(bool prefilled);
  void prefill(const std::vector<Request*>& rows, std::vector<RequestOutput>& out);
  void choose_block(const std::vector<Request*>& rows);
  void draft(const std::vector<Request*>& rows);
  std::vector<Verdict> verify(const std::vector<Request*>& rows);
  bool is_token(int64_t t) const { return t >= 0 && t < executor_.vocab(); }  // else kNoToken, or out of range
  // Rows whose verdict has no token finish "error" and leave `rows` and `verdicts`.
  void drop_failed(std::vector<Request*>& rows, std::vector<Verdict>& verdicts, std::vector<RequestOutput>& out);
  void accept(const std::vector<Request*>& rows, const std::vector<Verdict>& verdicts);
  void commit(const std::vector<Request*>& rows);
  void emit(const std::vector<Request*>& rows, std::vector<RequestOutput>& out);
  // Append tokens one at a time through the stop rule; finishing frees the slot.
  // `r.logprobs` holds the tokens' entries when the request asked for them.
  void emit_tokens(Request& r, const std::vector<int64_t>& tokens, std::vector<RequestOutput>& out);

  void finish(Request& r, Finish why);  // frees the slot (if any) and the executor's row
  // finish(r, why) -> its last output, with no new tokens (an abort, a failure)
  RequestOutput end(Request& r, Finish why);
  // Finish r "error" (its slot keeps nothing for reuse): `why` names the step and position.
  void fail(Request& r, const std::string& why, std::vector<RequestOutput>& out);
  // Free r's slot and executor row, the slot keeping what its cache holds for prefix reuse.
  void release_slot(Request& r);
  void rollback_reserved();             // after an executor error: no slot keeps a claim
  int64_t limit_for(const Request& r) const;  // the largest block the row may verify

  Executor& executor_;
  SchedulerConfig config_;
  SlotAllocator slots_;
  int64_t next_id_ = 0;
  std::deque<Request> waiting_;          // no slot yet, in arrival order (preempted ones at the back)
  std::vector<Request> live_;            // running, in admission order
  std::vector<RequestOutput> aborted_;   // emitted at the next step
  // prefix reuse: per slot, the tokens its cache rows held when its last request finished, and when
  // (a count of finishes; 0: never)
  std::vector<std::vector<int64_t>> kept_tokens_;
  std::vector<std::string> kept_salt_;  // the cache salt of the request that left them
  std::vector<int64_t> freed_at_;
  int64_t finishes_ = 0;
  int64_t prompt_tokens_ = 0, cached_tokens_ = 0, preemptions_ = 0;
  // adaptive speculation
  int64_t step_block_ = 0;  // this step's block (each row's block is at most this)
  AcceptanceEstimate acceptance_;
  CostModel verify_cost_, draft_cost_;
  PhaseSeconds seconds_;
  std::vector<int64_t> steps_per_block_;
};

}  // namespace dflash

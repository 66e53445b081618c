// executor.h: what the scheduler asks of a backend, and nothing about which backend it is.
//
// An executor owns the models and their caches; the scheduler owns the books (requests, slots,
// tokens, randomness). Every call is one batched phase over rows, and a row is a KV slot index
// (SlotAllocator), stable from a request's prefill to its release. Rows in one call are distinct
// and in ascending order. The executor keeps whatever it needs between phases (the target's
// tapped features for the drafter, its caches, its logits); the scheduler sees token ids and
// counts only. Acceptance and sampling run inside the executor, by the rules of acceptance.h, on
// the keys the scheduler hands it (`RowSampling`): host code here (`host_sample`, `host_verdict`),
// so no full-vocabulary logits leave an executor's phase.
//
// Per row the life is:
//   (reopen?) prefill+ -> (draft? -> verify -> commit)* -> release
// `draft` is skipped in a step where the row verifies only its bonus token (block of 1: plain
// decoding, or no room left for drafts), so an executor must carry the features of committed
// positions forward until the next draft.
//
// Implemented once, by the slot executor (slot_executor.h), over onnxruntime, TensorRT or Python
// graphs (the torch backend).
#pragma once

#include <algorithm>
#include <cstdint>
#include <thread>
#include <vector>

#include "acceptance.h"
#include "errors.h"
#include "penalties.h"

namespace dflash {

// How a row's tokens are drawn: the request's sampling params and RNG stream (acceptance.h), and
// the sequence position of the first token the phase decides (a prefill's next token; a verify's
// drafts[0]).
struct RowSampling {
  SamplingParams sampling;
  uint64_t stream = 0;
  uint32_t position = 0;
  // what its logits get before the decision (penalties.h; null: nothing): its tokens so far, stop
  // tokens and biases, with stop tokens banned at the phase's first `ban` positions (min_tokens)
  const PenaltyHistory* history = nullptr;
  int64_t ban = 0;
  // with history: the allowed tokens of the phase's positions (constraint.h; words per position), or null
  const uint32_t* masks = nullptr;
  // A prefill row's prompt logprobs (vLLM's prompt_logprobs): -1 none; n in [0, kMaxLogprobs]: each of
  // its chunk's tokens after the first, then `after` (the prompt's token past the chunk; -1 at the
  // prompt's end), gets 1 + n entries under the raw logits of the position before it (logprobs_row).
  int32_t prompt_logprobs = -1;
  int64_t after = -1;
};

// The host forms of the rules, for executors whose logits are in host memory.
inline int64_t host_sample(const float* logits, int64_t vocab, const RowSampling& s) {
  return sample(logits, vocab, s.sampling, s.stream, s.position);
}
// block [bonus, drafts...], logits [len(block), vocab]
inline Verdict host_verdict(const std::vector<int64_t>& block, const float* logits, int64_t vocab,
                            const RowSampling& s) {
  const Acceptance a = accept(block.data() + 1, int64_t(block.size()) - 1, logits, vocab, s.sampling, s.stream,
                              s.position);
  return {a.accepted, a.next};
}
// The logprobs entries of `decided` tokens, token j from logits row j [*, vocab], when asked (else none).
// Rows are independent: a prompt's (scored up to kScoredChunk a step, each a pass over the vocabulary)
// spread over the cores, kRowsPerWorker or more to a thread.
inline std::vector<TokenLogprob> host_logprobs(const std::vector<int64_t>& decided, const float* logits,
                                               int64_t vocab, const RowSampling& s) {
  constexpr size_t kRowsPerWorker = 16;
  const int32_t top = s.sampling.logprobs;
  if (top < 0) return {};
  std::vector<TokenLogprob> out(decided.size() * (1 + top));
  const auto score = [&](size_t first, size_t stride) {
    std::vector<int32_t> order(vocab);
    for (size_t j = first; j < decided.size(); j += stride)
      logprobs_row(logits + j * vocab, vocab, decided[j], top, out.data() + j * (1 + top), order.data());
  };
  const size_t workers = std::max<size_t>(1, std::min<size_t>(std::thread::hardware_concurrency(),
                                                                decided.size() / kRowsPerWorker));
  std::vector<std::thread> pool;
  for (size_t w = 1; w < workers; ++w) pool.emplace_back(score, w, workers);
  score(0, workers);
  for (std::thread& worker : pool) worker.join();
  return out;
}

class Executor {
 public:
  virtual ~Executor() = default;

  // Run and commit each row's prompt chunk after what its slot holds -> the token sampled from the
  // chunk's last position (the request's first token, when the chunk ends its prompt). A row the
  // executor does not hold yet starts fresh (after a release, or never used); a long prompt may
  // come in several chunks over several steps (SchedulerConfig::prefill_chunk), each after the
  // previous one's tokens.
  virtual std::vector<int64_t> prefill(const std::vector<int64_t>& rows,
                                       const std::vector<std::vector<int64_t>>& prompts,
                                       const std::vector<RowSampling>& sampling) = 0;
  // Inject the features of the positions committed since the row's last draft, then draft
  // block_size - 1 tokens after each row's bonus token -> block_size - 1 token ids per row: the
  // drafter's argmax, or where the executor samples drafts (the drafter-distribution rule) draws from
  // its distribution for rows sampling at T>0, keyed by `sampling` (position: the first draft's; empty:
  // every row's argmax).
  virtual std::vector<std::vector<int64_t>> draft(const std::vector<int64_t>& rows,
                                                  const std::vector<int64_t>& bonus, int64_t block_size,
                                                  const std::vector<RowSampling>& sampling) = 0;
  // Feed each row's block [bonus, drafts...] after its committed prefix and decide it -> how many
  // drafts the target keeps and its token after them. The block's cache entries stay pending until
  // commit.
  virtual std::vector<Verdict> verify(const std::vector<int64_t>& rows,
                                      const std::vector<std::vector<int64_t>>& blocks,
                                      const std::vector<RowSampling>& sampling) = 0;
  // Keep the first kept[i] positions of row i's last verify block; drop the rest.
  virtual void commit(const std::vector<int64_t>& rows, const std::vector<int64_t>& kept) = 0;
  // The row's request finished or was aborted: drop its state; the slot may be reused at once. Where
  // keep_released is on, the row keeps what its caches hold (its committed positions) for a later
  // request starting with the same tokens, until the executor needs the memory for another row.
  virtual void release(int64_t row) = 0;
  // The row's request failed: release it keeping nothing, and zero its place first. What failed it (NaN
  // from an overflow, corrupt weights) may sit in its caches and states, and a later row in that place
  // reads past its own positions where a batch's attention spans more (masked, yet 0 x NaN is NaN).
  virtual void discard(int64_t row) = 0;
  // Prefix reuse (SchedulerConfig::prefix_reuse): off, a released row keeps nothing.
  virtual void keep_released(bool on) = 0;
  // How many of a row's positions a new request can start on, when its first `match` tokens equal
  // what the row holds (a live row's committed positions, or what a released row still keeps): at
  // most those; 0 where none (a hybrid target's states exist only after all of them: all or nothing).
  virtual int64_t reusable(int64_t row, int64_t match) const = 0;
  // Whether a request can start on any head of a row's positions (false: only on all of them).
  virtual bool reuses_heads() const = 0;
  // Whether rows sampling at T>0 draw their drafts from the drafter's distribution (the drafter rule:
  // their acceptance reads q of the drafts drawn, so the drafts must stay as drawn).
  virtual bool samples_drafts() const = 0;
  // The target's vocabulary size: token ids a request names must be below it.
  virtual int64_t vocab() const = 0;
  // Start the (not live) row's next request on the first n positions of `source` (1 <= n ==
  // reusable(source, n)): the row itself, released, or another row, released or live, whose positions
  // are then copied; its prefill continues after them.
  virtual void reopen(int64_t row, int64_t source, int64_t n) = 0;
  // The log-probabilities of the tokens the last prefill or verify decided for its i-th row, when that
  // row's SamplingParams::logprobs n >= 0: 1 + n TokenLogprobs per decided token (decide.h; a prefill:
  // its token; a verify: the kept drafts, then `next`); else empty.
  virtual const std::vector<TokenLogprob>& logprobs(size_t i) const = 0;
  // The last prefill's i-th row's prompt logprobs, when its RowSampling asked (else empty).
  virtual const std::vector<TokenLogprob>& prompt_logprobs(size_t i) const = 0;
  // Graph runs so far that paid one-time set-up (Graph::run): a phase call during which this grew is
  // no measure of the next call's cost.
  virtual int64_t set_up_runs() const = 0;
};

}  // namespace dflash

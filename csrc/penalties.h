// penalties.h: the repetition, frequency and presence penalties (vLLM's and OpenAI's), applied to a
// logits row in place before any decision, written once for the host and the device (hd.h).
//
// Over the raw logits, in vLLM's order: a token seen in the prompt or the output so far has its logit
// divided by repetition_penalty where positive, multiplied where not; then frequency_penalty times the
// token's count in the output is subtracted, then presence_penalty once if it occurs there. The rest
// (temperature, top-k, top-p, argmax) sees the penalized row, so greedy decoding is penalized too.
//
// Lossless under speculation: the row at a verify position is penalized by the output up to that
// position: the committed tokens (the bonus included) and the block's drafts before it, which are the
// tokens there if the draft at that position is reached. Each (row, position) gets one list of its
// tokens with their counts (`PenaltyList`), built on the host from the request's counts and its block
// (penalty_lists): a GPU receives the lists, not the history.
#pragma once

#include <cstdint>
#include <map>
#include <vector>

#include "hd.h"
#include "sampling.h"

namespace dflash {

// One token of a (row, position)'s history: its occurrences in the output and whether the prompt has it.
struct PenaltyEntry {
  int32_t token = 0;
  int32_t count = 0;
  int32_t in_prompt = 0;
};

// The entries [begin, end) of one logits row (`row` of the phase's logits), with its request's penalties.
struct PenaltyList {
  int64_t row = 0;
  int64_t begin = 0, end = 0;
  float repetition = 1.0f, frequency = 0.0f, presence = 0.0f;
};

// A token's history in a request, for its PenaltyEntry: output occurrences, in the prompt or not.
struct TokenHistory {
  int32_t count = 0;
  bool in_prompt = false;
};
using PenaltyHistory = std::map<int32_t, TokenHistory>;  // ordered: a list's entries in token order

namespace penalty_detail {
// Products and differences rounded alone (no fused multiply-add), so host and device agree bit for bit.
DFLASH_HD inline float mul(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
DFLASH_HD inline float sub(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}
DFLASH_HD inline float div(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}
}  // namespace penalty_detail

DFLASH_HD inline float penalized(float logit, const PenaltyEntry& e, const PenaltyList& list) {
  using namespace penalty_detail;
  if (list.repetition != 1.0f && (e.count > 0 || e.in_prompt))
    logit = logit > 0.0f ? div(logit, list.repetition) : mul(logit, list.repetition);
  if (e.count > 0) {
    logit = sub(logit, mul(list.frequency, float(e.count)));
    logit = sub(logit, list.presence);
  }
  return logit;
}

// Entries [first, end) of `list` (stride `step`: a thread's share) applied to logits [*, vocab] in place.
DFLASH_HD inline void apply_penalties(float* logits, int64_t vocab, const PenaltyList& list,
                                      const PenaltyEntry* entries, int64_t first, int64_t step) {
  float* row = logits + list.row * vocab;
  for (int64_t k = list.begin + first; k < list.end; k += step) row[entries[k].token] = penalized(row[entries[k].token],
                                                                                                 entries[k], list);
}

// Whether a request's params ask for any penalty.
inline bool penalizes(const SamplingParams& p) {
  return p.repetition_penalty != 1.0 || p.frequency_penalty != 0.0 || p.presence_penalty != 0.0;
}

// Append the lists of `positions` logits rows from `first_row` on: position k's history is `history`
// and block tokens 1..k (drafts before it; block[0], the bonus, is in `history` already).
void penalty_lists(const PenaltyHistory& history, const std::vector<int64_t>& block, int64_t positions,
                   int64_t first_row, const SamplingParams& params, std::vector<PenaltyList>& lists,
                   std::vector<PenaltyEntry>& entries);

}  // namespace dflash

// penalties.h: what a request's logits get before any decision, written once for the host and the device
// (hd.h): min_tokens, logit_bias, the repetition, frequency and presence penalties, then min_p.
//
// Over the raw logits, in vLLM's order: while the output is shorter than min_tokens its stop tokens
// (EOS and stop_token_ids) are banned (-inf); each token's logit_bias is added; a token seen in the
// prompt or the output so far has its logit divided by repetition_penalty where positive, multiplied
// where not; then frequency_penalty times the token's count in the output is subtracted, then
// presence_penalty once if it occurs there. Then, for a sampled row, min_p keeps the tokens whose
// probability after temperature is at least min_p times the largest: in logits, those at least
// max + T ln(min_p) (the rest -inf). The rest (temperature, top-k, top-p, argmax) sees the adjusted row,
// so greedy decoding is adjusted too (min_p aside: it never changes an argmax).
//
// Lossless under speculation: the row at a verify position is penalized by the output up to that
// position: the committed tokens (the bonus included) and the block's drafts before it, which are the
// tokens there if the draft at that position is reached. A phase hands each row that asks its history
// once (`PenaltyRow`: its tokens with their counts, sorted by token) and its block; each position adds
// the drafts before it itself, so what crosses to a GPU is a row's history, not one per position.
#pragma once

#include <cmath>
#include <cstdint>
#include <map>
#include <vector>

#include "hd.h"
#include "sampling.h"

namespace dflash {

// One token of a row's history: its occurrences in the output, flags, and its logit_bias.
struct PenaltyEntry {
  static constexpr int32_t kInPrompt = 1, kStop = 2;
  int32_t token = 0;
  int32_t count = 0;
  int32_t flags = 0;
  float bias = 0.0f;
};

// One row of a phase that asks for penalties: logits rows [first, first + positions) (a verify: its
// block's positions; a prefill: its last), history entries [begin, end) (by token ascending), and its
// block at `block` in the phase's tokens (the bonus, then the drafts: position k follows drafts 1..k).
// Positions k < ban decide an output token before min_tokens: its stop tokens are banned there.
// `mask` >= 0: position k's allowed tokens (constraint.h) are the words at mask + k * ceil(vocab / 32).
struct PenaltyRow {
  int64_t first = 0, positions = 0;
  int64_t begin = 0, end = 0;
  int64_t block = 0;
  int64_t ban = 0;
  int64_t mask = -1;
  float repetition = 1.0f, frequency = 0.0f, presence = 0.0f;
  int32_t min_p_cut = 0;      // whether min_p cuts this row's positions (a sampled row with min_p > 0)
  float min_p_margin = 0.0f;  // then T ln(min_p), computed once on the host (<= 0)
};

// A token's history in a request: output occurrences, in the prompt or not, a stop token or not (kept
// only under min_tokens), its logit_bias.
struct TokenHistory {
  int32_t count = 0;
  bool in_prompt = false;
  bool stop = false;
  float bias = 0.0f;
};
using PenaltyHistory = std::map<int32_t, TokenHistory>;  // ordered: a row's entries by token

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
DFLASH_HD inline float add(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
DFLASH_HD inline float div(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}

DFLASH_HD inline float penalized(float logit, int32_t count, int32_t flags, float bias, bool banned,
                                 const PenaltyRow& row) {
  if (banned && (flags & PenaltyEntry::kStop)) return -INFINITY;
  if (bias != 0.0f) logit = add(logit, bias);
  if (row.repetition != 1.0f && (count > 0 || (flags & PenaltyEntry::kInPrompt)))
    logit = logit > 0.0f ? div(logit, row.repetition) : mul(logit, row.repetition);
  if (count > 0) {
    logit = sub(logit, mul(row.frequency, float(count)));
    logit = sub(logit, row.presence);
  }
  return logit;
}

// How often `token` is among drafts[1..k] of a block.
DFLASH_HD inline int32_t in_drafts(const int32_t* block, int64_t k, int32_t token) {
  int32_t n = 0;
  for (int64_t j = 1; j <= k; ++j) n += block[j] == token;
  return n;
}

// Whether the row's history (sorted by token) holds `token`.
DFLASH_HD inline bool in_history(const PenaltyEntry* entries, int64_t begin, int64_t end, int32_t token) {
  while (begin < end) {
    const int64_t mid = begin + (end - begin) / 2;
    if (entries[mid].token == token) return true;
    if (entries[mid].token < token) begin = mid + 1;
    else end = mid;
  }
  return false;
}
}  // namespace penalty_detail

// Position k of `row` penalized in place, logits [*, vocab]: this thread's share (from `first`, stride
// `step`) of the history's tokens, then of the drafts before k that the history lacks (each token once:
// at its first draft). A token is written by one thread only, so the threads need no barrier.
DFLASH_HD inline void penalize_position(float* logits, int64_t vocab, const PenaltyRow& row, int64_t k,
                                        const PenaltyEntry* entries, const int32_t* tokens, int64_t first,
                                        int64_t step) {
  using namespace penalty_detail;
  float* out = logits + (row.first + k) * vocab;
  const int32_t* block = tokens + row.block;
  for (int64_t e = row.begin + first; e < row.end; e += step) {
    const PenaltyEntry& h = entries[e];
    out[h.token] = penalized(out[h.token], h.count + in_drafts(block, k, h.token), h.flags, h.bias, k < row.ban, row);
  }
  // the drafts count only to the penalties (a row may ask for a bias, min_tokens or a mask alone)
  if (row.repetition == 1.0f && row.frequency == 0.0f && row.presence == 0.0f) return;
  for (int64_t j = 1 + first; j <= k; j += step) {
    const int32_t token = block[j];
    if (in_drafts(block, j - 1, token) > 0 || in_history(entries, row.begin, row.end, token)) continue;
    out[token] = penalized(out[token], in_drafts(block, k, token), 0, 0.0f, false, row);
  }
}

// Position k's tokens the row's constraint refuses -> -inf: this thread's share (from `first`, stride
// `step`) of the vocabulary. After penalize_position (a barrier between: tokens are shared out otherwise).
DFLASH_HD inline void mask_position(float* logits, int64_t vocab, const PenaltyRow& row, int64_t k,
                                    const uint32_t* masks, int64_t first, int64_t step) {
  if (row.mask < 0) return;
  float* out = logits + (row.first + k) * vocab;
  const uint32_t* allowed = masks + row.mask + k * ((vocab + 31) / 32);
  for (int64_t t = first; t < vocab; t += step)
    if (!((allowed[t / 32] >> (t % 32)) & 1u)) out[t] = -INFINITY;
}

// min_p's cut of a position whose largest adjusted logit is `max`: logits below it become -inf.
DFLASH_HD inline float min_p_threshold(float max, const PenaltyRow& row) {
  return penalty_detail::add(max, row.min_p_margin);
}

// Whether a request's params ask for any penalty.
inline bool penalizes(const SamplingParams& p) {
  return p.repetition_penalty != 1.0 || p.frequency_penalty != 0.0 || p.presence_penalty != 0.0;
}
// Whether min_p cuts a request's rows (only sampled ones: the largest logit always stays).
inline bool cuts_min_p(const SamplingParams& p) { return p.min_p > 0.0 && !p.greedy(); }

// The host's min_p cut of a position's row (the kernel's is a block reduction of the same max).
inline void cut_min_p(float* row, int64_t vocab, const PenaltyRow& penalty) {
  float max = -INFINITY;
  for (int64_t i = 0; i < vocab; ++i) max = row[i] > max ? row[i] : max;
  const float threshold = min_p_threshold(max, penalty);
  for (int64_t i = 0; i < vocab; ++i)
    if (row[i] < threshold) row[i] = -INFINITY;
}

// Append a row's PenaltyRow (logits rows from `first`, `positions` of them; stop tokens banned at the
// first `ban`; `masks`: its positions' allowed tokens, `words` each, or null), the entries of its
// history that change something there, its block (block[0] the bonus; a prefill passes none) and its
// masks to the phase's arrays.
void add_penalty_row(const PenaltyHistory& history, const std::vector<int64_t>& block, int64_t positions,
                     int64_t first, const SamplingParams& params, int64_t ban, const uint32_t* masks, int64_t words,
                     std::vector<PenaltyRow>& rows, std::vector<PenaltyEntry>& entries, std::vector<int32_t>& tokens,
                     std::vector<uint32_t>& mask_words);

}  // namespace dflash

// sampling.h: the target distribution a request samples from, and one categorical draw from it.
//
// target_probs mirrors dflash_trt/spec/sampling.py `target_probs` (the oracle), so that the core
// and the Python reference loop commit tokens from the same distribution. Rows are raw float
// arrays [rows, vocab]; nothing here knows about tensors, executors or Python. These are the host
// entry points (checked inputs, own scratch) over the rules in decide.h, which a GPU kernel runs too.
#pragma once

#include <cstdint>

#include "hd.h"

namespace dflash {

constexpr int32_t kMaxLogprobs = 20;  // OpenAI's top_logprobs bound

struct SamplingParams {
  double temperature = 0.0;  // 0: greedy (argmax), no randomness drawn
  int64_t top_k = 0;         // 0: no top-k cut
  double top_p = 1.0;        // 1: no nucleus cut
  uint64_t seed = 0;
  // -1: none; n in [0, kMaxLogprobs]: each decided token's log-probability under the target's raw
  // logits (log_softmax, before temperature and the cuts) and the n most probable tokens' (decide.h)
  int32_t logprobs = -1;
  // penalties.h: applied to the logits before everything above (1, 0, 0: none)
  double repetition_penalty = 1.0, frequency_penalty = 0.0, presence_penalty = 0.0;
  double min_p = 0.0;  // penalties.h: a sampled row keeps tokens of probability >= min_p x the largest

  DFLASH_HD bool greedy() const { return temperature == 0.0; }
  // Throws dflash::Error (one line) on values SamplingParams in Python would refuse.
  void validate() const;
};

// probs[r, :] = softmax(logits[r, :] / T) cut to the top-k, then to the top-p nucleus, renormalised.
//  - top-k keeps every score >= the k-th largest, so ties at the boundary all stay (as the oracle's
//    `scores < kth` mask does; more than k tokens may survive).
//  - top-p keeps a token while the mass strictly before it (in descending order) is below top_p;
//    the first always stays. Equal probabilities are ordered by token id (torch.sort leaves their
//    order unspecified, so at an exact tie on the nucleus boundary the two may keep different ids).
// Needs temperature > 0. NaN logits are not handled (the oracle's result is NaN as well).
void target_probs(const float* logits, int64_t rows, int64_t vocab, const SamplingParams& params, float* probs);

// First token index of the maximum (torch.argmax's tie rule).
int64_t argmax(const float* row, int64_t vocab);

// Inverse-CDF draw from a probability row (need not be exactly normalised) with uniform u in [0, 1).
// Never returns a token of probability 0.
int64_t draw_categorical(const float* probs, int64_t vocab, double u);

}  // namespace dflash

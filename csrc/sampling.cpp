// sampling.cpp: the host entry points of the target distribution and categorical draws (decide.h).
#include "sampling.h"

#include <string>
#include <vector>

#include "decide.h"
#include "errors.h"

namespace dflash {

void SamplingParams::validate() const {
  if (!(temperature >= 0.0))
    throw Error("SamplingParams.temperature must be >= 0, got " + std::to_string(temperature));
  if (!(top_p > 0.0 && top_p <= 1.0))
    throw Error("SamplingParams.top_p must be in (0, 1], got " + std::to_string(top_p));
  if (top_k < 0) throw Error("SamplingParams.top_k must be an integer >= 0, got " + std::to_string(top_k));
  if (!(repetition_penalty > 0.0 && repetition_penalty <= 2.0))
    throw Error("SamplingParams.repetition_penalty must be in (0, 2], got " + std::to_string(repetition_penalty));
  if (!(frequency_penalty >= -2.0 && frequency_penalty <= 2.0))
    throw Error("SamplingParams.frequency_penalty must be in [-2, 2], got " + std::to_string(frequency_penalty));
  if (!(presence_penalty >= -2.0 && presence_penalty <= 2.0))
    throw Error("SamplingParams.presence_penalty must be in [-2, 2], got " + std::to_string(presence_penalty));
  if (!(min_p >= 0.0 && min_p <= 1.0)) throw Error("SamplingParams.min_p must be in [0, 1], got " + std::to_string(min_p));
  if (logprobs < -1 || logprobs > kMaxLogprobs)
    throw Error("SamplingParams.logprobs must be -1 (none) or in [0, " + std::to_string(kMaxLogprobs) + "], got " +
                std::to_string(logprobs));
}

void target_probs(const float* logits, int64_t rows, int64_t vocab, const SamplingParams& params, float* probs) {
  params.validate();
  if (params.greedy()) throw Error("target_probs needs temperature > 0 (temperature 0 is greedy: use argmax)");
  DFLASH_INVARIANT(rows >= 0 && vocab > 0);
  std::vector<int32_t> order(vocab);
  for (int64_t r = 0; r < rows; ++r) probs_row(logits + r * vocab, vocab, params, probs + r * vocab, order.data());
}

int64_t argmax(const float* row, int64_t vocab) {
  DFLASH_INVARIANT(vocab > 0);
  return argmax_row(row, vocab);
}

int64_t draw_categorical(const float* probs, int64_t vocab, double u) {
  DFLASH_INVARIANT(vocab > 0 && u >= 0.0 && u < 1.0);
  double total = 0.0;
  for (int64_t i = 0; i < vocab; ++i) total += probs[i];
  DFLASH_INVARIANT(total > 0.0);
  return draw_row(probs, vocab, u);
}

}  // namespace dflash

// acceptance.cpp: the host entry points of greedy and point-mass rejection sampling (decide.h).
#include "acceptance.h"

#include <string>
#include <vector>

#include "errors.h"

namespace dflash {

void check_drafts(const int64_t* drafts, int64_t num_drafts, int64_t vocab) {
  DFLASH_INVARIANT(num_drafts >= 0 && vocab > 0);
  for (int64_t j = 0; j < num_drafts; ++j)
    if (drafts[j] < 0 || drafts[j] >= vocab)
      throw Error("draft token " + std::to_string(drafts[j]) + " at block slot " + std::to_string(j + 1) +
                  " is outside the target vocabulary of " + std::to_string(vocab) +
                  "; the drafter and target vocabularies disagree");
}

Acceptance accept_greedy(const int64_t* drafts, int64_t num_drafts, const float* logits, int64_t vocab) {
  check_drafts(drafts, num_drafts, vocab);
  return verdict_rows(drafts, num_drafts, logits, vocab, SamplingParams{}, 0, 0, nullptr, nullptr);
}

Acceptance accept_point_mass(const int64_t* drafts, int64_t num_drafts, const float* logits, int64_t vocab,
                             const SamplingParams& params, uint64_t request, uint32_t position) {
  params.validate();
  if (params.greedy()) throw Error("target_probs needs temperature > 0 (temperature 0 is greedy: use argmax)");
  check_drafts(drafts, num_drafts, vocab);
  std::vector<float> probs(vocab);
  std::vector<int32_t> order(vocab);
  return verdict_rows(drafts, num_drafts, logits, vocab, params, request, position, probs.data(), order.data());
}

Acceptance accept(const int64_t* drafts, int64_t num_drafts, const float* logits, int64_t vocab,
                  const SamplingParams& params, uint64_t request, uint32_t position) {
  if (params.greedy()) return accept_greedy(drafts, num_drafts, logits, vocab);
  return accept_point_mass(drafts, num_drafts, logits, vocab, params, request, position);
}

int64_t sample(const float* logits, int64_t vocab, const SamplingParams& params, uint64_t request,
               uint32_t position) {
  DFLASH_INVARIANT(vocab > 0);
  if (params.greedy()) return argmax_row(logits, vocab);
  params.validate();
  std::vector<float> probs(vocab);
  std::vector<int32_t> order(vocab);
  return sample_row(logits, vocab, params, request, position, probs.data(), order.data());
}

}  // namespace dflash

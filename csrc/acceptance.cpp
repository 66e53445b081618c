// acceptance.cpp: greedy and point-mass rejection sampling over raw logits rows.
#include "acceptance.h"

#include <string>
#include <vector>

#include "errors.h"
#include "rng.h"

namespace dflash {

namespace {
void check_drafts(const int64_t* drafts, int64_t num_drafts, int64_t vocab) {
  DFLASH_INVARIANT(num_drafts >= 0 && vocab > 0);
  for (int64_t j = 0; j < num_drafts; ++j)
    if (drafts[j] < 0 || drafts[j] >= vocab)
      throw Error("draft token " + std::to_string(drafts[j]) + " at block slot " + std::to_string(j + 1) +
                  " is outside the target vocabulary of " + std::to_string(vocab) +
                  "; the drafter and target vocabularies disagree");
}
}  // namespace

Acceptance accept_greedy(const int64_t* drafts, int64_t num_drafts, const float* logits, int64_t vocab) {
  check_drafts(drafts, num_drafts, vocab);
  int64_t n = 0;
  int64_t choice = argmax(logits, vocab);
  while (n < num_drafts && drafts[n] == choice) {
    ++n;
    choice = argmax(logits + n * vocab, vocab);
  }
  return {n, choice};
}

Acceptance accept_point_mass(const int64_t* drafts, int64_t num_drafts, const float* logits, int64_t vocab,
                             const SamplingParams& params, uint64_t request, uint32_t position) {
  check_drafts(drafts, num_drafts, vocab);
  // Sample, then compare: the token at each position is the target's own draw there, whatever was
  // drafted, and the draft is kept while it equals that draw. Rows are turned into probabilities
  // only when reached: a rejection at slot j skips the rest.
  std::vector<float> probs(vocab);
  for (int64_t j = 0;; ++j) {  // returns at j == num_drafts (the bonus) at the latest
    const uint32_t at = position + uint32_t(j);
    target_probs(logits + j * vocab, 1, vocab, params, probs.data());
    const int64_t drawn = draw_categorical(probs.data(), vocab, uniform(params.seed, request, at, kCategoricalDraw));
    if (j == num_drafts || drawn != drafts[j]) return {j, drawn};
  }
}

Acceptance accept(const int64_t* drafts, int64_t num_drafts, const float* logits, int64_t vocab,
                  const SamplingParams& params, uint64_t request, uint32_t position) {
  if (params.greedy()) return accept_greedy(drafts, num_drafts, logits, vocab);
  return accept_point_mass(drafts, num_drafts, logits, vocab, params, request, position);
}

int64_t sample(const float* logits, int64_t vocab, const SamplingParams& params, uint64_t request,
               uint32_t position) {
  if (params.greedy()) return argmax(logits, vocab);
  std::vector<float> probs(vocab);
  target_probs(logits, 1, vocab, params, probs.data());
  return draw_categorical(probs.data(), vocab, uniform(params.seed, request, position, kCategoricalDraw));
}

}  // namespace dflash

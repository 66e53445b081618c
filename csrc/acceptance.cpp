// acceptance.cpp: the host entry points of greedy, point-mass and drafter-distribution rejection sampling
// (decide.h holds the rules the first two share with the GPU).
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

void draw_block_drafts(const float* draft_logits, int64_t num_drafts, int64_t draft_vocab_size,
                       const std::vector<int64_t>& draft_vocab, const SamplingParams& params, uint64_t request,
                       uint32_t position, int64_t* tokens, float* q) {
  DFLASH_INVARIANT(draft_vocab_size > 0 && !params.greedy());
  params.validate();
  std::vector<int32_t> order(draft_vocab_size);
  for (int64_t j = 0; j < num_drafts; ++j) {
    const int64_t id = draft_row(draft_logits + j * draft_vocab_size, draft_vocab_size, params, request,
                                 position + uint32_t(j), q + j * draft_vocab_size, order.data());
    tokens[j] = draft_vocab.empty() || id < 0 ? id : draft_vocab[id];  // kNoToken: no draw (NaN scores)
  }
}

void draw_selector_drafts(const float* scores, const int64_t* columns, int64_t num_drafts, int64_t top_k,
                          int64_t draft_vocab_size, const std::vector<int64_t>& draft_vocab,
                          const SamplingParams& params, uint64_t request, uint32_t position, int64_t* tokens,
                          float* q) {
  DFLASH_INVARIANT(top_k > 0 && top_k <= draft_vocab_size && !params.greedy());
  params.validate();
  for (int64_t i = 0; i < num_drafts * top_k; ++i) DFLASH_INVARIANT(columns[i] >= 0 && columns[i] < draft_vocab_size);
  std::vector<float> probs(top_k);
  std::vector<int32_t> order(top_k);
  selector_walk(scores, columns, num_drafts, top_k, draft_vocab_size, params, request, position, q, tokens,
                probs.data(), order.data());
  if (!draft_vocab.empty())
    for (int64_t j = 0; j < num_drafts; ++j)
      if (tokens[j] >= 0) tokens[j] = draft_vocab[tokens[j]];
}

std::vector<int32_t> draft_ids_of(const std::vector<int64_t>& draft_vocab, int64_t vocab, const std::string& who) {
  std::vector<int32_t> draft_of(draft_vocab.empty() ? 0 : vocab, -1);
  for (size_t id = 0; id < draft_vocab.size(); ++id) {
    if (draft_vocab[id] < 0 || draft_vocab[id] >= vocab)
      throw Error(who + ": draft_vocab id " + std::to_string(draft_vocab[id]) + " is outside the target's vocabulary");
    draft_of[draft_vocab[id]] = int32_t(id);
  }
  return draft_of;
}

Acceptance accept_drafter(const int64_t* drafts, int64_t num_drafts, const float* logits, int64_t vocab,
                          const float* q, int64_t draft_vocab, const int32_t* draft_of, const SamplingParams& params,
                          uint64_t request, uint32_t position) {
  if (params.greedy()) return accept_greedy(drafts, num_drafts, logits, vocab);
  params.validate();
  check_drafts(drafts, num_drafts, vocab);
  std::vector<float> p(vocab);
  std::vector<int32_t> order(vocab);
  for (int64_t j = 0; j < num_drafts; ++j) {
    const float* q_row = q + j * draft_vocab;
    const int64_t id = draft_of ? draft_of[drafts[j]] : drafts[j];
    if (!(id >= 0 && q_row[id] > 0.0f))
      throw Error("draft token " + std::to_string(drafts[j]) + " at block slot " + std::to_string(j + 1) +
                  " has probability 0 under the distribution it was said to be drawn from");
    const int64_t token = drafter_position(logits + j * vocab, vocab, drafts[j], q_row, draft_of, params, request,
                                           position + uint32_t(j), p.data(), order.data());
    if (token != kKept) return {j, token};
  }
  return {num_drafts, sample(logits + num_drafts * vocab, vocab, params, request, position + uint32_t(num_drafts))};
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

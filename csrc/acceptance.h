// acceptance.h: which drafted tokens the target keeps, and the token that follows them.
//
// The C++ twin of dflash_trt/spec/acceptance.py: the host entry points (checked inputs, own scratch)
// over the rules in decide.h, which a GPU kernel runs too. Both rules return (n, next): the first n drafts are
// accepted and `next` is the target's own token at the first position it did not accept (the
// bonus when all are accepted), so every committed token is one the target would have produced.
//
// Randomness comes only from the counter RNG keyed by (seed, request, position of the token being
// decided), so a request's accepted tokens do not depend on what else is in the batch.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "decide.h"
#include "sampling.h"

namespace dflash {

using Acceptance = Verdict;  // drafts kept (0..num_drafts) and the target's token after them

// One line (dflash::Error) for a draft outside the target's vocabulary: the pair disagrees. Every
// decision checks its drafts here first, on the host, wherever the rules then run.
void check_drafts(const int64_t* drafts, int64_t num_drafts, int64_t vocab);

// Longest prefix of drafts equal to the target's argmax. logits [num_drafts + 1, vocab].
Acceptance accept_greedy(const int64_t* drafts, int64_t num_drafts, const float* logits, int64_t vocab);

// Speculative sampling with the draft as a point mass (q(d) = 1), as "sample, then compare": at
// each position draw y from the target distribution p (inverse CDF on the position's categorical
// uniform); the draft d is accepted iff y == d, and the token emitted there is y either way (the
// bonus when every draft is accepted). Exactly the rejection rule of Leviathan et al. (2023) for a
// point-mass draft: P(accept) = p(d), and given a rejection y is p without d, renormalised (the
// residual). Unlike accept-then-resample, the token at a position is a function of (seed, request,
// position, logits) alone: the same as `sample` would draw there, whatever was drafted and however
// long the block, so adaptive block sizes leave a seeded request's tokens unchanged.
// `position` is the sequence position of drafts[0] (tokens already in the sequence before it):
// the decision about drafts[j] draws at position + j.
Acceptance accept_point_mass(const int64_t* drafts, int64_t num_drafts, const float* logits, int64_t vocab,
                             const SamplingParams& params, uint64_t request, uint32_t position);

// The drafter-distribution rule (an engine's choice, LLM(draft_rule="drafter")): drafts drawn from the
// drafter's own distribution q and kept by the rejection rule of Leviathan et al. (2023), as the
// DFlash authors' loop does (decide.h's draft_row_by, selector_walk_by, drafter_position_by, which the
// GPU kernels run too). draw_block_drafts: at each of a block's `num_drafts` positions (draft j at
// position + j), q over the draft ids (the request's temperature, top-k and top-p over the drafter's
// logits draft_logits [num_drafts, draft_vocab_size], as sampling.h states them for the target) and a
// draft id drawn from it with the uniform at (request, position + j, kDraftDraw) -> their target ids
// into `tokens` ([num_drafts]; draft_vocab: each draft id's target id, empty: the same ids) and their
// distributions into `q` [num_drafts, draft_vocab_size].
void draw_block_drafts(const float* draft_logits, int64_t num_drafts, int64_t draft_vocab_size,
                       const std::vector<int64_t>& draft_vocab, const SamplingParams& params, uint64_t request,
                       uint32_t position, int64_t* tokens, float* q);
// A DFlash2 drafter's block under the rule (decide.h's selector_walk_by): scores [num_drafts, top_k, top_k]
// and columns [num_drafts, top_k] (the candidates' draft ids) -> tokens [num_drafts] (target ids, through
// draft_vocab), q [num_drafts, draft_vocab_size].
void draw_selector_drafts(const float* scores, const int64_t* columns, int64_t num_drafts, int64_t top_k,
                          int64_t draft_vocab_size, const std::vector<int64_t>& draft_vocab,
                          const SamplingParams& params, uint64_t request, uint32_t position, int64_t* tokens,
                          float* q);
// A draft vocabulary's inverse, accept_drafter's `draft_of`: each target id's draft id, -1 where the
// drafter cannot propose it; empty for no draft vocabulary. One line (dflash::Error, after `who`) for an
// id outside the target's vocabulary.
std::vector<int32_t> draft_ids_of(const std::vector<int64_t>& draft_vocab, int64_t vocab, const std::string& who);

// accept_drafter: drafts[j] (a target id) was drawn from q row j [num_drafts, draft_vocab]; the target
// keeps it with probability min(1, p_j(d) / q_j(d)) (uniform at position + j, kAcceptDraw) and at the
// first rejection emits a draw from (p_j - q_j)+ renormalised (kCategoricalDraw there); when every
// draft is kept, the bonus is the target's draw at the last row, as `sample` draws it. Every emitted
// token then follows p exactly, whatever q is. Unlike point mass, a token depends on the drafts and so
// on where blocks start: a seeded request repeats its tokens only under the same block sizes.
// draft_of [vocab]: a target id's draft id, -1 where the drafter cannot propose it (null: the same ids).
// Greedy params: accept_greedy (greedy drafts are the drafter's argmax).
Acceptance accept_drafter(const int64_t* drafts, int64_t num_drafts, const float* logits, int64_t vocab,
                          const float* q, int64_t draft_vocab, const int32_t* draft_of, const SamplingParams& params,
                          uint64_t request, uint32_t position);

// The rule the params ask for: greedy at temperature 0, point-mass rejection sampling otherwise.
Acceptance accept(const int64_t* drafts, int64_t num_drafts, const float* logits, int64_t vocab,
                  const SamplingParams& params, uint64_t request, uint32_t position);

// One token from one logits row, for prefill and plain decoding: argmax, or a draw at `position`.
int64_t sample(const float* logits, int64_t vocab, const SamplingParams& params, uint64_t request,
               uint32_t position);

}  // namespace dflash

// constraint.h: structured output. A request may carry a grammar its output must follow (JSON schema,
// regex, choice, ...); the caller compiles it, and the core only asks which tokens may come next.
//
// A mask is `words` = ceil(vocab / 32) uint32 words: token t is allowed when bit t % 32 of word t / 32
// is set. Disallowed tokens get -inf before any decision (penalties.h), greedy and sampled alike, so
// a speculative step stays lossless: a verify position's mask follows the output up to it, the drafts
// before it included, and a draft the grammar refuses can never be kept.
#pragma once

#include <cstdint>
#include <vector>

namespace dflash {

class OutputConstraint {
 public:
  virtual ~OutputConstraint() = default;
  // The masks after the output so far and after each leading draft the grammar allows: k + 1 masks of
  // `words` words into `masks` (replacing what it held), k being those drafts -> k. With `may_replace`,
  // a draft the grammar refuses where it allows one token only becomes that token in `drafts` (what the
  // target then verifies): drafts are proposals, so where the target's draw at a position does not
  // depend on them (greedy, or point-mass drafts at T>0) any proposal is lossless, and a forced one (a
  // schema's key, a bracket) is the one the target must take.
  virtual int64_t masks(std::vector<int64_t>& drafts, bool may_replace, int64_t words,
                        std::vector<uint32_t>& masks) = 0;
  // The output grew by `tokens` (committed: the grammar takes them for good).
  virtual void advance(const std::vector<int64_t>& tokens) = 0;
};

}  // namespace dflash

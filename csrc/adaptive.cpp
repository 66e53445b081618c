// adaptive.cpp: the block-size policy and the acceptance estimate it reads.
#include "adaptive.h"

#include <algorithm>
#include <string>

#include "errors.h"

namespace dflash {

double expected_tokens(const std::vector<double>& acceptance, int64_t block) {
  DFLASH_INVARIANT(block >= 1);
  double total = 1.0, run = 1.0;
  for (int64_t k = 1; k < block; ++k) {
    run *= k <= int64_t(acceptance.size()) ? acceptance[k - 1] : 0.0;
    total += run;
  }
  return total;
}

int64_t choose_block(const std::vector<double>& acceptance, const std::vector<int64_t>& limits,
                     const std::vector<double>& verify_cost, const std::vector<double>& draft_cost) {
  const int64_t max_block = int64_t(verify_cost.size());
  if (max_block < 1) throw Error("choose_block needs the verify cost of at least block size 1");
  if (int64_t(draft_cost.size()) != max_block)
    throw Error("choose_block needs one draft cost per block size (" + std::to_string(max_block) + "), got " +
                std::to_string(draft_cost.size()));
  for (double a : acceptance)
    if (!(a >= 0 && a <= 1)) throw Error("acceptance estimates must be probabilities in [0, 1], got " + std::to_string(a));
  for (int64_t b = 1; b <= max_block; ++b)
    if (!(verify_cost[b - 1] >= 0) || (b > 1 && !(draft_cost[b - 1] >= 0)))
      throw Error("phase costs must be seconds >= 0 (block size " + std::to_string(b) + ")");
  for (int64_t limit : limits)
    if (limit < 1) throw Error("a row's block limit must be at least 1, got " + std::to_string(limit));

  int64_t best = 1;
  double best_rate = -1.0;
  for (int64_t b = 1; b <= max_block; ++b) {
    double tokens = 0.0;
    if (limits.empty()) tokens = expected_tokens(acceptance, b);
    for (int64_t limit : limits) tokens += expected_tokens(acceptance, std::min(b, limit));
    const double seconds = verify_cost[b - 1] + (b > 1 ? draft_cost[b - 1] : 0.0);
    // A step too quick for the clock to see still ranks by the tokens it commits.
    const double rate = tokens / std::max(seconds, 1e-12);
    if (rate > best_rate * (1 + 1e-12)) best = b, best_rate = rate;  // strictly better: ties stay small
  }
  return best;
}

AcceptanceEstimate::AcceptanceEstimate(int64_t max_drafts) : accepted_(std::max<int64_t>(max_drafts, 0), 0.0),
                                                             tried_(std::max<int64_t>(max_drafts, 0), 0.0) {}

void AcceptanceEstimate::observe(int64_t drafted, int64_t accepted) {
  DFLASH_INVARIANT(accepted >= 0 && accepted <= drafted && drafted <= int64_t(tried_.size()));
  // Position j (1-based) was decided only if every draft before it was accepted.
  for (int64_t j = 1; j <= std::min(accepted + 1, drafted); ++j) tried_[j - 1] += 1;
  for (int64_t j = 1; j <= accepted; ++j) accepted_[j - 1] += 1;
}

void AcceptanceEstimate::decay() {
  for (double& x : accepted_) x *= kDecay;
  for (double& x : tried_) x *= kDecay;
}

std::vector<double> AcceptanceEstimate::acceptance() const {
  std::vector<double> a(tried_.size());
  for (size_t j = 0; j < a.size(); ++j) a[j] = (accepted_[j] + 1.0) / (tried_[j] + 2.0);
  return a;
}

}  // namespace dflash

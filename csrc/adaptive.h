// adaptive.h: adaptive speculation, the verify block size a step should use, and what it learns from.
//
// Policy (a pure function): with a_j the probability that draft j is accepted given drafts 1..j-1
// were, a row verifying a block of B expects to commit
//     E_B = 1 + sum_{k=1}^{B-1} prod_{j<=k} a_j
// tokens (the target's own token always commits). A step over rows whose blocks may be cut to
// limit_i (the tokens a row may still emit) commits sum_i E_{min(B, limit_i)} and costs
// verify(B) + (B > 1 ? draft(B) : 0) seconds, so the step takes the B in 1..max that maximises
//     sum_i E_{min(B, limit_i)} / (verify(B) + (B > 1 ? draft(B) : 0))
// (= rows * E_B / cost when no row is cut), ties to the smaller B. Whatever it picks is lossless:
// acceptance keeps only tokens the target would have produced (acceptance.h).
//
// Estimate: a_j from discounted counts with a Beta(1, 1) prior, (accepted_j + 1) / (tried_j + 2),
// where a verify that drafted d tokens and accepted n tried positions 1..min(n + 1, d) and
// accepted 1..n. Every step multiplies the counts by kDecay, so old evidence fades back toward the
// prior: a drafter written off at B = 1 (no verify, no data) is tried again after a few hundred
// steps, and a drifting one (another kind of prompt) is followed.
#pragma once

#include <cstdint>
#include <vector>

namespace dflash {

// E_B for one row from a_1..a_{B-1} (acceptance[j - 1] = a_j; missing ones count as 0).
double expected_tokens(const std::vector<double>& acceptance, int64_t block);

// The step's block size in 1..max, max = verify_cost.size(); verify_cost[B - 1] and
// draft_cost[B - 1] are the seconds of the step's verify and draft calls at block B (draft_cost[0]
// is not read); limits: each row's largest useful block (empty: every row takes any B).
int64_t choose_block(const std::vector<double>& acceptance, const std::vector<int64_t>& limits,
                     const std::vector<double>& verify_cost, const std::vector<double>& draft_cost);

class AcceptanceEstimate {
 public:
  static constexpr double kDecay = 0.99;  // per step: evidence halves in about 70 steps

  explicit AcceptanceEstimate(int64_t max_drafts);
  // One row's verify: `drafted` drafts checked, the first `accepted` kept.
  void observe(int64_t drafted, int64_t accepted);
  // Once per step that verified rows.
  void decay();
  // a_1..a_max_drafts.
  std::vector<double> acceptance() const;

 private:
  std::vector<double> accepted_, tried_;
};

}  // namespace dflash

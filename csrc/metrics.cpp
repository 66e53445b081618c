// metrics.cpp: counter arithmetic for SpecMetrics.
#include "metrics.h"

#include <algorithm>

#include "errors.h"

namespace dflash {

void SpecMetrics::record(int64_t drafted, int64_t accepted) {
  DFLASH_INVARIANT(drafted >= 1 && accepted >= 0 && accepted <= drafted);
  ++num_drafts;
  num_draft_tokens += drafted;
  num_accepted_tokens += accepted;
  if (int64_t(accepted_per_position.size()) < drafted) accepted_per_position.resize(drafted, 0);
  for (int64_t k = 0; k < accepted; ++k) ++accepted_per_position[k];
}

void SpecMetrics::merge(const SpecMetrics& other) {
  num_drafts += other.num_drafts;
  num_draft_tokens += other.num_draft_tokens;
  num_accepted_tokens += other.num_accepted_tokens;
  if (accepted_per_position.size() < other.accepted_per_position.size())
    accepted_per_position.resize(other.accepted_per_position.size(), 0);
  for (size_t k = 0; k < other.accepted_per_position.size(); ++k)
    accepted_per_position[k] += other.accepted_per_position[k];
}

double SpecMetrics::mean_acceptance_length() const {
  return num_drafts ? 1.0 + double(num_accepted_tokens) / double(num_drafts) : 0.0;
}

SpecMetrics aggregate(const std::vector<SpecMetrics>& requests) {
  SpecMetrics total;
  for (const SpecMetrics& m : requests) total.merge(m);
  return total;
}

}  // namespace dflash

// metrics.cpp: counter arithmetic for SpecMetrics.
#include "metrics.h"

#include <algorithm>
#include <chrono>

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

double RequestTiming::now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

void RequestTiming::tokens(double t, int64_t count) {
  DFLASH_INVARIANT(count >= 1);
  if (!first_token) first_token = t;
  last_token = t;
  num_tokens += count;
}

namespace {
std::optional<double> since(const std::optional<double>& start, const std::optional<double>& end) {
  if (!start || !end) return std::nullopt;
  return *end - *start;
}
}  // namespace

std::optional<double> RequestTiming::queue_time() const { return since(arrival, scheduled); }
std::optional<double> RequestTiming::time_to_first_token() const { return since(arrival, first_token); }
std::optional<double> RequestTiming::e2e_latency() const { return since(arrival, finished); }

std::optional<double> RequestTiming::time_per_output_token() const {
  if (num_tokens < 2) return std::nullopt;
  return *since(first_token, last_token) / double(num_tokens - 1);
}

}  // namespace dflash

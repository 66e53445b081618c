// metrics.h: per-request speculative-decoding counters, named as vLLM names them.
//
// A "draft" is one verify step that proposed at least one token. Its acceptance length counts the
// bonus token, so mean_acceptance_length = 1 + num_accepted_tokens / num_drafts, as in
// dflash_trt/spec/metrics.py. The block size may change from step to step (adaptive speculation),
// so draft tokens are counted per step rather than as num_drafts * (B - 1).
#pragma once

#include <cstdint>
#include <vector>

namespace dflash {

struct SpecMetrics {
  int64_t num_drafts = 0;
  int64_t num_draft_tokens = 0;
  int64_t num_accepted_tokens = 0;
  // accepted_per_position[k]: steps that accepted the draft at block slot k + 1.
  std::vector<int64_t> accepted_per_position;

  // One verify step: `drafted` tokens proposed (B - 1), the first `accepted` of them kept.
  void record(int64_t drafted, int64_t accepted);
  // Add another request's counters (the aggregate over a batch or a run).
  void merge(const SpecMetrics& other);
  // 0 when no drafts were made (the Python twin says None).
  double mean_acceptance_length() const;
};

SpecMetrics aggregate(const std::vector<SpecMetrics>& requests);

}  // namespace dflash

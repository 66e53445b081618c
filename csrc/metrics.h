// metrics.h: per-request speculative-decoding counters, named as vLLM names them.
//
// A "draft" is one verify step that proposed at least one token. Its acceptance length counts the
// bonus token, so mean_acceptance_length = 1 + num_accepted_tokens / num_drafts, as in
// dflash_trt/spec/metrics.py. The block size may change from step to step (adaptive speculation),
// so draft tokens are counted per step rather than as num_drafts * (B - 1).
#pragma once

#include <cstdint>
#include <optional>
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

// One request's time points, in seconds on the steady clock (monotonic; only differences mean
// anything), and the latencies vLLM reports from them. A point not reached yet is unset, and so is
// every latency that needs it.
struct RequestTiming {
  std::optional<double> arrival;      // add_request
  std::optional<double> scheduled;    // the start of the step that prefills it (leaves the queue)
  std::optional<double> first_token;  // its first token emitted
  std::optional<double> last_token;   // its latest token emitted
  std::optional<double> finished;     // finished or aborted
  int64_t num_tokens = 0;             // output tokens at last_token

  // The current steady-clock time in seconds.
  static double now();
  // Record `count` tokens emitted at time t (count >= 1).
  void tokens(double t, int64_t count);

  std::optional<double> queue_time() const;       // scheduled - arrival
  std::optional<double> time_to_first_token() const;  // first_token - arrival
  // Mean gap between output tokens after the first: (last_token - first_token) / (num_tokens - 1);
  // unset until a second token. Tokens committed by one verify share a time point.
  std::optional<double> time_per_output_token() const;
  std::optional<double> e2e_latency() const;  // finished - arrival
};

}  // namespace dflash

// penalties.cpp: a phase's penalty rows (penalties.h), built on the host.
#include "penalties.h"

#include "errors.h"

namespace dflash {

void add_penalty_row(const PenaltyHistory& history, const std::vector<int64_t>& block, int64_t positions,
                     int64_t first, const SamplingParams& params, std::vector<PenaltyRow>& rows,
                     std::vector<PenaltyEntry>& entries, std::vector<int32_t>& tokens) {
  DFLASH_INVARIANT(positions >= 1 && (positions == 1 || int64_t(block.size()) >= positions));
  PenaltyRow row;
  row.first = first;
  row.positions = positions;
  row.repetition = float(params.repetition_penalty);
  row.frequency = float(params.frequency_penalty);
  row.presence = float(params.presence_penalty);
  row.begin = int64_t(entries.size());
  for (const auto& [token, h] : history) {
    // without a repetition penalty a prompt token the output lacks is left as it is
    if (h.count == 0 && row.repetition == 1.0f) continue;
    entries.push_back({token, h.count, h.in_prompt ? 1 : 0});
  }
  row.end = int64_t(entries.size());
  row.block = int64_t(tokens.size());
  for (int64_t k = 0; k < positions; ++k) tokens.push_back(int32_t(positions == 1 ? 0 : block[k]));
  rows.push_back(row);
}

}  // namespace dflash

// penalties.cpp: the (row, position) lists of penalties.h, built on the host.
#include "penalties.h"

namespace dflash {

void penalty_lists(const PenaltyHistory& history, const std::vector<int64_t>& block, int64_t positions,
                   int64_t first_row, const SamplingParams& params, std::vector<PenaltyList>& lists,
                   std::vector<PenaltyEntry>& entries) {
  PenaltyHistory seen = history;  // grows by a draft per position
  for (int64_t k = 0; k < positions; ++k) {
    if (k > 0) ++seen[int32_t(block[k])].count;  // the draft before position k
    PenaltyList list;
    list.row = first_row + k;
    list.begin = int64_t(entries.size());
    list.repetition = float(params.repetition_penalty);
    list.frequency = float(params.frequency_penalty);
    list.presence = float(params.presence_penalty);
    for (const auto& [token, h] : seen) {
      // without a repetition penalty a prompt token the output lacks is left as it is
      if (h.count == 0 && list.repetition == 1.0f) continue;
      entries.push_back({token, h.count, h.in_prompt ? 1 : 0});
    }
    list.end = int64_t(entries.size());
    lists.push_back(list);
  }
}

}  // namespace dflash

// penalties.cpp: a phase's penalty rows (penalties.h), built on the host.
#include "penalties.h"

#include <cmath>

#include "errors.h"

namespace dflash {

void add_penalty_row(const PenaltyHistory& history, const std::vector<int64_t>& block, int64_t positions,
                     int64_t first, const SamplingParams& params, int64_t ban, const uint32_t* masks, int64_t words,
                     std::vector<PenaltyRow>& rows, std::vector<PenaltyEntry>& entries, std::vector<int32_t>& tokens,
                     std::vector<uint32_t>& mask_words) {
  DFLASH_INVARIANT(positions >= 1 && (positions == 1 || int64_t(block.size()) >= positions));
  PenaltyRow row;
  row.first = first;
  row.positions = positions;
  row.repetition = float(params.repetition_penalty);
  row.frequency = float(params.frequency_penalty);
  row.presence = float(params.presence_penalty);
  row.ban = ban;
  if (cuts_min_p(params)) {
    row.min_p_cut = 1;
    row.min_p_margin = float(params.temperature * std::log(params.min_p));
  }
  row.begin = int64_t(entries.size());
  const bool penalized = penalizes(params);
  for (const auto& [token, h] : history) {
    // what changes nothing here stays out: a token seen without a penalty, a prompt token without a
    // repetition penalty, a stop token once min_tokens is reached
    const bool repeated = penalized && (h.count > 0 || (h.in_prompt && row.repetition != 1.0f));
    if (!repeated && h.bias == 0.0f && !(h.stop && ban > 0)) continue;
    const int32_t flags = (h.in_prompt ? PenaltyEntry::kInPrompt : 0) | (h.stop ? PenaltyEntry::kStop : 0);
    entries.push_back({token, h.count, flags, h.bias});
  }
  row.end = int64_t(entries.size());
  row.block = int64_t(tokens.size());
  for (int64_t k = 0; k < positions; ++k) tokens.push_back(int32_t(positions == 1 ? 0 : block[k]));
  if (masks != nullptr) {
    row.mask = int64_t(mask_words.size());
    mask_words.insert(mask_words.end(), masks, masks + positions * words);
  }
  rows.push_back(row);
}

}  // namespace dflash

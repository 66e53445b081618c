// slot_executor.cpp: the phases of csrc/executor.h as graph runs over slot buffers.
#include "slot_executor.h"

#include <algorithm>
#include <cstring>

namespace dflash {

namespace {

constexpr int64_t kContextBucket = 64;  // draft context lengths a GPU's block pass is shaped for

void positive(const std::string& who, int64_t value, const char* name) {
  if (value < 1) throw Error(who + ": " + name + " must be >= 1, got " + std::to_string(value));
}

// `bytes` of host data into a Staged array's host side, then to the device.
template <typename T>
void stage(Staged<T>& staged, const void* data, size_t bytes) {
  staged.host.resize(bytes / sizeof(T));
  std::memcpy(staged.host.data(), data, bytes);
  staged.upload();
}

std::vector<int64_t> up_to(int64_t n) {
  std::vector<int64_t> all(n);
  for (int64_t i = 0; i < n; ++i) all[i] = i;
  return all;
}

std::vector<std::string> cache_names(const std::string& prefix, const std::vector<int64_t>& layers,
                                     const std::string& suffix = "") {
  std::vector<std::string> names;  // the bundle's order: key_i, value_i, key_j, ... (i, j: layer indices)
  for (int64_t i : layers)
    for (const char* kind : {"key", "value"}) names.push_back(prefix + "_" + kind + suffix + "_" + std::to_string(i));
  return names;
}

std::vector<std::string> state_names(const std::string& prefix, const std::vector<int64_t>& layers) {
  std::vector<std::string> names;
  for (int64_t i : layers) names.push_back(prefix + "_" + std::to_string(i));
  return names;
}

// Each of the target's layers in exactly one of the two lists, each list ascending.
void check_layer_split(const std::string& who, const std::vector<int64_t>& attention,
                       const std::vector<int64_t>& linear, int64_t layers) {
  std::vector<int> seen(layers, 0);
  for (const auto* list : {&attention, &linear})
    for (size_t k = 0; k < list->size(); ++k) {
      const int64_t i = (*list)[k];
      if (i < 0 || i >= layers || (k > 0 && i <= (*list)[k - 1]))
        throw Error(who + ": attention_layers and linear_layers must be ascending layer indices below " +
                    "target_layers (" + std::to_string(layers) + "), got " + std::to_string(i));
      ++seen[i];
    }
  for (int64_t i = 0; i < layers; ++i)
    if (seen[i] != 1)
      throw Error(who + ": target layer " + std::to_string(i) + " is in " + std::to_string(seen[i]) +
                  " of attention_layers and linear_layers (each layer must be in exactly one)");
}

template <typename T, typename A>
void fill(std::vector<T, A>& buffer, size_t size, T value) {
  buffer.assign(size, value);  // grows once, then reuses the allocation
}

std::vector<Buffer> buffers(Device& device, DType dtype, size_t count, size_t elements) {
  std::vector<Buffer> out;
  out.reserve(count);
  for (size_t i = 0; i < count; ++i) {
    out.emplace_back(device, dtype);
    out.back().reserve(elements);  // zeros: never NaN where masked
  }
  return out;
}

}  // namespace

void SlotExecutorConfig::validate(const std::string& who) const {
  float_dtype(dtype, who);
  for (const auto& [path, name] : {std::pair{&target_path, "target"}, std::pair{&library_path, "library"}})
    if (path->empty()) throw Error(who + ": no " + name + " path given");
  positive(who, max_batch, "max_batch");
  positive(who, capacity, "capacity");
  positive(who, min_query_tokens, "min_query_tokens");
  positive(who, target_layers, "target_layers");
  positive(who, target_kv_heads, "target_kv_heads");
  positive(who, target_head_dim, "target_head_dim");
  positive(who, vocab, "vocab");
  if (threads < 0) throw Error(who + ": threads must be >= 0 (0: the runtime's default)");
  if (has_drafter()) {
    for (const auto& [path, name] :
         {std::pair{&draft_context_path, "draft_context"}, std::pair{&draft_block_path, "draft_block"}})
      if (path->empty()) throw Error(who + ": no " + name + " path given");
    positive(who, feature_width, "feature_width");
    positive(who, draft_kv_heads, "draft_kv_heads");
    positive(who, draft_head_dim, "draft_head_dim");
    if (mask_token_id < 0 || mask_token_id >= vocab)
      throw Error(who + ": mask_token_id " + std::to_string(mask_token_id) + " is outside the vocabulary");
  } else if (draft_layers < 0 || feature_width != 0 || !draft_context_path.empty() || !draft_block_path.empty()) {
    throw Error(who + ": a target without a drafter (draft_layers 0) has no draft graphs and taps no features");
  }
  if (sample_drafts) {
    if (!has_drafter()) throw Error(who + ": sample_drafts needs a drafter");
    positive(who, draft_vocab_size, "draft_vocab_size");
    if (draft_vocab.empty() ? draft_vocab_size != vocab : int64_t(draft_vocab.size()) != draft_vocab_size)
      throw Error(who + ": draft_vocab lists " + std::to_string(draft_vocab.size()) + " ids for a draft vocabulary of " +
                  std::to_string(draft_vocab_size) + " (none: the target's " + std::to_string(vocab) + ")");
    draft_ids_of(draft_vocab, vocab, who);  // its ids inside the target's vocabulary
    if (selector_top_k < 0 || selector_top_k > draft_vocab_size)
      throw Error(who + ": selector_top_k must be in [0, draft_vocab_size], got " + std::to_string(selector_top_k));
  }
  check_layer_split(who, attention_layers, linear_layers, target_layers);
  if (linear_layers.empty()) return;
  positive(who, conv_dim, "conv_dim");
  if (conv_kernel < 2)
    throw Error(who + ": conv_kernel must be >= 2 (its state keeps conv_kernel - 1 columns), got " +
                std::to_string(conv_kernel));
  positive(who, linear_key_heads, "linear_key_heads");
  positive(who, linear_value_heads, "linear_value_heads");
  if (linear_value_heads % linear_key_heads != 0)
    throw Error(who + ": linear_value_heads (" + std::to_string(linear_value_heads) +
                ") must be a multiple of linear_key_heads (" + std::to_string(linear_key_heads) + ")");
  positive(who, linear_key_head_dim, "linear_key_head_dim");
  positive(who, linear_value_head_dim, "linear_value_head_dim");
}

SlotExecutor::SlotExecutor(const SlotExecutorConfig& config, std::unique_ptr<GraphBackend> backend,
                           const std::string& who)
    : config_(config),
      who_(who),
      backend_(std::move(backend)),
      device_(backend_->device()),
      dtype_(float_dtype(config.dtype, who)),
      swap_scratch_(device_, DType::float32),
      ids_(device_, DType::int64),
      cache_lengths_(device_, DType::int64),
      query_lengths_(device_, DType::int64),
      logits_index_(device_, DType::int64),
      positions_(device_, DType::int64),
      lengths_(device_, DType::int64),
      tokens_(device_, DType::int64),
      logits_(device_, DType::float32),
      decide_rows_(device_, DType::int64),
      verdicts_(device_, DType::int64),
      decide_logprobs_(device_, DType::int64),
      rebuild_rows_(device_, DType::int64),
      decide_drafts_(device_, DType::int64),
      penalty_rows_(device_, DType::int64),
      penalty_entries_(device_, DType::int64),
      penalty_tokens_(device_, DType::int64),
      penalty_masks_(device_, DType::int64),
      decide_probs_(device_, DType::float32),
      decide_order_(device_, DType::float32),
      draft_scores_(device_, DType::float32),
      selector_columns_(device_, DType::int64),
      draft_vocab_device_(device_, DType::int64),
      draft_of_device_(device_, DType::int64),
      draft_q_(device_, DType::float32),
      draft_probs_(device_, DType::float32),
      draft_order_(device_, DType::float32),
      features_(device_, dtype_) {
  config_.validate(who_);
  draft_of_ = draft_ids_of(config_.draft_vocab, config_.vocab, who_);
  if (config_.sample_drafts && device_.decides() && !draft_of_.empty()) {  // the rule's maps, on the device once
    draft_vocab_device_.host.assign(config_.draft_vocab.begin(), config_.draft_vocab.end());
    draft_vocab_device_.upload();
    stage(draft_of_device_, draft_of_.data(), draft_of_.size() * sizeof(int32_t));  // int32s in an int64 mirror
    device_.synchronize();
  }
  target_ = backend_->open(config_.target_path);
  if (config_.has_drafter()) {
    draft_context_ = backend_->open(config_.draft_context_path);
    draft_block_ = backend_->open(config_.draft_block_path);
  }
  target_cache_in_ = cache_names("cache", config_.attention_layers);
  target_cache_out_ = cache_names("cache", config_.attention_layers, "_out");
  context_names_ = cache_names("context", up_to(config_.draft_layers));
  conv_in_ = state_names("conv_state", config_.linear_layers);
  recurrent_in_ = state_names("recurrent_state", config_.linear_layers);
  conv_out_names_ = state_names("conv_state_out", config_.linear_layers);
  recurrent_out_names_ = state_names("recurrent_state_out", config_.linear_layers);
  conv_inputs_names_ = state_names("conv_inputs", config_.linear_layers);
  delta_inputs_names_ = state_names("delta_inputs", config_.linear_layers);

  const SlotExecutorConfig& c = config_;
  const size_t target_slots = c.max_batch * c.target_kv_heads * slot_positions() * c.target_head_dim;
  const size_t draft_slots = c.max_batch * c.draft_kv_heads * c.capacity * c.draft_head_dim;
  target_kv_ = buffers(device_, dtype_, 2 * c.attention_layers.size(), target_slots);
  draft_kv_ = buffers(device_, dtype_, 2 * c.draft_layers, draft_slots);
  context_ = buffers(device_, dtype_, 2 * c.draft_layers, 0);
  const size_t linear = c.linear_layers.size();
  conv_size_ = c.conv_dim * (c.conv_kernel - 1);
  recurrent_size_ = c.linear_value_heads * c.linear_key_head_dim * c.linear_value_head_dim;
  delta_shape_ = {c.linear_key_heads, c.linear_value_heads, c.linear_key_head_dim, c.linear_value_head_dim};
  conv_ = buffers(device_, dtype_, linear, c.max_batch * conv_size_);
  recurrent_ = buffers(device_, DType::float32, linear, c.max_batch * recurrent_size_);
  rows_.resize(c.max_batch);
  row_in_.assign(c.max_batch, -1);
}

void SlotExecutor::reserve_memory() {
  if (!live_rows().empty()) throw Error(who_ + ": reserve_memory clears the slots; call it before any request");
  forget_retained();  // what released rows kept is cleared with them
  for (const std::vector<Buffer>* group : {&target_kv_, &draft_kv_, &conv_, &recurrent_})
    for (const Buffer& buffer : *group)
      if (buffer.bytes()) device_.zero(buffer.at(0), buffer.bytes());
  device_.synchronize();
}

size_t SlotExecutor::release_scratch() {
  if (!device_.is_host() || !live_rows().empty()) return 0;
  size_t freed = decide_probs_.bytes() + decide_order_.bytes() + features_.bytes();
  decide_probs_.release();
  decide_order_.release();
  features_.release();
  for (const StateRun& run : state_runs_)
    for (const std::vector<Buffer>* group : {&run.conv, &run.recurrent, &run.conv_inputs, &run.delta_inputs, &run.context})
      for (const Buffer& buffer : *group) freed += buffer.bytes();
  state_runs_.clear();
  for (Buffer& buffer : context_) {
    freed += buffer.bytes();
    buffer.release();
  }
  freed += (logits_.host.capacity() + draft_scores_.host.capacity()) * sizeof(float) +
           selector_columns_.host.capacity() * sizeof(int64_t);
  logits_.release();
  draft_scores_.release();
  selector_columns_.release();
  return freed;
}

const SlotExecutor::Row& SlotExecutor::state(int64_t row) const {
  if (row < 0 || row >= config_.max_batch)
    throw Error(who_ + ": row " + std::to_string(row) + " is not a slot (max_batch " +
                std::to_string(config_.max_batch) + ")");
  return rows_[row];
}

SlotExecutor::Row& SlotExecutor::state(int64_t row) {
  return const_cast<Row&>(static_cast<const SlotExecutor&>(*this).state(row));
}

// -- the target ---------------------------------------------------------------------------------

// Groups of rows that run as one batch, each in place order: adjacent places, and every row keeps its
// writes inside its slot (committed + s <= slot positions, s = the group's longest fed input).
// Usually one group (the live rows fill the lowest places); a row near its capacity beside a long
// input gets a Run of its own.
std::vector<std::vector<size_t>> SlotExecutor::target_groups(const std::vector<int64_t>& rows,
                                                             const std::vector<std::vector<int64_t>>& tokens,
                                                             const std::vector<RowSampling>* sampling) const {
  std::vector<size_t> order(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return rows_[rows[a]].place < rows_[rows[b]].place; });
  // every row of `group` and row i keep their writes inside their slots when s positions are fed
  auto fits = [&](const std::vector<size_t>& group, size_t i, int64_t s) {
    const auto inside = [&](size_t j) { return rows_[rows[j]].committed + s <= slot_positions(); };
    return inside(i) && std::all_of(group.begin(), group.end(), inside);
  };
  // rows scoring their prompt run apart: only they need every position's logits
  const auto scores = [&](size_t i) { return sampling && (*sampling)[i].prompt_logprobs >= 0; };
  std::vector<std::vector<size_t>> groups;
  int64_t s = 0;
  for (size_t i : order) {
    const int64_t len = fed(int64_t(tokens[i].size())), wider = std::max(s, len);
    const bool adjacent = !groups.empty() && rows_[rows[groups.back().back()]].place + 1 == rows_[rows[i]].place &&
                          scores(groups.back().back()) == scores(i);
    if (adjacent && fits(groups.back(), i, wider)) {
      groups.back().push_back(i);
      s = wider;
    } else {
      groups.push_back({i});
      s = len;
    }
  }
  return groups;
}

template <typename F>
void SlotExecutor::run_target(const std::vector<int64_t>& rows, const std::vector<std::vector<int64_t>>& tokens,
                              bool last_only, const std::vector<RowSampling>* sampling, const Decision* decision,
                              F&& take) {
  DFLASH_INVARIANT(rows.size() == tokens.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& row = state(rows[i]);
    DFLASH_INVARIANT(i == 0 || rows[i] > rows[i - 1]);
    DFLASH_INVARIANT(!tokens[i].empty() && row.committed + int64_t(tokens[i].size()) <= config_.capacity);
    for (int64_t id : tokens[i])
      if (id < 0 || id >= config_.vocab)
        throw Error(who_ + ": token id " + std::to_string(id) + " is outside the vocabulary (" +
                    std::to_string(config_.vocab) + ")");
  }
  ++phase_;
  run_ = -1;
  for (const std::vector<size_t>& group : target_groups(rows, tokens, last_only ? sampling : nullptr)) {
    const int64_t lo = rows_[rows[group.front()]].place, n = int64_t(group.size());
    int64_t s = 0, longest = 0;
    for (size_t i : group) {
      s = std::max(s, fed(int64_t(tokens[i].size())));
      longest = std::max(longest, int64_t(tokens[i].size()));
    }
    // Logits rows per row: a prefill's last position alone, unless its rows score their prompts (a group
    // of their own), then every position's as a verify's (each prefill row deciding at its last); the
    // padding's are never read.
    const bool every = !last_only || (sampling && (*sampling)[group.front()].prompt_logprobs >= 0);
    const int64_t r = every ? longest : 1;
    fill(ids_.host, n * s, int64_t(0));
    fill(logits_index_.host, n * r, int64_t(0));
    query_lengths_.host.resize(n);
    cache_lengths_.host.resize(n);
    std::vector<int64_t> decides_at(n);  // each row's first decided logits row
    for (int64_t j = 0; j < n; ++j) {
      const size_t i = group[j];
      const int64_t len = int64_t(tokens[i].size());
      cache_lengths_.host[j] = rows_[rows[i]].committed;
      std::copy(tokens[i].begin(), tokens[i].end(), ids_.host.begin() + j * s);
      std::fill(ids_.host.begin() + j * s + len, ids_.host.begin() + j * s + fed(len), tokens[i].back());
      query_lengths_.host[j] = fed(len);
      // padding rows repeat the last position, so the states come after the row's last token
      for (int64_t k = 0; k < r; ++k) logits_index_.host[j * r + k] = every ? std::min(k, len - 1) : len - 1;
      decides_at[j] = j * r + (last_only && every ? len - 1 : 0);
    }
    // decided on the device, the logits never reach the host: no host array for them
    if (decision == nullptr || device_.is_host()) logits_.host.resize(n * r * config_.vocab);
    features_.reserve(n * s * config_.feature_width);
    if (++run_ == int64_t(state_runs_.size())) state_runs_.emplace_back();
    StateRun& states = state_runs_[run_];
    states.tokens = s;
    while (states.conv.size() < conv_.size()) {
      states.conv.emplace_back(device_, dtype_);
      states.recurrent.emplace_back(device_, DType::float32);
      states.conv_inputs.emplace_back(device_, dtype_);
      states.delta_inputs.emplace_back(device_, DType::float32);
    }
    while (states.context.size() < context_.size()) states.context.emplace_back(device_, dtype_);
    for (size_t k = 0; k < conv_.size(); ++k) {
      states.conv[k].reserve(n * conv_size_);
      states.recurrent[k].reserve(n * recurrent_size_);
      states.conv_inputs[k].reserve(n * config_.conv_dim * s);
      states.delta_inputs[k].reserve(n * s * delta_shape_.width());
    }
    run_target_range(lo, n, s, r, decision == nullptr);
    // before the penalties: prompt logprobs are the raw logits'
    if (last_only && every) score_prompts(group, r, tokens, *sampling, decision != nullptr);
    if (sampling) penalize_run(group, r, decides_at, *sampling, tokens, last_only, decision != nullptr);
    if (config_.has_drafter()) inject_run(n, s);
    if (decision) decide_run(group, n, r, decides_at, *decision);
    for (int64_t j = 0; j < n; ++j)
      take(group[j], j, decision ? nullptr : logits_.host.data() + decides_at[j] * config_.vocab);
  }
}

void SlotExecutor::score_prompts(const std::vector<size_t>& group, int64_t r,
                                 const std::vector<std::vector<int64_t>>& tokens,
                                 const std::vector<RowSampling>& sampling, bool on_device) {
  const int64_t V = config_.vocab;
  // Position k of a row's chunk scores the prompt's token after it: the chunk's next, or `after` past
  // its end. On a device, the decided-logprobs kernel takes those tokens as a row's kept drafts (and the
  // last as its `next`): only the entries cross to the host.
  std::vector<DecideRow> rows;
  std::vector<Verdict> verdicts;
  std::vector<int64_t> targets;
  std::vector<size_t> scoring;  // rows' indices in `sampling`
  int64_t positions = 0;
  for (size_t j = 0; j < group.size(); ++j) {
    const size_t i = group[j];
    const RowSampling& s = sampling[i];
    const std::vector<int64_t>& chunk = tokens[i];
    if (s.prompt_logprobs < 0 || (chunk.size() == 1 && s.after < 0)) continue;  // asks not, or nothing to score
    DecideRow row;
    row.first = int64_t(j) * r;
    row.sampling.logprobs = s.prompt_logprobs;
    row.drafts = int64_t(targets.size());
    targets.insert(targets.end(), chunk.begin() + 1, chunk.end());
    if (s.after >= 0) targets.push_back(s.after);
    const int64_t scored = int64_t(targets.size()) - row.drafts;
    row.num_drafts = scored - 1;
    rows.push_back(row);
    verdicts.push_back({scored - 1, targets.back()});
    scoring.push_back(i);
    positions = std::max(positions, scored);
  }
  if (rows.empty()) return;
  const int64_t count = int64_t(rows.size());
  if (!on_device) {  // the host form of the same rule: logits row j scores target j
    for (int64_t k = 0; k < count; ++k) {
      const std::vector<int64_t> mine(targets.begin() + rows[k].drafts,
                                      targets.begin() + rows[k].drafts + verdicts[k].accepted + 1);
      RowSampling asked;
      asked.sampling.logprobs = rows[k].sampling.logprobs;
      prompt_logprobs_[scoring[k]] = host_logprobs(mine, logits_.host.data() + rows[k].first * V, V, asked);
    }
    return;
  }
  const int64_t per_token = 1 + kMaxLogprobs;
  stage(decide_rows_, rows.data(), rows.size() * sizeof(DecideRow));
  stage(verdicts_, verdicts.data(), verdicts.size() * sizeof(Verdict));
  stage(decide_drafts_, targets.data(), targets.size() * sizeof(int64_t));
  decide_order_.reserve(count * positions * V);
  decide_logprobs_.host.resize(count * positions * per_token * sizeof(TokenLogprob));
  device_.score(static_cast<const float*>(logits_.device_data(group.size() * r * V)), V,
                reinterpret_cast<const DecideRow*>(decide_rows_.device_data()), count, positions,
                static_cast<const int64_t*>(decide_drafts_.device_data()),
                reinterpret_cast<const Verdict*>(verdicts_.device_data()), reinterpret_cast<int32_t*>(decide_order_.at(0)),
                reinterpret_cast<TokenLogprob*>(decide_logprobs_.device_data()));
  decide_logprobs_.download();
  device_.synchronize();
  const auto* entries = reinterpret_cast<const TokenLogprob*>(decide_logprobs_.host.data());
  for (int64_t k = 0; k < count; ++k) {
    std::vector<TokenLogprob>& out = prompt_logprobs_[scoring[k]];
    for (int64_t j = 0; j <= verdicts[k].accepted; ++j) {
      const TokenLogprob* at = entries + (k * positions + j) * per_token;
      out.insert(out.end(), at, at + 1 + rows[k].sampling.logprobs);
    }
  }
}

void SlotExecutor::penalize_run(const std::vector<size_t>& group, int64_t r, const std::vector<int64_t>& decides_at,
                                const std::vector<RowSampling>& sampling, const std::vector<std::vector<int64_t>>& tokens,
                                bool last_only, bool on_device) {
  std::vector<PenaltyRow> rows;
  std::vector<PenaltyEntry> entries;
  std::vector<int32_t> blocks;
  std::vector<uint32_t> masks;
  const int64_t V = config_.vocab, words = (V + 31) / 32;
  int64_t positions = 1;
  for (size_t j = 0; j < group.size(); ++j) {
    const RowSampling& s = sampling[group[j]];
    if (s.history == nullptr) continue;
    // a prefill decides after its last token; a verify at each position of its block
    const int64_t n = last_only ? 1 : int64_t(tokens[group[j]].size());
    add_penalty_row(*s.history, tokens[group[j]], n, decides_at[j], s.sampling, s.ban, s.masks, words, rows, entries,
                    blocks, masks);
    positions = std::max(positions, n);
  }
  if (rows.empty()) return;  // no row asks: nothing runs
  if (!on_device) {
    for (const PenaltyRow& row : rows)
      for (int64_t k = 0; k < row.positions; ++k) {
        penalize_position(logits_.host.data(), V, row, k, entries.data(), blocks.data(), 0, 1);
        mask_position(logits_.host.data(), V, row, k, masks.data(), 0, 1);
        if (row.min_p_cut) cut_min_p(logits_.host.data() + (row.first + k) * V, V, row);
      }
    return;
  }
  entries.emplace_back();  // never empty: its device mirror is always a valid pointer
  masks.emplace_back();
  stage(penalty_rows_, rows.data(), rows.size() * sizeof(PenaltyRow));
  stage(penalty_entries_, entries.data(), entries.size() * sizeof(PenaltyEntry));
  stage(penalty_tokens_, blocks.data(), blocks.size() * sizeof(int32_t));
  stage(penalty_masks_, masks.data(), masks.size() * sizeof(uint32_t));
  device_.penalize(static_cast<float*>(logits_.device_data(group.size() * r * V)), V,
                   reinterpret_cast<const PenaltyRow*>(penalty_rows_.device_data()), int64_t(rows.size()), positions,
                   reinterpret_cast<const PenaltyEntry*>(penalty_entries_.device_data()),
                   reinterpret_cast<const int32_t*>(penalty_tokens_.device_data()),
                   reinterpret_cast<const uint32_t*>(penalty_masks_.device_data()));
}

void SlotExecutor::run_target_range(int64_t lo, int64_t n, int64_t s, int64_t r, bool logits_to_host) {
  const SlotExecutorConfig& c = config_;
  Graph& g = *target_;
  g.clear();
  for (auto* staged : {&ids_, &cache_lengths_, &query_lengths_, &logits_index_}) staged->upload();
  g.input("input_ids", {ids_.device_data(), DType::int64, {n, s}});
  g.input("cache_lengths", {cache_lengths_.device_data(), DType::int64, {n}});
  g.input("query_lengths", {query_lengths_.device_data(), DType::int64, {n}});
  g.input("logits_index", {logits_index_.device_data(), DType::int64, {n, r}});
  const int64_t slot_size = c.target_kv_heads * slot_positions() * c.target_head_dim;
  for (size_t k = 0; k < target_kv_.size(); ++k) {
    const TensorRef cache{target_kv_[k].at(lo * slot_size), dtype_,
                          {n, c.target_kv_heads, slot_positions(), c.target_head_dim}};
    g.input(target_cache_in_[k], cache);
    g.output(target_cache_out_[k], cache);  // the same memory: written in place
  }
  // Linear layers read their slots' states and return, into scratch, the states after each row's last
  // logits row and what each position fed them; a commit copies or rebuilds from those.
  const int64_t K1 = c.conv_kernel - 1, Hv = c.linear_value_heads, Dk = c.linear_key_head_dim,
                Dv = c.linear_value_head_dim;
  StateRun& states = state_runs_[run_];
  for (size_t k = 0; k < conv_.size(); ++k) {
    g.input(conv_in_[k], {conv_[k].at(lo * conv_size_), dtype_, {n, c.conv_dim, K1}});
    g.input(recurrent_in_[k], {recurrent_[k].at(lo * recurrent_size_), DType::float32, {n, Hv, Dk, Dv}});
    g.output(conv_out_names_[k], {states.conv[k].at(0), dtype_, {n, c.conv_dim, K1}});
    g.output(recurrent_out_names_[k], {states.recurrent[k].at(0), DType::float32, {n, Hv, Dk, Dv}});
    g.output(conv_inputs_names_[k], {states.conv_inputs[k].at(0), dtype_, {n, c.conv_dim, s}});
    g.output(delta_inputs_names_[k], {states.delta_inputs[k].at(0), DType::float32, {n, s, delta_shape_.width()}});
  }
  g.output("logits", {logits_.device_data(n * r * c.vocab), DType::float32, {n, r, c.vocab}});
  if (c.has_drafter()) g.output("features", {features_.at(0), dtype_, {n, s, c.feature_width}});
  set_up_runs_ += g.run("running target.onnx");
  // Logits for the host are waited for here. Decided on the device, nothing is read back before the
  // decision's verdicts (decide_run waits for those), so the host goes on queueing the drafter's
  // context pass and the decision behind the Run instead of leaving the GPU idle while it does.
  if (logits_to_host) {
    logits_.download();
    device_.synchronize();
  }
  ++target_runs_;
  target_rows_ += n;
}

const char* SlotExecutor::conv_out(int64_t run, size_t k, int64_t j) const {
  return state_runs_[run].conv[k].at(j * conv_size_);
}

const char* SlotExecutor::recurrent_out(int64_t run, size_t k, int64_t j) const {
  return state_runs_[run].recurrent[k].at(j * recurrent_size_);
}

void SlotExecutor::rebuild_states(const std::vector<std::vector<RebuildRow>>& by_run) {
  // every Run's rows in one upload: a copy to a GPU is asynchronous, so the host array must not change
  // under a copy still queued
  std::vector<size_t> first(by_run.size() + 1, 0);
  for (size_t run = 0; run < by_run.size(); ++run) first[run + 1] = first[run] + by_run[run].size();
  if (first.back() == 0) return;
  rebuild_rows_.host.resize(first.back() * sizeof(RebuildRow));
  for (size_t run = 0; run < by_run.size(); ++run)
    std::memcpy(rebuild_rows_.host.data() + first[run] * sizeof(RebuildRow), by_run[run].data(),
                by_run[run].size() * sizeof(RebuildRow));
  rebuild_rows_.upload();
  const auto* rows = reinterpret_cast<const RebuildRow*>(rebuild_rows_.device_data());
  for (size_t run = 0; run < by_run.size(); ++run) {
    if (by_run[run].empty()) continue;
    const StateRun& states = state_runs_[run];
    for (size_t k = 0; k < conv_.size(); ++k) {
      StateRebuild job;
      job.recurrent = reinterpret_cast<float*>(recurrent_[k].at(0));
      job.delta_inputs = reinterpret_cast<const float*>(states.delta_inputs[k].at(0));
      job.conv = conv_[k].at(0);
      job.conv_inputs = states.conv_inputs[k].at(0);
      job.rows = rows + first[run];
      job.count = int64_t(by_run[run].size());
      job.tokens = states.tokens;
      job.channels = config_.conv_dim;
      job.conv_width = config_.conv_kernel - 1;
      job.element = int64_t(dtype_size(dtype_));
      job.shape = delta_shape_;
      device_.rebuild_states(job);
    }
  }
}

void SlotExecutor::set_states(int64_t row, const std::vector<const char*>& conv,
                              const std::vector<const char*>& recurrent) {
  const int64_t place = state(row).place;
  for (size_t k = 0; k < conv_.size(); ++k) {
    char* c = conv_[k].at(place * conv_size_);
    char* h = recurrent_[k].at(place * recurrent_size_);
    const size_t conv_bytes = conv_size_ * conv_[k].element(), recurrent_bytes = recurrent_size_ * sizeof(float);
    if (conv.empty()) {
      device_.zero(c, conv_bytes);
      device_.zero(h, recurrent_bytes);
    } else {
      device_.copy(c, conv[k], conv_bytes);
      device_.copy(h, recurrent[k], recurrent_bytes);
    }
  }
}

std::vector<int64_t> SlotExecutor::prefill(const std::vector<int64_t>& rows,
                                           const std::vector<std::vector<int64_t>>& prompts,
                                           const std::vector<RowSampling>& sampling) {
  DFLASH_INVARIANT(sampling.size() == rows.size());
  std::vector<int64_t> out(rows.size());
  std::vector<Verdict> verdicts(rows.size());
  logprobs_.assign(rows.size(), {});
  prompt_logprobs_.assign(rows.size(), {});
  const Decision on_device{rows, sampling, nullptr, verdicts, logprobs_};
  prefill_rows(rows, prompts, &sampling, device_.decides() ? &on_device : nullptr, [&](size_t i, const float* logits) {
    if (!logits) {
      out[i] = verdicts[i].next;
      return;
    }
    out[i] = host_sample(logits, config_.vocab, sampling[i]);
    logprobs_[i] = host_logprobs({out[i]}, logits, config_.vocab, sampling[i]);
  });
  return out;
}

void SlotExecutor::decide_run(const std::vector<size_t>& group, int64_t n, int64_t r,
                              const std::vector<int64_t>& decides_at, const Decision& decision) {
  const int64_t V = config_.vocab, count = int64_t(group.size());
  int64_t positions = 1;  // the most logits rows one row decides
  decide_rows_.host.resize(count * sizeof(DecideRow));
  decide_drafts_.host.assign(1, 0);  // never empty: its device mirror is always a valid pointer
  bool drafter = false;  // a row decides its drafts by the drafter rule, over its q rows in draft_q_
  for (int64_t k = 0; k < count; ++k) {
    const size_t i = group[k];
    const RowSampling& s = decision.sampling[i];
    if (!s.sampling.greedy()) s.sampling.validate();
    DecideRow row;
    row.first = decides_at[k];
    row.sampling = s.sampling;
    row.stream = s.stream;
    row.position = s.position;
    if (decision.blocks) {
      const std::vector<int64_t>& block = (*decision.blocks)[i];
      check_drafts(block.data() + 1, int64_t(block.size()) - 1, V);
      row.num_drafts = int64_t(block.size()) - 1;
      positions = std::max(positions, row.num_drafts + 1);
      row.drafts = int64_t(decide_drafts_.host.size());
      decide_drafts_.host.insert(decide_drafts_.host.end(), block.begin() + 1, block.end());
      Row& state = rows_[decision.rows[i]];
      if (state.device_q >= 0 && row.num_drafts > 0 && !s.sampling.greedy()) {
        DFLASH_INVARIANT(row.num_drafts <= state.device_q_drafts && state.device_q_draw == device_draws_);
        row.q = state.device_q;
        drafter = true;
      }
      state.device_q = -1;  // its drafts are decided: draft_q_ may be rewritten
    }
    std::memcpy(decide_rows_.host.data() + k * sizeof(DecideRow), &row, sizeof(DecideRow));
  }
  verdicts_.host.resize(count * sizeof(Verdict));
  bool asked = false;  // logprobs: each row's slot holds `positions` tokens' 1 + kMaxLogprobs entries
  for (size_t i : group) asked = asked || decision.sampling[i].sampling.logprobs >= 0;
  const int64_t per_token = 1 + kMaxLogprobs;
  decide_logprobs_.host.resize(asked ? count * positions * per_token * sizeof(TokenLogprob) : 0);
  bool sampled = false;  // a greedy row needs no vocabulary-sized scratch unless it asks for logprobs
  for (size_t i : group) sampled = sampled || !decision.sampling[i].sampling.greedy();
  decide_probs_.reserve(sampled ? count * positions * V : 1);
  decide_order_.reserve(count * positions * (sampled || asked ? V + 1 : 1));
  decide_rows_.upload();
  decide_drafts_.upload();
  DraftQ q;
  if (drafter)
    q = {reinterpret_cast<float*>(draft_q_.at(0)), config_.draft_vocab_size,
         draft_of_.empty() ? nullptr : reinterpret_cast<const int32_t*>(draft_of_device_.device_data())};
  device_.decide(static_cast<const float*>(logits_.device_data(n * r * V)), V,
                 reinterpret_cast<const DecideRow*>(decide_rows_.device_data()), count, positions,
                 static_cast<const int64_t*>(decide_drafts_.device_data()), q, reinterpret_cast<float*>(decide_probs_.at(0)),
                 reinterpret_cast<int32_t*>(decide_order_.at(0)), reinterpret_cast<Verdict*>(verdicts_.device_data()),
                 asked ? reinterpret_cast<TokenLogprob*>(decide_logprobs_.device_data()) : nullptr);
  verdicts_.download();
  if (asked) decide_logprobs_.download();
  device_.synchronize();
  for (int64_t k = 0; k < count; ++k) {
    const size_t i = group[k];
    Verdict& verdict = decision.out[i];
    std::memcpy(&verdict, verdicts_.host.data() + k * sizeof(Verdict), sizeof(Verdict));
    const int32_t top = decision.sampling[i].sampling.logprobs;
    if (top < 0) continue;
    const auto* entries = reinterpret_cast<const TokenLogprob*>(decide_logprobs_.host.data()) + k * positions * per_token;
    std::vector<TokenLogprob>& mine = decision.logprobs[i];
    for (int64_t j = 0; j <= verdict.accepted; ++j)
      mine.insert(mine.end(), entries + j * per_token, entries + j * per_token + 1 + top);
  }
}

std::vector<LogitsRows> SlotExecutor::prefill_logits(const std::vector<int64_t>& rows,
                                                     const std::vector<std::vector<int64_t>>& prompts) {
  std::vector<LogitsRows> out(rows.size());
  prefill_rows(rows, prompts, nullptr, nullptr, [&](size_t i, const float* logits) {
    out[i] = {1, config_.vocab, std::vector<float>(logits, logits + config_.vocab)};
  });
  return out;
}

void SlotExecutor::prefill_rows(const std::vector<int64_t>& rows, const std::vector<std::vector<int64_t>>& prompts,
                                const std::vector<RowSampling>* sampling, const Decision* decision,
                                const LogitsSink& sink) {
  // A row not live yet starts a request (zero states; what a release kept is dropped); a live one (or
  // a reopened one) takes its prompt's next chunk after what it holds.
  for (int64_t row : rows)
    if (!state(row).live) {
      if (state(row).place >= 0) forget(row);
      take_place(row);
      set_states(row, {}, {});
    }
  const size_t linear = conv_.size();
  std::vector<const char*> conv(linear), recurrent(linear);
  run_target(rows, prompts, true, sampling, decision, [&](size_t i, int64_t j, const float* logits) {
    sink(i, logits);
    // a prefill commits all of its chunk: its context rows are kept now
    if (config_.has_drafter()) keep_context(rows[i], run_, j, int64_t(prompts[i].size()));
    if (linear == 0) return;
    for (size_t k = 0; k < linear; ++k) {  // a prefill commits all of its chunk: the state after its last token
      conv[k] = conv_out(run_, k, j);
      recurrent[k] = recurrent_out(run_, k, j);
    }
    set_states(rows[i], conv, recurrent);
  });
  for (size_t i = 0; i < rows.size(); ++i) rows_[rows[i]].committed += int64_t(prompts[i].size());  // live since take_place
}

std::vector<Verdict> SlotExecutor::verify(const std::vector<int64_t>& rows,
                                          const std::vector<std::vector<int64_t>>& blocks,
                                          const std::vector<RowSampling>& sampling) {
  DFLASH_INVARIANT(sampling.size() == rows.size());
  std::vector<Verdict> out(rows.size());
  logprobs_.assign(rows.size(), {});
  const Decision on_device{rows, sampling, &blocks, out, logprobs_};
  verify_rows(rows, blocks, &sampling, device_.decides() ? &on_device : nullptr, [&](size_t i, const float* logits) {
    if (!logits) return;
    std::vector<float>& q = rows_[rows[i]].draft_q;  // its drafts' distributions, when they were drawn
    const int64_t drafts = int64_t(blocks[i].size()) - 1;
    if (drafts > 0 && !q.empty()) {
      DFLASH_INVARIANT(int64_t(q.size()) >= drafts * config_.draft_vocab_size);
      const RowSampling& s = sampling[i];
      out[i] = accept_drafter(blocks[i].data() + 1, drafts, logits, config_.vocab, q.data(), config_.draft_vocab_size,
                              draft_of_.empty() ? nullptr : draft_of_.data(), s.sampling, s.stream, s.position);
    } else {
      out[i] = host_verdict(blocks[i], logits, config_.vocab, sampling[i]);
    }
    q.clear();
    if (sampling[i].sampling.logprobs < 0) return;  // not asked: no list of decided tokens per step
    std::vector<int64_t> decided(blocks[i].begin() + 1, blocks[i].begin() + 1 + out[i].accepted);
    decided.push_back(out[i].next);
    logprobs_[i] = host_logprobs(decided, logits, config_.vocab, sampling[i]);
  });
  return out;
}

std::vector<LogitsRows> SlotExecutor::verify_logits(const std::vector<int64_t>& rows,
                                                    const std::vector<std::vector<int64_t>>& blocks) {
  std::vector<LogitsRows> out(rows.size());
  const int64_t V = config_.vocab;
  verify_rows(rows, blocks, nullptr, nullptr, [&](size_t i, const float* logits) {
    const int64_t len = int64_t(blocks[i].size());
    out[i] = {len, V, std::vector<float>(logits, logits + len * V)};
  });
  return out;
}

void SlotExecutor::verify_rows(const std::vector<int64_t>& rows, const std::vector<std::vector<int64_t>>& blocks,
                               const std::vector<RowSampling>* sampling, const Decision* decision,
                               const LogitsSink& sink) {
  for (int64_t row : rows) DFLASH_INVARIANT(state(row).live);
  run_target(rows, blocks, false, sampling, decision, [&](size_t i, int64_t j, const float* logits) {
    const int64_t len = int64_t(blocks[i].size());
    sink(i, logits);
    Row& row = rows_[rows[i]];
    row.verify_rows = len;
    // The states and context rows of each block position stay in this Run's outputs until commit.
    row.verify_phase = phase_;
    row.verify_run = run_;
    row.verify_index = j;
  });
}

void SlotExecutor::commit(const std::vector<int64_t>& rows, const std::vector<int64_t>& kept) {
  DFLASH_INVARIANT(rows.size() == kept.size());
  std::vector<std::vector<RebuildRow>> rebuild(state_runs_.size());  // per Run: rows keeping part of a block
  for (size_t i = 0; i < rows.size(); ++i) {
    Row& row = state(rows[i]);
    DFLASH_INVARIANT(row.live && kept[i] >= 0 && kept[i] <= row.verify_rows);
    // no target Run since this row's verify may have reused its outputs (the scheduler commits right after)
    DFLASH_INVARIANT(kept[i] == 0 || row.verify_phase == phase_);
    // The rejected rows stay in the cache past `committed`: the next Run overwrites them.
    row.committed += kept[i];
    if (kept[i] > 0 && config_.has_drafter()) keep_context(rows[i], row.verify_run, row.verify_index, kept[i]);
    // the states after the last kept position: the graph's when the whole block is kept, else rebuilt
    // from the slot's (those before the block); kept 0 keeps the slot's
    if (kept[i] > 0 && !conv_.empty()) {
      if (kept[i] < row.verify_rows) {
        rebuild[row.verify_run].push_back({row.place, row.verify_index, kept[i]});
      } else {
        std::vector<const char*> conv, recurrent;
        for (size_t k = 0; k < conv_.size(); ++k) {
          conv.push_back(conv_out(row.verify_run, k, row.verify_index));
          recurrent.push_back(recurrent_out(row.verify_run, k, row.verify_index));
        }
        set_states(rows[i], conv, recurrent);
      }
    }
    row.verify_rows = 0;
  }
  rebuild_states(rebuild);
}

std::vector<int64_t> SlotExecutor::live_rows() const {
  std::vector<int64_t> out;
  for (size_t row = 0; row < rows_.size(); ++row)
    if (rows_[row].live) out.push_back(int64_t(row));
  return out;
}

void SlotExecutor::release(int64_t row) {
  Row& r = state(row);
  const int64_t place = r.place, committed = r.committed;
  r = Row{};
  if (place < 0) return;
  if (keep_released_ && committed > 0) {  // its place keeps the committed rows (and draft context, states)
    r.place = place;
    r.committed = r.drafted = committed;
    r.released_at = ++releases_;
  } else {
    row_in_[place] = -1;
  }
  pack();
}

void SlotExecutor::discard(int64_t row) {
  Row& r = state(row);
  if (r.place >= 0) {
    const auto zero = [&](std::vector<Buffer>& group, int64_t per_place) {
      for (Buffer& buffer : group) device_.zero(buffer.at(r.place * per_place), per_place * buffer.element());
    };
    zero(target_kv_, cache_layout(false).slot);
    zero(draft_kv_, cache_layout(true).slot);
    zero(conv_, conv_size_);
    zero(recurrent_, recurrent_size_);
  }
  r.committed = 0;  // keeps nothing, even with keep_released on
  release(row);
}

void SlotExecutor::keep_released(bool on) {
  keep_released_ = on;
  if (!on) forget_retained();
}

void SlotExecutor::forget_retained() {
  for (int64_t row = 0; row < config_.max_batch; ++row)
    if (retained(row)) forget(row);
}

int64_t SlotExecutor::reusable(int64_t row, int64_t match) const {
  const Row& r = state(row);
  const int64_t kept = r.live ? r.committed : retained(row);
  // between steps no verify is pending (one is only after a phase failed: then nothing is reused)
  if (kept == 0 || match < 1 || r.verify_rows > 0) return 0;
  // a hybrid target's linear-layer states are those after every kept position: all or nothing
  if (!conv_.empty()) return match >= kept ? kept : 0;
  return std::min(match, kept);
}

void SlotExecutor::reopen(int64_t row, int64_t source, int64_t n) {
  DFLASH_INVARIANT(n >= 1 && reusable(source, n) == n && !state(row).live);  // the scheduler asks reusable first
  Row& r = state(row);
  if (row != source) {
    if (r.place >= 0) forget(row);  // what it kept goes: it starts on the source's positions
    take_place(row, source);
    copy_rows(state(source).place, r.place, n, n);
    if (!conv_.empty()) copy_states(state(source).place, r.place);  // hybrid: n is all the source holds
  }
  r.live = true;
  r.committed = r.drafted = n;  // the rows after n are garbage to be overwritten, as after a rollback
  r.released_at = 0;
  pack();
}

void SlotExecutor::take_place(int64_t row, int64_t keep) {
  Row& r = state(row);
  if (r.place >= 0) return;
  int64_t p = 0;  // the live rows fill the places below it
  while (row_in_[p] >= 0 && rows_[row_in_[p]].live) ++p;
  clear_place(p, keep);
  r.place = p;
  r.live = true;  // taken: the next row starting in this phase takes the place above
  row_in_[p] = row;
}

void SlotExecutor::pack() {
  const int64_t live = int64_t(live_rows().size());
  for (int64_t p = 0; p < live; ++p) {
    const int64_t held = row_in_[p];
    if (held >= 0 && rows_[held].live) continue;
    int64_t highest = config_.max_batch - 1;  // a live row above `live` (one is, as fewer are below)
    while (row_in_[highest] < 0 || !rows_[row_in_[highest]].live) --highest;
    if (held >= 0) swap_places(p, highest);  // the retained row goes up, kept
    else move_place(highest, p);
  }
}

void SlotExecutor::clear_place(int64_t p, int64_t keep) {
  const int64_t held = row_in_[p];
  if (held < 0) return;
  DFLASH_INVARIANT(!rows_[held].live);
  int64_t to = int64_t(std::find(row_in_.begin(), row_in_.end(), int64_t(-1)) - row_in_.begin());
  if (to == config_.max_batch) {  // no free place: forget the retained row released longest ago
    int64_t oldest = -1;
    for (int64_t row = 0; row < config_.max_batch; ++row)
      if (retained(row) && row != keep && (oldest < 0 || rows_[row].released_at < rows_[oldest].released_at))
        oldest = row;
    DFLASH_INVARIANT(oldest >= 0);  // `keep` is the only retained row only while a place is free
    to = rows_[oldest].place;
    forget(oldest);
    if (oldest == held) return;
  }
  move_place(p, to);
}

void SlotExecutor::forget(int64_t row) {
  Row& r = state(row);
  DFLASH_INVARIANT(!r.live && r.place >= 0);
  row_in_[r.place] = -1;
  r = Row{};
}

void SlotExecutor::move_place(int64_t from, int64_t to) {
  const int64_t row = row_in_[from];
  Row& r = rows_[row];
  copy_rows(from, to, r.committed + r.verify_rows, r.drafted);
  copy_states(from, to);
  r.place = to;
  row_in_[to] = row;
  row_in_[from] = -1;
}

SlotExecutor::SlotLayout SlotExecutor::cache_layout(bool draft) const {
  const SlotExecutorConfig& c = config_;
  const int64_t positions = draft ? c.capacity : slot_positions();
  const int64_t dim = draft ? c.draft_head_dim : c.target_head_dim, heads = draft ? c.draft_kv_heads : c.target_kv_heads;
  const size_t element = dtype_size(dtype_);
  return {heads * positions * dim, dim, heads, size_t(positions * dim) * element, size_t(dim) * element};
}

void SlotExecutor::copy_rows(int64_t from, int64_t to, int64_t target_rows, int64_t context_rows) {
  // every head at once: a 2-D copy of the rows per head, heads a slot's positions apart
  const auto copy = [&](std::vector<Buffer>& caches, const SlotLayout& l, int64_t rows) {
    for (Buffer& cache : caches)
      device_.copy_rows(cache.at(to * l.slot), l.pitch, cache.at(from * l.slot), l.pitch, rows * l.row, l.heads);
  };
  copy(target_kv_, cache_layout(false), target_rows);
  copy(draft_kv_, cache_layout(true), context_rows);
}

void SlotExecutor::copy_states(int64_t from, int64_t to) {
  for (size_t k = 0; k < conv_.size(); ++k) {
    device_.copy(conv_[k].at(to * conv_size_), conv_[k].at(from * conv_size_), conv_size_ * conv_[k].element());
    device_.copy(recurrent_[k].at(to * recurrent_size_), recurrent_[k].at(from * recurrent_size_),
                 recurrent_size_ * sizeof(float));
  }
}

void SlotExecutor::swap_places(int64_t p, int64_t q) {
  Row& a = rows_[row_in_[p]];
  Row& b = rows_[row_in_[q]];
  const SlotLayout target = cache_layout(false), draft = cache_layout(true);
  // one cache slot at a time through a scratch of one slot: p -> scratch, q -> p, scratch -> q
  const size_t most = std::max({target.heads * target.pitch, draft.heads * draft.pitch,
                                conv_size_ * dtype_size(dtype_), recurrent_size_ * sizeof(float)});
  swap_scratch_.reserve((most + sizeof(float) - 1) / sizeof(float));
  char* scratch = swap_scratch_.at(0);
  const auto swap_rows = [&](Buffer& cache, int64_t slot, size_t pitch, size_t width, int64_t heads) {
    char* x = cache.at(p * slot);
    char* y = cache.at(q * slot);
    device_.copy_rows(scratch, width, x, pitch, width, heads);
    device_.copy_rows(x, pitch, y, pitch, width, heads);
    device_.copy_rows(y, pitch, scratch, width, width, heads);
  };
  const int64_t target_rows = std::max(a.committed + a.verify_rows, b.committed + b.verify_rows);
  for (Buffer& cache : target_kv_) swap_rows(cache, target.slot, target.pitch, target_rows * target.row, target.heads);
  const int64_t context_rows = std::max(a.drafted, b.drafted);
  for (Buffer& cache : draft_kv_) swap_rows(cache, draft.slot, draft.pitch, context_rows * draft.row, draft.heads);
  for (size_t k = 0; k < conv_.size(); ++k) {
    const size_t conv_bytes = conv_size_ * conv_[k].element(), recurrent_bytes = recurrent_size_ * sizeof(float);
    swap_rows(conv_[k], conv_size_, conv_bytes, conv_bytes, 1);
    swap_rows(recurrent_[k], recurrent_size_, recurrent_bytes, recurrent_bytes, 1);
  }
  std::swap(a.place, b.place);
  std::swap(row_in_[p], row_in_[q]);
}

// -- the drafter --------------------------------------------------------------------------------

void SlotExecutor::inject_run(int64_t n, int64_t s) {
  const SlotExecutorConfig& c = config_;
  positions_.host.resize(n * s);  // each Run row's positions continue its committed prefix
  for (int64_t j = 0; j < n; ++j)
    for (int64_t t = 0; t < s; ++t) positions_.host[j * s + t] = cache_lengths_.host[j] + t;
  positions_.upload();
  Graph& g = *draft_context_;
  g.clear();
  g.input("features", {features_.at(0), dtype_, {n, s, c.feature_width}});
  g.input("positions", {positions_.device_data(), DType::int64, {n, s}});
  StateRun& run = state_runs_[run_];
  for (size_t k = 0; k < context_.size(); ++k) {
    run.context[k].reserve(n * c.draft_kv_heads * s * c.draft_head_dim);
    g.output(context_names_[k], {run.context[k].at(0), dtype_, {n, c.draft_kv_heads, s, c.draft_head_dim}});
  }
  set_up_runs_ += g.run("running draft_context.onnx");
}

void SlotExecutor::keep_context(int64_t row, int64_t run, int64_t j, int64_t count) {
  const SlotExecutorConfig& c = config_;
  Row& r = rows_[row];
  DFLASH_INVARIANT(r.drafted + count <= c.capacity);
  const StateRun& from = state_runs_[run];
  const int64_t head_rows = from.tokens * c.draft_head_dim;  // one head's rows in the Run's output, in elements
  const SlotLayout l = cache_layout(true);
  for (size_t k = 0; k < context_.size(); ++k)  // every head at once: rows C*dd apart in the slot, s*dd in the output
    device_.copy_rows(draft_kv_[k].at(r.place * l.slot + r.drafted * l.dim), l.pitch,
                      from.context[k].at(j * l.heads * head_rows), head_rows * dtype_size(dtype_), count * l.row,
                      l.heads);
  r.drafted += count;
}

std::vector<std::vector<int64_t>> SlotExecutor::draft(const std::vector<int64_t>& rows,
                                                      const std::vector<int64_t>& bonus, int64_t block_size,
                                                      const std::vector<RowSampling>& sampling) {
  const SlotExecutorConfig& c = config_;
  DFLASH_INVARIANT(rows.size() == bonus.size() && (sampling.empty() || sampling.size() == rows.size()));
  if (!c.has_drafter()) throw Error(who_ + ": this executor has no drafter (plain decoding only)");
  if (block_size < 2) throw Error(who_ + ": draft needs block_size >= 2, got " + std::to_string(block_size));
  for (int64_t row : rows) DFLASH_INVARIANT(state(row).live);
  if (rows.empty()) return {};

  // The block pass reads each row's first `drafted` context rows; pack them [m, dkv, ctx, dd] so its
  // work follows the longest context, not the capacity (rows past a row's length are masked).
  const int64_t m = int64_t(rows.size()), B = block_size;
  int64_t ctx = 1;
  for (int64_t row : rows) ctx = std::max(ctx, rows_[row].drafted);
  // On a GPU the length is rounded up to a bucket, so the block pass's shapes recur from step to step
  // (its CUDA graph replays; a TensorRT profile stays warm). Rows past each length are masked, and
  // the padding holds zeros or earlier context rows, all finite: no token changes.
  if (!device_.is_host()) ctx = std::min(c.capacity, (ctx + kContextBucket - 1) / kContextBucket * kContextBucket);
  const SlotLayout l = cache_layout(true);
  for (size_t k = 0; k < context_.size(); ++k) {
    context_[k].reserve(m * l.heads * ctx * l.dim);
    for (int64_t i = 0; i < m; ++i)  // every head of the row at once: rows C*dd apart in the slot, ctx*dd packed
      device_.copy_rows(context_[k].at(i * l.heads * ctx * l.dim), ctx * l.row, draft_kv_[k].at(rows_[rows[i]].place * l.slot),
                        l.pitch, rows_[rows[i]].drafted * l.row, l.heads);
  }
  ids_.host.resize(m * B);
  lengths_.host.resize(m);
  for (int64_t i = 0; i < m; ++i) {
    ids_.host[i * B] = bonus[i];
    std::fill(ids_.host.begin() + i * B + 1, ids_.host.begin() + (i + 1) * B, c.mask_token_id);
    lengths_.host[i] = rows_[rows[i]].drafted;
  }
  tokens_.host.resize(m * (B - 1));
  ids_.upload();
  lengths_.upload();

  Graph& g = *draft_block_;
  g.clear();
  g.input("block_ids", {ids_.device_data(), DType::int64, {m, B}});
  g.input("context_lengths", {lengths_.device_data(), DType::int64, {m}});
  for (size_t k = 0; k < context_.size(); ++k)
    g.input(context_names_[k], {context_[k].at(0), dtype_, {m, c.draft_kv_heads, ctx, c.draft_head_dim}});
  g.output("draft_tokens", {tokens_.device_data(), DType::int64, {m, B - 1}});
  // the drafter-distribution rule's rows at T>0 draw from the block pass's logits (else not fetched)
  std::vector<bool> sampled(m, false);
  for (int64_t i = 0; c.sample_drafts && i < int64_t(sampling.size()); ++i) {
    sampled[i] = !sampling[i].sampling.greedy();
    if (sampled[i]) sampling[i].sampling.validate();
  }
  const int64_t k = c.selector_top_k;
  const bool any = std::find(sampled.begin(), sampled.end(), true) != sampled.end();
  if (any) {
    if (k > 0) {
      draft_scores_.host.resize(m * (B - 1) * k * k);
      selector_columns_.host.resize(m * (B - 1) * k);
      g.output("selector_scores", {draft_scores_.device_data(), DType::float32, {m, B - 1, k, k}});
      g.output("selector_columns", {selector_columns_.device_data(), DType::int64, {m, B - 1, k}});
    } else {
      draft_scores_.host.resize(m * (B - 1) * c.draft_vocab_size);
      g.output("draft_logits", {draft_scores_.device_data(), DType::float32, {m, B - 1, c.draft_vocab_size}});
    }
  }
  set_up_runs_ += g.run("running draft_block.onnx");
  if (any && device_.decides()) {
    draw_drafts_on_device(rows, sampled, sampling, B);
  } else if (any) {  // drawn on the host from the block pass's outputs
    draft_scores_.download();
    if (k > 0) selector_columns_.download();
  }
  tokens_.download();
  device_.synchronize();

  std::vector<std::vector<int64_t>> out(m);
  for (int64_t i = 0; i < m; ++i) {
    out[i].assign(tokens_.host.begin() + i * (B - 1), tokens_.host.begin() + (i + 1) * (B - 1));
    std::vector<float>& q = rows_[rows[i]].draft_q;
    q.clear();
    if (sampled[i] && !device_.decides()) draw_drafts(i, B, sampling[i], out[i].data(), q);
  }
  return out;
}

void SlotExecutor::draw_drafts_on_device(const std::vector<int64_t>& rows, const std::vector<bool>& sampled,
                                         const std::vector<RowSampling>& sampling, int64_t B) {
  const SlotExecutorConfig& c = config_;
  const int64_t m = int64_t(rows.size()), n = B - 1, V = c.draft_vocab_size, k = c.selector_top_k;
  decide_rows_.host.resize(m * sizeof(DecideRow));
  ++device_draws_;
  for (int64_t i = 0; i < m; ++i) {
    DecideRow row;
    row.first = i * n;
    row.num_drafts = sampled[i] ? n : 0;
    row.sampling = sampling[i].sampling;
    row.stream = sampling[i].stream;
    row.position = sampling[i].position;
    std::memcpy(decide_rows_.host.data() + i * sizeof(DecideRow), &row, sizeof(DecideRow));
    Row& state = rows_[rows[i]];
    state.device_q = sampled[i] ? i * n * V : -1;
    state.device_q_drafts = n;
    state.device_q_draw = device_draws_;
  }
  decide_rows_.upload();
  draft_q_.reserve(m * n * V);
  draft_probs_.reserve(k > 0 ? m * n * k : 1);
  draft_order_.reserve(m * n * (k > 0 ? k : V));
  device_.draw_drafts(static_cast<const float*>(draft_scores_.device_data()),
                      k > 0 ? static_cast<const int64_t*>(selector_columns_.device_data()) : nullptr, k,
                      reinterpret_cast<const DecideRow*>(decide_rows_.device_data()), m, n,
                      c.draft_vocab.empty() ? nullptr : static_cast<const int64_t*>(draft_vocab_device_.device_data()),
                      DraftQ{reinterpret_cast<float*>(draft_q_.at(0)), V, nullptr},
                      reinterpret_cast<float*>(draft_probs_.at(0)), reinterpret_cast<int32_t*>(draft_order_.at(0)),
                      static_cast<int64_t*>(tokens_.device_data()));
}

void SlotExecutor::draw_drafts(int64_t i, int64_t B, const RowSampling& s, int64_t* tokens, std::vector<float>& q) {
  const SlotExecutorConfig& c = config_;
  const int64_t V = c.draft_vocab_size, k = c.selector_top_k;
  q.assign((B - 1) * V, 0.0f);
  if (k == 0) {
    draw_block_drafts(draft_scores_.host.data() + i * (B - 1) * V, B - 1, V, c.draft_vocab, s.sampling, s.stream,
                      s.position, tokens, q.data());
    return;
  }
  draw_selector_drafts(draft_scores_.host.data() + i * (B - 1) * k * k, selector_columns_.host.data() + i * (B - 1) * k,
                       B - 1, k, V, c.draft_vocab, s.sampling, s.stream, s.position, tokens, q.data());
}

}  // namespace dflash

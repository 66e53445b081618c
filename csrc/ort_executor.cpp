// ort_executor.cpp: the phases of csrc/executor.h as onnxruntime Runs over slot buffers.
#include "ort_executor.h"

#include <algorithm>
#include <cstring>

namespace dflash {

namespace {

constexpr char kWhy[] = "the C++ onnxruntime executor";

void positive(int64_t value, const char* name) {
  if (value < 1) throw Error(std::string(kWhy) + ": " + name + " must be >= 1, got " + std::to_string(value));
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
void check_layer_split(const std::vector<int64_t>& attention, const std::vector<int64_t>& linear, int64_t layers) {
  std::vector<int> seen(layers, 0);
  for (const auto* list : {&attention, &linear})
    for (size_t k = 0; k < list->size(); ++k) {
      const int64_t i = (*list)[k];
      if (i < 0 || i >= layers || (k > 0 && i <= (*list)[k - 1]))
        throw Error(std::string(kWhy) + ": attention_layers and linear_layers must be ascending layer indices below " +
                    "target_layers (" + std::to_string(layers) + "), got " + std::to_string(i));
      ++seen[i];
    }
  for (int64_t i = 0; i < layers; ++i)
    if (seen[i] != 1)
      throw Error(std::string(kWhy) + ": target layer " + std::to_string(i) + " is in " + std::to_string(seen[i]) +
                  " of attention_layers and linear_layers (each layer must be in exactly one)");
}

template <typename T>
void fill(std::vector<T>& buffer, size_t size, T value) {
  buffer.assign(size, value);  // grows once, then reuses the allocation
}

}  // namespace

void OrtExecutorConfig::validate() const {
  if (dtype != "float32")
    throw Error(std::string(kWhy) + " runs float32 bundles only (this one is " + dtype +
                "): re-export with --dtype fp32");
  for (const auto& [path, name] : {std::pair{&target_path, "target"}, std::pair{&draft_context_path, "draft_context"},
                                   std::pair{&draft_block_path, "draft_block"}, std::pair{&library_path, "library"}})
    if (path->empty()) throw Error(std::string(kWhy) + ": no " + name + " path given");
  positive(max_batch, "max_batch");
  positive(capacity, "capacity");
  positive(target_layers, "target_layers");
  positive(target_kv_heads, "target_kv_heads");
  positive(target_head_dim, "target_head_dim");
  positive(feature_width, "feature_width");
  positive(vocab, "vocab");
  positive(draft_layers, "draft_layers");
  positive(draft_kv_heads, "draft_kv_heads");
  positive(draft_head_dim, "draft_head_dim");
  if (threads < 0) throw Error(std::string(kWhy) + ": threads must be >= 0 (0: onnxruntime's default)");
  if (mask_token_id < 0 || mask_token_id >= vocab)
    throw Error(std::string(kWhy) + ": mask_token_id " + std::to_string(mask_token_id) + " is outside the vocabulary");
  check_layer_split(attention_layers, linear_layers, target_layers);
  if (linear_layers.empty()) return;
  positive(conv_dim, "conv_dim");
  if (conv_kernel < 2)
    throw Error(std::string(kWhy) + ": conv_kernel must be >= 2 (its state keeps conv_kernel - 1 columns), got " +
                std::to_string(conv_kernel));
  positive(linear_value_heads, "linear_value_heads");
  positive(linear_key_head_dim, "linear_key_head_dim");
  positive(linear_value_head_dim, "linear_value_head_dim");
}

OrtExecutor::OrtExecutor(const OrtExecutorConfig& config) : config_(config) {
  config_.validate();
  runtime_ = ort::Runtime::load(config_.library_path);
  target_ = runtime_->open(config_.target_path, config_.threads);
  draft_context_ = runtime_->open(config_.draft_context_path, config_.threads);
  draft_block_ = runtime_->open(config_.draft_block_path, config_.threads);
  target_io_ = runtime_->binding(target_);
  context_io_ = runtime_->binding(draft_context_);
  block_io_ = runtime_->binding(draft_block_);
  target_cache_in_ = cache_names("cache", config_.attention_layers);
  target_cache_out_ = cache_names("cache", config_.attention_layers, "_out");
  context_names_ = cache_names("context", up_to(config_.draft_layers));
  conv_in_ = state_names("conv_state", config_.linear_layers);
  recurrent_in_ = state_names("recurrent_state", config_.linear_layers);
  conv_out_names_ = state_names("conv_states", config_.linear_layers);
  recurrent_out_names_ = state_names("recurrent_states", config_.linear_layers);

  const OrtExecutorConfig& c = config_;
  const int64_t target_slots = c.max_batch * c.target_kv_heads * c.capacity * c.target_head_dim;
  const int64_t draft_slots = c.max_batch * c.draft_kv_heads * c.capacity * c.draft_head_dim;
  target_kv_.assign(2 * c.attention_layers.size(), std::vector<float>(target_slots));  // zeros: never NaN where masked
  draft_kv_.assign(2 * c.draft_layers, std::vector<float>(draft_slots));
  context_.resize(2 * c.draft_layers);
  const size_t linear = c.linear_layers.size();
  conv_size_ = c.conv_dim * (c.conv_kernel - 1);
  recurrent_size_ = c.linear_value_heads * c.linear_key_head_dim * c.linear_value_head_dim;
  conv_.assign(linear, std::vector<float>(c.max_batch * conv_size_));
  recurrent_.assign(linear, std::vector<float>(c.max_batch * recurrent_size_));
  rows_.resize(c.max_batch);
}

const OrtExecutor::Row& OrtExecutor::state(int64_t row) const {
  if (row < 0 || row >= config_.max_batch)
    throw Error(std::string(kWhy) + ": row " + std::to_string(row) + " is not a slot (max_batch " +
                std::to_string(config_.max_batch) + ")");
  return rows_[row];
}

OrtExecutor::Row& OrtExecutor::state(int64_t row) {
  return const_cast<Row&>(static_cast<const OrtExecutor&>(*this).state(row));
}

// -- the target ---------------------------------------------------------------------------------

// Groups of rows whose slot range can run as one batch: every slot in the range, in the phase or
// idle, keeps its writes inside the slot (cache length + s <= C, s = the group's longest input).
// Usually one group; a row near its capacity beside a long input gets a Run of its own.
std::vector<std::vector<size_t>> OrtExecutor::target_groups(const std::vector<int64_t>& rows,
                                                            const std::vector<std::vector<int64_t>>& tokens) const {
  auto fits = [&](int64_t lo, int64_t hi, int64_t s) {
    for (int64_t slot = lo; slot <= hi; ++slot)
      if (rows_[slot].committed + s > config_.capacity) return false;
    return true;
  };
  std::vector<std::vector<size_t>> groups;
  int64_t s = 0;
  for (size_t i = 0; i < rows.size(); ++i) {
    const int64_t len = int64_t(tokens[i].size());
    if (!groups.empty() && fits(rows[groups.back().front()], rows[i], std::max(s, len))) {
      groups.back().push_back(i);
      s = std::max(s, len);
    } else {
      groups.push_back({i});
      s = len;
    }
  }
  return groups;
}

template <typename F>
void OrtExecutor::run_target(const std::vector<int64_t>& rows, const std::vector<std::vector<int64_t>>& tokens,
                             bool last_only, F&& take) {
  DFLASH_INVARIANT(rows.size() == tokens.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& row = state(rows[i]);
    DFLASH_INVARIANT(i == 0 || rows[i] > rows[i - 1]);
    DFLASH_INVARIANT(!tokens[i].empty() && row.committed + int64_t(tokens[i].size()) <= config_.capacity);
    for (int64_t id : tokens[i])
      if (id < 0 || id >= config_.vocab)
        throw Error(std::string(kWhy) + ": token id " + std::to_string(id) + " is outside the vocabulary (" +
                    std::to_string(config_.vocab) + ")");
  }
  ++phase_;
  run_ = -1;
  for (const std::vector<size_t>& group : target_groups(rows, tokens)) {
    const int64_t lo = rows[group.front()], n = rows[group.back()] - lo + 1;
    int64_t s = 0;
    for (size_t i : group) s = std::max(s, int64_t(tokens[i].size()));
    const int64_t r = last_only ? 1 : s;
    // Idle rows (slots of the range not in this phase) feed nothing and are not written: query
    // length 0 at their own committed length, so even a scratch write would land past what counts.
    fill(ids_, n * s, int64_t(0));
    fill(query_lengths_, n, int64_t(0));
    fill(logits_index_, n * r, int64_t(0));
    cache_lengths_.resize(n);
    for (int64_t j = 0; j < n; ++j) cache_lengths_[j] = rows_[lo + j].committed;
    for (size_t i : group) {
      const int64_t j = rows[i] - lo, len = int64_t(tokens[i].size());
      std::copy(tokens[i].begin(), tokens[i].end(), ids_.begin() + j * s);
      query_lengths_[j] = len;
      for (int64_t k = 0; k < r; ++k) logits_index_[j * r + k] = last_only ? len - 1 : k;
    }
    logits_.resize(n * r * config_.vocab);
    features_.resize(n * s * config_.feature_width);
    if (++run_ == int64_t(state_runs_.size())) state_runs_.emplace_back();
    StateRun& states = state_runs_[run_];
    states.rows = r;
    states.conv.resize(conv_.size());
    states.recurrent.resize(conv_.size());
    for (size_t k = 0; k < conv_.size(); ++k) {
      states.conv[k].resize(n * r * conv_size_);
      states.recurrent[k].resize(n * r * recurrent_size_);
    }
    run_target_range(lo, n, s, r);
    for (size_t i : group) {
      const int64_t j = rows[i] - lo;
      take(i, j, logits_.data() + j * r * config_.vocab, features_.data() + j * s * config_.feature_width);
    }
  }
}

void OrtExecutor::run_target_range(int64_t lo, int64_t n, int64_t s, int64_t r) {
  const OrtExecutorConfig& c = config_;
  const ort::Runtime& rt = *runtime_;
  rt.clear(target_io_);
  std::vector<ort::Value> values;  // alive until the Run is done
  auto in = [&](const char* name, ort::Value v) {
    rt.bind_input(target_io_, name, v);
    values.push_back(std::move(v));
  };
  auto out = [&](const char* name, ort::Value v) {
    rt.bind_output(target_io_, name, v);
    values.push_back(std::move(v));
  };
  in("input_ids", rt.tensor(ids_.data(), {n, s}));
  in("cache_lengths", rt.tensor(cache_lengths_.data(), {n}));
  in("query_lengths", rt.tensor(query_lengths_.data(), {n}));
  in("logits_index", rt.tensor(logits_index_.data(), {n, r}));
  const int64_t slot_size = c.target_kv_heads * c.capacity * c.target_head_dim;
  for (size_t k = 0; k < target_kv_.size(); ++k) {
    ort::Value cache =
        rt.tensor(target_kv_[k].data() + lo * slot_size, {n, c.target_kv_heads, c.capacity, c.target_head_dim});
    rt.bind_input(target_io_, target_cache_in_[k], cache);
    rt.bind_output(target_io_, target_cache_out_[k], cache);  // the same buffer: written in place
    values.push_back(std::move(cache));
  }
  // Linear layers read their slots' states and return the states after each logits row into
  // scratch; only the rows a phase keeps are copied back (idle and padding rows' are garbage).
  const int64_t K1 = c.conv_kernel - 1, Hv = c.linear_value_heads, Dk = c.linear_key_head_dim,
                Dv = c.linear_value_head_dim;
  for (size_t k = 0; k < conv_.size(); ++k) {
    in(conv_in_[k].c_str(), rt.tensor(conv_[k].data() + lo * conv_size_, {n, c.conv_dim, K1}));
    in(recurrent_in_[k].c_str(), rt.tensor(recurrent_[k].data() + lo * recurrent_size_, {n, Hv, Dk, Dv}));
    StateRun& states = state_runs_[run_];
    out(conv_out_names_[k].c_str(), rt.tensor(states.conv[k].data(), {n, r, c.conv_dim, K1}));
    out(recurrent_out_names_[k].c_str(), rt.tensor(states.recurrent[k].data(), {n, r, Hv, Dk, Dv}));
  }
  out("logits", rt.tensor(logits_.data(), {n, r, c.vocab}));
  out("features", rt.tensor(features_.data(), {n, s, c.feature_width}));
  rt.run(target_, target_io_, "running target.onnx");
  ++target_runs_;
}

const float* OrtExecutor::conv_out(int64_t run, size_t k, int64_t j, int64_t pos) const {
  const StateRun& states = state_runs_[run];
  return states.conv[k].data() + (j * states.rows + pos) * conv_size_;
}

const float* OrtExecutor::recurrent_out(int64_t run, size_t k, int64_t j, int64_t pos) const {
  const StateRun& states = state_runs_[run];
  return states.recurrent[k].data() + (j * states.rows + pos) * recurrent_size_;
}

void OrtExecutor::set_states(int64_t row, const std::vector<const float*>& conv,
                             const std::vector<const float*>& recurrent) {
  for (size_t k = 0; k < conv_.size(); ++k) {
    float* c = conv_[k].data() + row * conv_size_;
    float* h = recurrent_[k].data() + row * recurrent_size_;
    if (conv.empty()) {
      std::fill(c, c + conv_size_, 0.0f);
      std::fill(h, h + recurrent_size_, 0.0f);
    } else {
      std::copy(conv[k], conv[k] + conv_size_, c);
      std::copy(recurrent[k], recurrent[k] + recurrent_size_, h);
    }
  }
}

std::vector<LogitsRows> OrtExecutor::prefill(const std::vector<int64_t>& rows,
                                             const std::vector<std::vector<int64_t>>& prompts) {
  // A row not live yet starts a request (zero states; release left it empty); a live one takes its
  // prompt's next chunk after what it holds.
  for (int64_t row : rows)
    if (!state(row).live) set_states(row, {}, {});
  std::vector<LogitsRows> out(rows.size());
  const int64_t F = config_.feature_width;
  const size_t linear = conv_.size();
  std::vector<const float*> conv(linear), recurrent(linear);
  run_target(rows, prompts, true, [&](size_t i, int64_t j, const float* logits, const float* features) {
    out[i].rows = 1;
    out[i].vocab = config_.vocab;
    out[i].data.assign(logits, logits + config_.vocab);
    std::vector<float>& pending = rows_[rows[i]].pending;  // injected at the next draft
    pending.insert(pending.end(), features, features + prompts[i].size() * F);
    if (linear == 0) return;
    for (size_t k = 0; k < linear; ++k) {  // a prefill commits all of its chunk: the state after its last token
      conv[k] = conv_out(run_, k, j, 0);
      recurrent[k] = recurrent_out(run_, k, j, 0);
    }
    set_states(rows[i], conv, recurrent);
  });
  for (size_t i = 0; i < rows.size(); ++i) {
    rows_[rows[i]].live = true;
    rows_[rows[i]].committed += int64_t(prompts[i].size());
  }
  return out;
}

std::vector<LogitsRows> OrtExecutor::verify(const std::vector<int64_t>& rows,
                                            const std::vector<std::vector<int64_t>>& blocks) {
  for (int64_t row : rows) DFLASH_INVARIANT(state(row).live);
  std::vector<LogitsRows> out(rows.size());
  const int64_t V = config_.vocab, F = config_.feature_width;
  run_target(rows, blocks, false, [&](size_t i, int64_t j, const float* logits, const float* features) {
    const int64_t len = int64_t(blocks[i].size());
    out[i].rows = len;
    out[i].vocab = V;
    out[i].data.assign(logits, logits + len * V);
    Row& row = rows_[rows[i]];
    row.verify.assign(features, features + len * F);  // pending until commit says how many count
    row.verify_rows = len;
    // The states after each block position stay in this Run's outputs; commit copies one position's.
    row.verify_phase = phase_;
    row.verify_run = run_;
    row.verify_index = j;
  });
  return out;
}

void OrtExecutor::commit(const std::vector<int64_t>& rows, const std::vector<int64_t>& kept) {
  DFLASH_INVARIANT(rows.size() == kept.size());
  const int64_t F = config_.feature_width;
  for (size_t i = 0; i < rows.size(); ++i) {
    Row& row = state(rows[i]);
    DFLASH_INVARIANT(row.live && kept[i] >= 0 && kept[i] <= row.verify_rows);
    // The rejected rows stay in the cache past `committed`: the next Run overwrites them.
    row.committed += kept[i];
    row.pending.insert(row.pending.end(), row.verify.begin(), row.verify.begin() + kept[i] * F);
    if (kept[i] > 0 && !conv_.empty()) {  // the states after the last kept position; kept 0 keeps the slot's
      // no target Run since this row's verify may have reused its outputs (the scheduler commits right after)
      DFLASH_INVARIANT(row.verify_phase == phase_);
      std::vector<const float*> conv, recurrent;
      for (size_t k = 0; k < conv_.size(); ++k) {
        conv.push_back(conv_out(row.verify_run, k, row.verify_index, kept[i] - 1));
        recurrent.push_back(recurrent_out(row.verify_run, k, row.verify_index, kept[i] - 1));
      }
      set_states(rows[i], conv, recurrent);
    }
    row.verify.clear();
    row.verify_rows = 0;
  }
}

void OrtExecutor::release(int64_t row) {
  Row& r = state(row);
  r = Row{};
}

// -- the drafter --------------------------------------------------------------------------------

void OrtExecutor::inject(const std::vector<int64_t>& rows) {
  const OrtExecutorConfig& c = config_;
  const int64_t F = c.feature_width, m = int64_t(rows.size());
  int64_t n = 0;
  for (int64_t row : rows) n = std::max(n, int64_t(rows_[row].pending.size()) / F);
  if (n == 0) return;
  // features [m, n, F], zero-padded; positions continue each row's context
  fill(features_, m * n * F, 0.0f);
  positions_.resize(m * n);
  for (int64_t i = 0; i < m; ++i) {
    const Row& row = rows_[rows[i]];
    std::copy(row.pending.begin(), row.pending.end(), features_.begin() + i * n * F);
    for (int64_t j = 0; j < n; ++j) positions_[i * n + j] = row.drafted + j;
  }
  const ort::Runtime& rt = *runtime_;
  rt.clear(context_io_);
  std::vector<ort::Value> values;
  values.push_back(rt.tensor(features_.data(), {m, n, F}));
  rt.bind_input(context_io_, "features", values.back());
  values.push_back(rt.tensor(positions_.data(), {m, n}));
  rt.bind_input(context_io_, "positions", values.back());
  const int64_t head_rows = n * c.draft_head_dim;  // one head's new rows in the output
  for (size_t k = 0; k < context_.size(); ++k) {
    context_[k].resize(m * c.draft_kv_heads * head_rows);
    values.push_back(rt.tensor(context_[k].data(), {m, c.draft_kv_heads, n, c.draft_head_dim}));
    rt.bind_output(context_io_, context_names_[k], values.back());
  }
  rt.run(draft_context_, context_io_, "running draft_context.onnx");
  // Each row's valid new rows into its slot at its context length: p rows per head, not the cache.
  const int64_t slot_size = c.draft_kv_heads * c.capacity * c.draft_head_dim;
  for (int64_t i = 0; i < m; ++i) {
    Row& row = rows_[rows[i]];
    const int64_t p = int64_t(row.pending.size()) / F;
    DFLASH_INVARIANT(row.drafted + p <= c.capacity);
    for (size_t k = 0; k < context_.size(); ++k)
      for (int64_t h = 0; h < c.draft_kv_heads; ++h)
        std::memcpy(draft_kv_[k].data() + rows[i] * slot_size + (h * c.capacity + row.drafted) * c.draft_head_dim,
                    context_[k].data() + (i * c.draft_kv_heads + h) * head_rows, p * c.draft_head_dim * sizeof(float));
    row.drafted += p;
    row.pending.clear();
  }
}

std::vector<std::vector<int64_t>> OrtExecutor::draft(const std::vector<int64_t>& rows,
                                                     const std::vector<int64_t>& bonus, int64_t block_size) {
  const OrtExecutorConfig& c = config_;
  DFLASH_INVARIANT(rows.size() == bonus.size());
  if (block_size < 2)
    throw Error(std::string(kWhy) + ": draft needs block_size >= 2, got " + std::to_string(block_size));
  for (int64_t row : rows) DFLASH_INVARIANT(state(row).live);
  if (rows.empty()) return {};
  inject(rows);

  // The block pass reads each row's first `drafted` context rows; pack them [m, dkv, ctx, dd] so its
  // work follows the longest context, not the capacity (rows past a row's length are masked).
  const int64_t m = int64_t(rows.size()), B = block_size;
  int64_t ctx = 1;
  for (int64_t row : rows) ctx = std::max(ctx, rows_[row].drafted);
  const int64_t slot_size = c.draft_kv_heads * c.capacity * c.draft_head_dim;
  for (size_t k = 0; k < context_.size(); ++k) {
    context_[k].resize(m * c.draft_kv_heads * ctx * c.draft_head_dim);
    for (int64_t i = 0; i < m; ++i)
      for (int64_t h = 0; h < c.draft_kv_heads; ++h)
        std::memcpy(context_[k].data() + (i * c.draft_kv_heads + h) * ctx * c.draft_head_dim,
                    draft_kv_[k].data() + rows[i] * slot_size + h * c.capacity * c.draft_head_dim,
                    rows_[rows[i]].drafted * c.draft_head_dim * sizeof(float));
  }
  ids_.resize(m * B);
  lengths_.resize(m);
  for (int64_t i = 0; i < m; ++i) {
    ids_[i * B] = bonus[i];
    std::fill(ids_.begin() + i * B + 1, ids_.begin() + (i + 1) * B, c.mask_token_id);
    lengths_[i] = rows_[rows[i]].drafted;
  }
  tokens_.resize(m * (B - 1));

  const ort::Runtime& rt = *runtime_;
  rt.clear(block_io_);
  std::vector<ort::Value> values;
  values.push_back(rt.tensor(ids_.data(), {m, B}));
  rt.bind_input(block_io_, "block_ids", values.back());
  values.push_back(rt.tensor(lengths_.data(), {m}));
  rt.bind_input(block_io_, "context_lengths", values.back());
  for (size_t k = 0; k < context_.size(); ++k) {
    values.push_back(rt.tensor(context_[k].data(), {m, c.draft_kv_heads, ctx, c.draft_head_dim}));
    rt.bind_input(block_io_, context_names_[k], values.back());
  }
  values.push_back(rt.tensor(tokens_.data(), {m, B - 1}));
  rt.bind_output(block_io_, "draft_tokens", values.back());  // draft_logits is not fetched
  rt.run(draft_block_, block_io_, "running draft_block.onnx");

  std::vector<std::vector<int64_t>> out(m);
  for (int64_t i = 0; i < m; ++i) out[i].assign(tokens_.begin() + i * (B - 1), tokens_.begin() + (i + 1) * (B - 1));
  return out;
}

}  // namespace dflash

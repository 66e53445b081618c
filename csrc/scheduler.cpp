// scheduler.cpp: one step = admit -> pick rows -> prefill -> choose block -> draft -> verify ->
// accept -> commit -> emit.
#include "scheduler.h"

#include <algorithm>
#include <iterator>
#include <string>

#include "acceptance.h"
#include "errors.h"

namespace dflash {

const char* finish_name(Finish f) {
  switch (f) {
    case Finish::kStop: return "stop";
    case Finish::kLength: return "length";
    case Finish::kAbort: return "abort";
    case Finish::kError: return "error";
    default: return "";
  }
}

Scheduler::Scheduler(Executor& executor, const SchedulerConfig& config)
    : executor_(executor),
      config_(config),
      slots_(config.max_batch, config.capacity),
      acceptance_(config.block_size - 1),
      steps_per_block_(std::max<int64_t>(config.block_size, 0), 0) {
  if (config.block_size < 1)
    throw Error("block_size must be at least 1 (1: plain decoding), got " + std::to_string(config.block_size));
  if (config.block_size > config.capacity)
    throw Error("block_size " + std::to_string(config.block_size) + " is larger than a KV slot (" +
                std::to_string(config.capacity) + " tokens)");
  if (config.prefill_chunk < 0)
    throw Error("prefill_chunk must be 0 (whole prompts) or at least 1 token, got " +
                std::to_string(config.prefill_chunk));
  if (config.max_waiting < -1)
    throw Error("max_waiting must be -1 (no cap) or at least 0, got " + std::to_string(config.max_waiting));
  kept_tokens_.resize(config.max_batch);  // max_batch >= 1: slots_ checked it
  kept_salt_.resize(config.max_batch);
  freed_at_.assign(config.max_batch, 0);
  executor_.keep_released(config.prefix_reuse);
}

int64_t Scheduler::add_request(const std::vector<int64_t>& prompt, const RequestParams& params) {
  params.sampling.validate();
  if (params.max_tokens < 1) throw Error("max_tokens must be at least 1, got " + std::to_string(params.max_tokens));
  if (params.max_block < 0)
    throw Error("max_block must be at least 0 (0: the scheduler's block size), got " + std::to_string(params.max_block));
  if (params.min_tokens < 0) throw Error("min_tokens must be at least 0, got " + std::to_string(params.min_tokens));
  if (params.priority != 0 && !config_.by_priority)
    throw Error("priority " + std::to_string(params.priority) +
                " needs the priority scheduling policy; under first come first served every priority is 0");
  if (params.prompt_logprobs < -1 || params.prompt_logprobs > kMaxLogprobs)
    throw Error("prompt_logprobs must be -1 (none) or in [0, " + std::to_string(kMaxLogprobs) + "], got " +
                std::to_string(params.prompt_logprobs));
  for (const auto& [token, bias] : params.logit_bias) {
    if (token < 0 || token >= executor_.vocab())
      throw Error("logit_bias names token " + std::to_string(token) + ", outside the vocabulary (" +
                  std::to_string(executor_.vocab()) + ")");
    if (!(bias >= -100.0 && bias <= 100.0))
      throw Error("logit_bias values must be in [-100, 100], got " + std::to_string(bias));
  }
  const int64_t id = next_id_;
  // The allocator's one line for a request that can never fit, whatever is free now.
  slots_.check_fits(id, int64_t(prompt.size()), params.max_tokens);
  const bool queued = !waiting_.empty() || slots_.num_free() == 0;
  // the requests waiting beyond the free slots (one waiting for a prefill holds a free slot in reserve)
  if (queued && config_.max_waiting >= 0 && num_waiting() - slots_.num_free() >= config_.max_waiting)
    throw Error("no free KV slot for request " + std::to_string(id) + " and the waiting queue is full (" +
                std::to_string(config_.max_waiting) + " requests); retry after a request finishes or raise max_waiting");
  ++next_id_;
  Request r;
  r.id = id;
  r.prompt = prompt;
  r.context = prompt;
  r.params = params;
  r.timing.arrival = RequestTiming::now();
  // A seeded request's stream is 0, so its tokens depend on its seed alone, not on its id or on when
  // it arrived; an unseeded one draws from the engine seed on a stream of its own.
  r.seed = params.seeded ? params.sampling.seed : config_.engine_seed;
  r.stream = params.seeded ? 0 : uint64_t(id) + 1;
  r.params.sampling.seed = r.seed;
  // what its logits get before a decision (penalties.h): the prompt only matters to a repetition penalty
  r.adjusts = penalizes(params.sampling) || cuts_min_p(params.sampling) || !params.logit_bias.empty() ||
              params.min_tokens > 0 || params.constraint != nullptr;
  if (params.sampling.repetition_penalty != 1.0)
    for (int64_t t : prompt) r.history[int32_t(t)].in_prompt = true;
  for (const auto& [token, bias] : params.logit_bias) r.history[int32_t(token)].bias = float(bias);
  if (params.min_tokens > 0) {  // a stop id past the vocabulary can never come: nothing to ban
    const auto ban = [&](int64_t t) {
      if (t >= 0 && t < executor_.vocab()) r.history[int32_t(t)].stop = true;
    };
    for (int64_t t : params.stop_token_ids) ban(t);
    if (!params.ignore_eos)
      for (int64_t t : params.eos_token_ids) ban(t);
  }
  waiting_.push_back(std::move(r));
  if (!queued) admit();
  return id;
}

bool Scheduler::abort(int64_t request) {
  auto match = [&](const Request& r) { return r.id == request; };
  auto abort_now = [&](Request& r) { aborted_.push_back(end(r, Finish::kAbort)); };
  auto running = std::find_if(live_.begin(), live_.end(), match);
  if (running != live_.end() && running->finish == Finish::kNone) {
    abort_now(*running);
    live_.erase(running);
    return true;
  }
  auto waiting = std::find_if(waiting_.begin(), waiting_.end(), match);
  if (waiting != waiting_.end()) {
    abort_now(*waiting);
    waiting_.erase(waiting);
    return true;
  }
  return false;
}

std::vector<RequestOutput> Scheduler::step() {
  std::vector<RequestOutput> out;
  const double step_start = RequestTiming::now();
  try {
    admit();
    const std::vector<Request*> fresh = pick_rows(false);  // pick before prefill marks them
    std::vector<Request*> rows = pick_rows(true);
    prefill(fresh, out);
    if (!rows.empty()) {
      choose_block(rows);
      draft(rows);
      std::vector<Verdict> verdicts = verify(rows);
      drop_failed(rows, verdicts, out);
      accept(rows, verdicts);
      commit(rows);
      emit(rows, out);
    }
  } catch (...) {
    rollback_reserved();
    throw;
  }
  live_.erase(std::remove_if(live_.begin(), live_.end(), [](const Request& r) { return r.finish != Finish::kNone; }),
              live_.end());
  // Aborts since the last step come first (kept for the next step if this one threw).
  out.insert(out.begin(), std::make_move_iterator(aborted_.begin()), std::make_move_iterator(aborted_.end()));
  aborted_.clear();
  seconds_.step += RequestTiming::now() - step_start;
  ++seconds_.steps;
  return out;
}

// -- phases -------------------------------------------------------------------------------------

void Scheduler::admit() {
  while (!waiting_.empty()) {
    const auto next = next_waiting();
    Request& r = *next;
    // a request scoring its prompt needs every position's logits: it reuses none of them
    const bool reuse = r.params.prompt_logprobs < 0;
    if (slots_.num_free() == 0) {
      // one about to wait for a running prefill preempts nobody yet
      Request* victim = config_.by_priority && !(reuse && waits_for_prefill(r, 0))
                            ? preemptible(r.params.priority) : nullptr;
      if (victim == nullptr) break;
      preempt(*victim);  // the queue changed: `next` may no longer point at r
      continue;
    }
    const Admission a = choose_slot(r, reuse);
    if (reuse && waits_for_prefill(r, a.held)) break;  // the queue behind it waits too, a step or so
    // a resumed request (preempted after its first token) may still emit what it had left: its
    // context + that = its prompt + max_tokens
    const bool resumed = !r.tokens.empty();
    const int64_t left = r.params.max_tokens - int64_t(r.tokens.size()) + (resumed ? 1 : 0);
    r.slot = slots_.allocate_at(a.slot, r.id, int64_t(r.context.size()), left, a.held);
    if (a.held > 0) executor_.reopen(a.slot, a.source, a.held);
    r.prompt_done = a.held;
    if (r.preemptions == 0) prompt_tokens_ += int64_t(r.prompt.size());
    if (!resumed) {  // its first output reports the head its prompt reused
      cached_tokens_ += a.held - r.cached;
      r.cached = a.held;
    }
    live_.push_back(std::move(r));
    waiting_.erase(next);
  }
}

std::deque<Scheduler::Request>::iterator Scheduler::next_waiting() {
  if (!config_.by_priority) return waiting_.begin();
  return std::min_element(waiting_.begin(), waiting_.end(), [](const Request& a, const Request& b) {
    return std::pair(a.params.priority, a.id) < std::pair(b.params.priority, b.id);
  });
}

Scheduler::Request* Scheduler::preemptible(int64_t priority) {
  Request* lowest = nullptr;
  for (Request& r : live_)
    if (r.finish == Finish::kNone && r.params.priority > priority &&
        (lowest == nullptr || std::pair(r.params.priority, r.id) > std::pair(lowest->params.priority, lowest->id)))
      lowest = &r;
  return lowest;
}

void Scheduler::preempt(Request& r) {
  DFLASH_INVARIANT(r.slot >= 0 && r.finish == Finish::kNone && !slots_.reserved(r.slot));
  release_slot(r);  // what its cache holds stays there for prefix reuse, its own readmission included
  r.slot = -1;
  r.prompt_done = 0;
  if (r.prefilled) {
    // its cache held the prompt and every output token but the last (the bonus, fed by its next
    // verify); its prompt's logprobs went out with its first token
    r.context = r.prompt;
    r.context.insert(r.context.end(), r.tokens.begin(), r.tokens.end() - 1);
    r.params.prompt_logprobs = -1;
  } else {
    r.prompt_logprobs.clear();  // scored again from its first chunk
  }
  r.prefilled = false;
  r.drafts.clear();
  ++r.preemptions;
  ++preemptions_;
  const int64_t id = r.id;
  const auto it = std::find_if(live_.begin(), live_.end(), [&](const Request& x) { return x.id == id; });
  waiting_.push_back(std::move(*it));
  live_.erase(it);
}

std::vector<int64_t> Scheduler::held_tokens(int64_t slot, const std::string& salt) const {
  if (slots_.request(slot) < 0) return kept_salt_[slot] == salt ? kept_tokens_[slot] : std::vector<int64_t>{};
  for (const Request& r : live_) {
    if (r.slot != slot) continue;
    return r.params.cache_salt == salt ? cached_positions(r) : std::vector<int64_t>{};
  }
  return {};
}

std::vector<int64_t> Scheduler::cached_positions(const Request& r) const {
  const int64_t length = slots_.length(r.slot);
  std::vector<int64_t> tokens(r.prompt.begin(), r.prompt.begin() + std::min<int64_t>(length, int64_t(r.prompt.size())));
  const int64_t fed = std::min<int64_t>(length - int64_t(tokens.size()), int64_t(r.tokens.size()));
  if (fed > 0) tokens.insert(tokens.end(), r.tokens.begin(), r.tokens.begin() + fed);
  return tokens;
}

namespace {
// How many of `prompt`'s first tokens equal `held`'s: at most all but the prompt's last token, whose
// prefill gives the request's first output.
int64_t shared_head(const std::vector<int64_t>& held, const std::vector<int64_t>& prompt) {
  const size_t most = std::min(held.size(), prompt.size() - 1);
  return std::mismatch(held.begin(), held.begin() + most, prompt.begin()).first - held.begin();
}
}  // namespace

bool Scheduler::waits_for_prefill(const Request& waiting, int64_t reusable_now) const {
  // a hybrid target reuses only all of a row's positions: never a head of another prompt
  if (!config_.prefix_reuse || config_.prefix_wait_tokens <= 0 || !executor_.reuses_heads()) return false;
  for (const Request& r : live_) {
    if (r.prefilled || r.finish != Finish::kNone || r.params.cache_salt != waiting.params.cache_salt) continue;
    // what choose_slot will reuse of its prompt once that prefill is done
    if (shared_head(r.context, waiting.context) - reusable_now >= config_.prefix_wait_tokens) return true;
  }
  return false;
}

Scheduler::Admission Scheduler::choose_slot(const Request& r, bool reuse) const {
  // the source: the slot, free or running, whose positions of r's salt the prompt reuses most of
  const std::vector<int64_t>& prompt = r.context;
  Admission best{-1, -1, 0};
  int64_t kept_by_source = 0;
  for (int64_t slot = 0; config_.prefix_reuse && reuse && slot < slots_.num_slots(); ++slot) {
    const std::vector<int64_t> held = held_tokens(slot, r.params.cache_salt);
    const int64_t reuse = executor_.reusable(slot, shared_head(held, prompt));
    if (reuse > best.held) {
      best = {-1, slot, reuse};
      kept_by_source = int64_t(held.size());
    }
  }
  // The other free slot worth least: keeping nothing, else released longest ago.
  const auto kept_here = [&](int64_t s) {  // what a free slot still keeps that a request could reuse
    const int64_t kept = int64_t(kept_tokens_[s].size());
    return kept == 0 ? 0 : executor_.reusable(s, kept);
  };
  const auto rank = [&](int64_t s) { return kept_here(s) == 0 ? 0 : freed_at_[s]; };
  int64_t other = -1;
  for (int64_t slot = 0; slot < slots_.num_slots(); ++slot)
    if (slots_.request(slot) < 0 && slot != best.source && (other < 0 || rank(slot) < rank(other))) other = slot;
  // A free source loses only its tail past the head (nothing, for a chat's next turn), the other slot
  // all it keeps: the request takes whichever loses less (the source on a tie: nothing to copy); else
  // the head is copied into the other.
  const bool free_source = best.source >= 0 && slots_.request(best.source) < 0;
  if (free_source && (other < 0 || kept_by_source - best.held <= kept_here(other))) {
    best.slot = best.source;
    return best;
  }
  DFLASH_INVARIANT(other >= 0);  // admit asks only while a slot is free
  best.slot = other;
  return best;
}

std::vector<Scheduler::Request*> Scheduler::pick_rows(bool prefilled) {
  std::vector<Request*> rows;
  for (Request& r : live_)
    if (r.finish == Finish::kNone && r.prefilled == prefilled) rows.push_back(&r);
  std::sort(rows.begin(), rows.end(), [](const Request* a, const Request* b) { return a->slot < b->slot; });
  return rows;
}

RowSampling Scheduler::row_sampling(Request& r, uint32_t position) {
  RowSampling s{r.params.sampling, r.stream, position, nullptr, 0};
  if (!r.adjusts) return s;
  if (penalizes(r.params.sampling))  // counts matter to the penalties alone
    for (; r.counted < r.tokens.size(); ++r.counted) ++r.history[int32_t(r.tokens[r.counted])].count;
  s.history = &r.history;
  // the phase's first position decides output token tokens.size()
  s.ban = std::max<int64_t>(0, r.params.min_tokens - int64_t(r.tokens.size()));
  return s;
}

void Scheduler::constrain(Request& r) {
  const int64_t words = (executor_.vocab() + 31) / 32;
  const size_t drafted = r.drafts.size();
  // a T>0 row whose drafts the executor drew from q keeps them as drawn: its acceptance reads q there
  const bool may_replace = r.params.sampling.greedy() || !executor_.samples_drafts();
  const int64_t k = r.params.constraint->masks(r.drafts, may_replace, words, r.masks);
  if (k < 0 || k > int64_t(drafted) || r.drafts.size() != drafted || int64_t(r.masks.size()) != (k + 1) * words)
    throw Error("a request's output constraint gave " + std::to_string(r.masks.size()) + " mask words and " +
                std::to_string(r.drafts.size()) + " drafts for " + std::to_string(k) + " of " +
                std::to_string(drafted) + " drafts; expected (k + 1) * " + std::to_string(words) + " words");
  // the positions past draft k + 1 follow a draft the grammar refuses, which is never kept: any mask
  for (int64_t j = k + 1; j <= int64_t(drafted); ++j)
    r.masks.insert(r.masks.end(), r.masks.begin() + k * words, r.masks.begin() + (k + 1) * words);
}

void Scheduler::prefill(const std::vector<Request*>& rows, std::vector<RequestOutput>& out) {
  if (rows.empty()) return;
  const double start = RequestTiming::now();
  std::vector<int64_t> slots;
  std::vector<std::vector<int64_t>> chunks;
  std::vector<RowSampling> sampling;
  for (Request* r : rows) {
    const std::vector<int64_t>& context = r->context;
    const int64_t left = int64_t(context.size()) - r->prompt_done;
    int64_t n = config_.prefill_chunk > 0 ? std::min(left, config_.prefill_chunk) : left;
    if (r->params.prompt_logprobs >= 0) n = std::min(n, kScoredChunk);
    slots.push_back(r->slot);
    chunks.emplace_back(context.begin() + r->prompt_done, context.begin() + r->prompt_done + n);
    // The first token sits at sequence position len(prompt) (only the last chunk's draw is kept; a
    // resumed request's draw there is its last token, which it has already).
    sampling.push_back(row_sampling(*r, uint32_t(context.size())));
    sampling.back().prompt_logprobs = r->params.prompt_logprobs;
    if (r->prompt_done + n < int64_t(context.size())) sampling.back().after = context[r->prompt_done + n];
    if (r->params.constraint && r->tokens.empty() && r->prompt_done + n == int64_t(context.size())) {
      r->drafts.clear();
      constrain(*r);
      sampling.back().masks = r->masks.data();
    }
    slots_.reserve(r->slot, n);
    if (!r->timing.scheduled) r->timing.scheduled = start;
  }
  const double prefill_start = RequestTiming::now();
  const std::vector<int64_t> first = executor_.prefill(slots, chunks, sampling);
  seconds_.prefill += RequestTiming::now() - prefill_start;
  if (first.size() != rows.size())
    throw Error("executor prefill returned " + std::to_string(first.size()) + " tokens for " +
                std::to_string(rows.size()) + " rows; expected one per row");
  for (size_t i = 0; i < rows.size(); ++i) {
    Request& r = *rows[i];
    slots_.commit(r.slot, int64_t(chunks[i].size()));
    const std::vector<TokenLogprob>& scored = executor_.prompt_logprobs(i);
    const int64_t top = r.params.prompt_logprobs, after = sampling[i].after >= 0;  // a chunk before the last
    if (top >= 0 && int64_t(scored.size()) != (int64_t(chunks[i].size()) - 1 + after) * (1 + top))
      throw Error("executor returned " + std::to_string(scored.size()) + " prompt logprob entries for a chunk of " +
                  std::to_string(chunks[i].size()) + " tokens of slot " + std::to_string(r.slot));
    r.prompt_logprobs.insert(r.prompt_logprobs.end(), scored.begin(), scored.end());
    r.prompt_done += int64_t(chunks[i].size());
    if (r.prompt_done < int64_t(r.context.size())) continue;  // more chunks in the next steps
    r.prefilled = true;
    if (!r.tokens.empty()) continue;  // resumed: its cache holds what it had, its last token comes next
    if (!is_token(first[i])) {
      fail(r, "the target's logits after the prompt gave no token (NaN logits, or every token masked out)", out);
      continue;
    }
    r.logprobs = executor_.logprobs(i);
    emit_tokens(r, {first[i]}, out);
    if (r.params.prompt_logprobs >= 0) {
      out.back().prompt_logprobs = std::move(r.prompt_logprobs);
      out.back().prompt_scored = int64_t(r.prompt.size()) - 1;
    }
  }
}

int64_t Scheduler::limit_for(const Request& r) const {
  // Never verify more than the request may still emit (the slot always has room for that, as
  // prompt + max_tokens fit: length + remaining = prompt + max_tokens - 1).
  const int64_t remaining = r.params.max_tokens - int64_t(r.tokens.size());
  const int64_t room = slots_.capacity() - slots_.length(r.slot);
  const int64_t block = r.params.max_block > 0 ? std::min(r.params.max_block, config_.block_size) : config_.block_size;
  const int64_t limit = std::min({block, remaining, room});
  DFLASH_INVARIANT(limit >= 1);
  return limit;
}

void Scheduler::choose_block(const std::vector<Request*>& rows) {
  std::vector<int64_t> limits;
  for (const Request* r : rows) limits.push_back(limit_for(*r));
  step_block_ = config_.block_size;
  if (config_.adaptive && config_.block_size > 1 && !verify_cost_.empty()) {
    // Seconds per B for this many rows; the draft call covers the rows whose block reaches 2. A
    // draft never timed yet costs nothing and, before any verify timing, the step takes the
    // largest block (above): either way the policy tries what it has not measured, and learns.
    const int64_t n = int64_t(rows.size());
    std::vector<double> verify(config_.block_size), draft(config_.block_size, 0.0);
    for (int64_t b = 1; b <= config_.block_size; ++b) {
      verify[b - 1] = *verify_cost_.predict(n, b);
      const int64_t drafting = std::count_if(limits.begin(), limits.end(), [&](int64_t l) { return std::min(b, l) >= 2; });
      if (b > 1 && drafting > 0) draft[b - 1] = draft_cost_.predict(drafting, b).value_or(0.0);
    }
    step_block_ = dflash::choose_block(acceptance_.acceptance(), limits, verify, draft);
  }
  for (size_t i = 0; i < rows.size(); ++i) rows[i]->block = std::min(step_block_, limits[i]);
  ++steps_per_block_[step_block_ - 1];
}

void Scheduler::draft(const std::vector<Request*>& rows) {
  std::vector<int64_t> slots, bonus;
  std::vector<Request*> drafting;
  std::vector<RowSampling> sampling;
  for (Request* r : rows) {
    r->drafts.clear();
    if (r->block < 2) continue;  // only the bonus to verify: nothing to draft
    drafting.push_back(r);
    slots.push_back(r->slot);
    bonus.push_back(r->tokens.back());
    // drafts[0] sits one after the bonus, whose position is the committed length (as in verify)
    sampling.push_back({r->params.sampling, r->stream, uint32_t(slots_.length(r->slot) + 1)});
  }
  if (drafting.empty()) return;
  // Every drafting row drafts the step's block; a row near its end keeps only what it may use.
  const int64_t set_ups = executor_.set_up_runs();
  const double start = RequestTiming::now();
  const std::vector<std::vector<int64_t>> drafts = executor_.draft(slots, bonus, step_block_, sampling);
  const double seconds = RequestTiming::now() - start;
  if (executor_.set_up_runs() == set_ups) draft_cost_.observe(int64_t(drafting.size()), step_block_, seconds);
  seconds_.draft += seconds;
  DFLASH_INVARIANT(drafts.size() == drafting.size());
  for (size_t i = 0; i < drafting.size(); ++i) {
    Request& r = *drafting[i];
    if (int64_t(drafts[i].size()) != step_block_ - 1)
      throw Error("executor draft returned " + std::to_string(drafts[i].size()) + " tokens for slot " +
                  std::to_string(r.slot) + "; expected block_size - 1 = " + std::to_string(step_block_ - 1));
    r.drafts.assign(drafts[i].begin(), drafts[i].begin() + (r.block - 1));
    // a draft the drafter could not draw (kNoToken: its scores were NaN) ends what is verified, as a row
    // near its end verifies fewer: the target alone decides the tokens
    r.drafts.erase(std::find_if(r.drafts.begin(), r.drafts.end(), [&](int64_t t) { return !is_token(t); }),
                   r.drafts.end());
  }
}

std::vector<Verdict> Scheduler::verify(const std::vector<Request*>& rows) {
  std::vector<int64_t> slots;
  std::vector<std::vector<int64_t>> blocks;
  std::vector<RowSampling> sampling;
  int64_t widest = 1;
  for (Request* r : rows) {
    if (r->params.constraint) constrain(*r);  // first: it may replace drafts
    std::vector<int64_t> block{r->tokens.back()};
    block.insert(block.end(), r->drafts.begin(), r->drafts.end());
    // drafts[0] sits one after the bonus, whose position is the committed length.
    sampling.push_back(row_sampling(*r, uint32_t(slots_.length(r->slot) + 1)));
    if (r->params.constraint) sampling.back().masks = r->masks.data();
    slots_.reserve(r->slot, int64_t(block.size()));
    widest = std::max(widest, int64_t(block.size()));
    slots.push_back(r->slot);
    blocks.push_back(std::move(block));
  }
  const int64_t set_ups = executor_.set_up_runs();
  const double start = RequestTiming::now();
  std::vector<Verdict> verdicts = executor_.verify(slots, blocks, sampling);
  const double seconds = RequestTiming::now() - start;
  if (executor_.set_up_runs() == set_ups) verify_cost_.observe(int64_t(rows.size()), widest, seconds);
  seconds_.verify += seconds;
  if (verdicts.size() != rows.size())
    throw Error("executor verify returned " + std::to_string(verdicts.size()) + " verdicts for " +
                std::to_string(rows.size()) + " rows; expected one per row");
  for (size_t i = 0; i < rows.size(); ++i) {
    if (verdicts[i].accepted < 0 || verdicts[i].accepted >= int64_t(blocks[i].size()))
      throw Error("executor verify kept " + std::to_string(verdicts[i].accepted) + " drafts of " +
                  std::to_string(blocks[i].size() - 1) + " (next token " + std::to_string(verdicts[i].next) +
                  ") for slot " + std::to_string(rows[i]->slot));
    rows[i]->logprobs = executor_.logprobs(i);
  }
  return verdicts;
}

void Scheduler::drop_failed(std::vector<Request*>& rows, std::vector<Verdict>& verdicts,
                            std::vector<RequestOutput>& out) {
  size_t kept = 0;
  for (size_t i = 0; i < rows.size(); ++i) {
    if (is_token(verdicts[i].next)) {
      rows[kept] = rows[i];
      verdicts[kept++] = verdicts[i];
      continue;
    }
    const size_t at = rows[i]->tokens.size() + size_t(verdicts[i].accepted);  // the output token it had to give
    fail(*rows[i], "the target's logits at output token " + std::to_string(at) +
                       " gave no token (NaN logits, or every token masked out)", out);
  }
  rows.resize(kept);
  verdicts.resize(kept);
}

void Scheduler::accept(const std::vector<Request*>& rows, const std::vector<Verdict>& verdicts) {
  acceptance_.decay();
  for (size_t i = 0; i < rows.size(); ++i) {
    Request& r = *rows[i];
    r.accepted = verdicts[i].accepted;
    r.next = verdicts[i].next;
    if (r.drafts.empty()) continue;
    r.metrics.record(int64_t(r.drafts.size()), r.accepted);
    acceptance_.observe(int64_t(r.drafts.size()), r.accepted);
  }
}

void Scheduler::commit(const std::vector<Request*>& rows) {
  std::vector<int64_t> slots, kept;
  for (Request* r : rows) {
    slots.push_back(r->slot);
    kept.push_back(r->accepted + 1);  // the bonus and the accepted drafts stay in the cache
  }
  const double commit_start = RequestTiming::now();
  executor_.commit(slots, kept);
  seconds_.commit += RequestTiming::now() - commit_start;
  for (size_t i = 0; i < rows.size(); ++i) slots_.commit(slots[i], kept[i]);
}

void Scheduler::emit(const std::vector<Request*>& rows, std::vector<RequestOutput>& out) {
  for (Request* r : rows) {
    std::vector<int64_t> tokens(r->drafts.begin(), r->drafts.begin() + r->accepted);
    tokens.push_back(r->next);
    emit_tokens(*r, tokens, out);
  }
}

void Scheduler::emit_tokens(Request& r, const std::vector<int64_t>& tokens, std::vector<RequestOutput>& out) {
  RequestOutput o;
  o.request = r.id;
  const RequestParams& p = r.params;
  // One token at a time, as spec/stopping.py: tokens after a stop in the same step are dropped.
  const int32_t top = p.sampling.logprobs;
  if (top >= 0 && r.logprobs.size() != tokens.size() * size_t(1 + top))
    throw Error("executor returned " + std::to_string(r.logprobs.size()) + " logprob entries for " +
                std::to_string(tokens.size()) + " tokens of slot " + std::to_string(r.slot) + "; expected " +
                std::to_string(tokens.size() * size_t(1 + top)));
  for (size_t k = 0; k < tokens.size(); ++k) {
    const int64_t token = tokens[k];
    r.tokens.push_back(token);
    o.new_tokens.push_back(token);
    if (top >= 0)
      o.new_logprobs.insert(o.new_logprobs.end(), r.logprobs.begin() + k * (1 + top),
                            r.logprobs.begin() + (k + 1) * (1 + top));
    const bool stop_id = std::find(p.stop_token_ids.begin(), p.stop_token_ids.end(), token) != p.stop_token_ids.end() ||
                         (!p.ignore_eos &&
                          std::find(p.eos_token_ids.begin(), p.eos_token_ids.end(), token) != p.eos_token_ids.end());
    if (stop_id) {
      o.finish = Finish::kStop;
      break;
    }
    if (int64_t(r.tokens.size()) >= p.max_tokens) {
      o.finish = Finish::kLength;
      break;
    }
  }
  r.timing.tokens(RequestTiming::now(), int64_t(o.new_tokens.size()));
  if (p.constraint && o.finish == Finish::kNone) p.constraint->advance(o.new_tokens);
  o.num_tokens = int64_t(r.tokens.size());
  o.cached_tokens = r.cached;
  o.preemptions = r.preemptions;
  o.metrics = r.metrics;
  if (o.finish != Finish::kNone) finish(r, o.finish);
  o.timing = r.timing;
  out.push_back(std::move(o));
}

// -- bookkeeping --------------------------------------------------------------------------------

void Scheduler::finish(Request& r, Finish why) {
  DFLASH_INVARIANT(why != Finish::kNone && r.finish == Finish::kNone);
  r.finish = why;
  r.timing.finished = RequestTiming::now();
  if (r.slot >= 0) release_slot(r);  // a waiting one has no slot, no executor row
}

RequestOutput Scheduler::end(Request& r, Finish why) {
  finish(r, why);
  RequestOutput o;
  o.request = r.id;
  o.num_tokens = int64_t(r.tokens.size());
  o.cached_tokens = r.cached;
  o.preemptions = r.preemptions;
  o.finish = why;
  o.metrics = r.metrics;
  o.timing = r.timing;
  return o;
}

void Scheduler::fail(Request& r, const std::string& why, std::vector<RequestOutput>& out) {
  out.push_back(end(r, Finish::kError));
  out.back().error = why;
}

void Scheduler::release_slot(Request& r) {
  if (slots_.reserved(r.slot)) slots_.rollback(r.slot);
  // a failed request's positions may hold what failed it (NaN states): nobody reuses them
  const bool reusable = config_.prefix_reuse && r.finish != Finish::kError;
  kept_tokens_[r.slot] = reusable ? cached_positions(r) : std::vector<int64_t>{};
  kept_salt_[r.slot] = r.params.cache_salt;
  freed_at_[r.slot] = ++finishes_;
  slots_.free(r.slot);
  if (r.finish == Finish::kError) executor_.discard(r.slot);
  else executor_.release(r.slot);
}

void Scheduler::rollback_reserved() {
  for (Request& r : live_)
    if (r.finish == Finish::kNone && slots_.reserved(r.slot)) slots_.rollback(r.slot);
}

void Scheduler::seed_cost(const std::string& phase, int64_t rows, int64_t block, double seconds) {
  if (rows < 1 || block < 1)
    throw Error("seed_cost: rows and block must be at least 1, got rows " + std::to_string(rows) + ", block " +
                std::to_string(block));
  if (phase == "verify") verify_cost_.observe(rows, block, seconds);
  else if (phase == "draft") draft_cost_.observe(rows, block, seconds);
  else throw Error("seed_cost: phase must be \"verify\" or \"draft\", got \"" + phase + "\"");
}

SchedulerStats Scheduler::stats() const {
  SchedulerStats s;
  s.seconds = seconds_;
  s.prompt_tokens = prompt_tokens_;
  s.cached_tokens = cached_tokens_;
  s.preemptions = preemptions_;
  s.last_block = step_block_;
  s.steps_per_block = steps_per_block_;
  s.acceptance = acceptance_.acceptance();
  s.verify_cost = verify_cost_.cells();
  s.draft_cost = draft_cost_.cells();
  return s;
}

}  // namespace dflash

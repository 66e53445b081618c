// scheduler.cpp: one step = pick rows -> prefill -> draft -> verify -> accept -> commit -> emit.
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
    default: return "";
  }
}

Scheduler::Scheduler(Executor& executor, const SchedulerConfig& config)
    : executor_(executor), config_(config), slots_(config.max_batch, config.capacity) {
  if (config.block_size < 1)
    throw Error("block_size must be at least 1 (1: plain decoding), got " + std::to_string(config.block_size));
  if (config.block_size > config.capacity)
    throw Error("block_size " + std::to_string(config.block_size) + " is larger than a KV slot (" +
                std::to_string(config.capacity) + " tokens)");
}

int64_t Scheduler::add_request(const std::vector<int64_t>& prompt, const RequestParams& params) {
  params.sampling.validate();
  if (params.max_tokens < 1) throw Error("max_tokens must be at least 1, got " + std::to_string(params.max_tokens));
  const int64_t id = next_id_;
  // The allocator refuses (one line) a request that can never fit or finds no free slot.
  const int64_t slot = slots_.allocate(id, int64_t(prompt.size()), params.max_tokens);
  ++next_id_;
  Request r;
  r.id = id;
  r.slot = slot;
  r.prompt = prompt;
  r.params = params;
  // A seeded request's stream is 0, so its tokens depend on its seed alone, not on its id or on when
  // it arrived; an unseeded one draws from the engine seed on a stream of its own.
  r.seed = params.seeded ? params.sampling.seed : config_.engine_seed;
  r.stream = params.seeded ? 0 : uint64_t(id) + 1;
  r.params.sampling.seed = r.seed;
  live_.push_back(std::move(r));
  return id;
}

bool Scheduler::abort(int64_t request) {
  auto it = std::find_if(live_.begin(), live_.end(), [&](const Request& r) { return r.id == request; });
  if (it == live_.end() || it->finish != Finish::kNone) return false;
  RequestOutput o;
  o.request = it->id;
  o.num_tokens = int64_t(it->tokens.size());
  o.finish = Finish::kAbort;
  o.metrics = it->metrics;
  finish(*it, Finish::kAbort);
  aborted_.push_back(std::move(o));
  live_.erase(it);
  return true;
}

std::vector<RequestOutput> Scheduler::step() {
  std::vector<RequestOutput> out;
  try {
    const std::vector<Request*> fresh = pick_rows(false);  // pick before prefill marks them
    const std::vector<Request*> rows = pick_rows(true);
    prefill(fresh, out);
    if (!rows.empty()) {
      draft(rows);
      accept(rows, verify(rows));
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
  return out;
}

// -- phases -------------------------------------------------------------------------------------

std::vector<Scheduler::Request*> Scheduler::pick_rows(bool prefilled) {
  std::vector<Request*> rows;
  for (Request& r : live_)
    if (r.finish == Finish::kNone && r.prefilled == prefilled) rows.push_back(&r);
  std::sort(rows.begin(), rows.end(), [](const Request* a, const Request* b) { return a->slot < b->slot; });
  return rows;
}

void Scheduler::prefill(const std::vector<Request*>& rows, std::vector<RequestOutput>& out) {
  if (rows.empty()) return;
  std::vector<int64_t> slots;
  std::vector<std::vector<int64_t>> prompts;
  for (Request* r : rows) {
    slots.push_back(r->slot);
    prompts.push_back(r->prompt);
    slots_.reserve(r->slot, int64_t(r->prompt.size()));
  }
  const std::vector<LogitsRows> logits = executor_.prefill(slots, prompts);
  DFLASH_INVARIANT(logits.size() == rows.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    Request& r = *rows[i];
    if (logits[i].rows != 1)
      throw Error("executor prefill returned " + std::to_string(logits[i].rows) + " logits rows for slot " +
                  std::to_string(r.slot) + "; expected the last position's only");
    slots_.commit(r.slot, int64_t(r.prompt.size()));
    r.prefilled = true;
    // The first token sits at sequence position len(prompt).
    const int64_t token = sample(logits[i].row(0), logits[i].vocab, r.params.sampling, r.stream,
                                 uint32_t(r.prompt.size()));
    emit_tokens(r, {token}, out);
  }
}

int64_t Scheduler::block_for(const Request& r) const {
  // Never verify more than the request may still emit (the slot always has room for that, as
  // prompt + max_tokens fit: length + remaining = prompt + max_tokens - 1).
  const int64_t remaining = r.params.max_tokens - int64_t(r.tokens.size());
  const int64_t room = slots_.capacity() - slots_.length(r.slot);
  const int64_t block = std::min({config_.block_size, remaining, room});
  DFLASH_INVARIANT(block >= 1);
  return block;
}

void Scheduler::draft(const std::vector<Request*>& rows) {
  std::vector<int64_t> slots, bonus;
  std::vector<Request*> drafting;
  for (Request* r : rows) {
    r->block = block_for(*r);
    r->drafts.clear();
    if (r->block < 2) continue;  // only the bonus to verify: nothing to draft
    drafting.push_back(r);
    slots.push_back(r->slot);
    bonus.push_back(r->tokens.back());
  }
  if (drafting.empty()) return;
  // Every drafting row drafts the engine's block; a row near its end keeps only what it may use.
  const std::vector<std::vector<int64_t>> drafts = executor_.draft(slots, bonus, config_.block_size);
  DFLASH_INVARIANT(drafts.size() == drafting.size());
  for (size_t i = 0; i < drafting.size(); ++i) {
    Request& r = *drafting[i];
    if (int64_t(drafts[i].size()) != config_.block_size - 1)
      throw Error("executor draft returned " + std::to_string(drafts[i].size()) + " tokens for slot " +
                  std::to_string(r.slot) + "; expected block_size - 1 = " + std::to_string(config_.block_size - 1));
    r.drafts.assign(drafts[i].begin(), drafts[i].begin() + (r.block - 1));
  }
}

std::vector<LogitsRows> Scheduler::verify(const std::vector<Request*>& rows) {
  std::vector<int64_t> slots;
  std::vector<std::vector<int64_t>> blocks;
  for (Request* r : rows) {
    std::vector<int64_t> block{r->tokens.back()};
    block.insert(block.end(), r->drafts.begin(), r->drafts.end());
    slots_.reserve(r->slot, int64_t(block.size()));
    slots.push_back(r->slot);
    blocks.push_back(std::move(block));
  }
  std::vector<LogitsRows> logits = executor_.verify(slots, blocks);
  DFLASH_INVARIANT(logits.size() == rows.size());
  for (size_t i = 0; i < rows.size(); ++i)
    if (logits[i].rows != int64_t(blocks[i].size()))
      throw Error("executor verify returned " + std::to_string(logits[i].rows) + " logits rows for slot " +
                  std::to_string(rows[i]->slot) + "; expected one per block token (" +
                  std::to_string(blocks[i].size()) + ")");
  return logits;
}

void Scheduler::accept(const std::vector<Request*>& rows, const std::vector<LogitsRows>& logits) {
  for (size_t i = 0; i < rows.size(); ++i) {
    Request& r = *rows[i];
    // drafts[0] sits one after the bonus, whose position is the committed length.
    const uint32_t position = uint32_t(slots_.length(r.slot) + 1);
    const Acceptance a = dflash::accept(r.drafts.data(), int64_t(r.drafts.size()), logits[i].data.data(),
                                        logits[i].vocab, r.params.sampling, r.stream, position);
    r.accepted = a.accepted;
    r.next = a.next;
    if (!r.drafts.empty()) r.metrics.record(int64_t(r.drafts.size()), a.accepted);
  }
}

void Scheduler::commit(const std::vector<Request*>& rows) {
  std::vector<int64_t> slots, kept;
  for (Request* r : rows) {
    slots.push_back(r->slot);
    kept.push_back(r->accepted + 1);  // the bonus and the accepted drafts stay in the cache
  }
  executor_.commit(slots, kept);
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
  for (int64_t token : tokens) {
    r.tokens.push_back(token);
    o.new_tokens.push_back(token);
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
  o.num_tokens = int64_t(r.tokens.size());
  o.metrics = r.metrics;
  if (o.finish != Finish::kNone) finish(r, o.finish);
  out.push_back(std::move(o));
}

// -- bookkeeping --------------------------------------------------------------------------------

void Scheduler::finish(Request& r, Finish why) {
  DFLASH_INVARIANT(why != Finish::kNone && r.finish == Finish::kNone);
  r.finish = why;
  if (slots_.reserved(r.slot)) slots_.rollback(r.slot);
  slots_.free(r.slot);
  executor_.release(r.slot);
}

void Scheduler::rollback_reserved() {
  for (Request& r : live_)
    if (r.finish == Finish::kNone && slots_.reserved(r.slot)) slots_.rollback(r.slot);
}

}  // namespace dflash

// slots.cpp: bookkeeping for fixed-capacity KV slots; every mutation re-checks the slot's invariants.
#include "slots.h"

#include <string>

#include "errors.h"

namespace dflash {

SlotAllocator::SlotAllocator(int64_t num_slots, int64_t capacity) : capacity_(capacity) {
  if (num_slots < 1) throw Error("KV slots: need at least 1 slot, got " + std::to_string(num_slots));
  if (capacity < 1) throw Error("KV slots: capacity must be at least 1 token, got " + std::to_string(capacity));
  slots_.resize(num_slots);
}

void SlotAllocator::check_fits(int64_t request, int64_t prompt_tokens, int64_t max_tokens) const {
  if (request < 0) throw Error("request id must be >= 0, got " + std::to_string(request));
  if (prompt_tokens < 1 || max_tokens < 1)
    throw Error("request " + std::to_string(request) + ": prompt and max_tokens must each be at least 1 token");
  const int64_t need = prompt_tokens + max_tokens;
  if (need > capacity_)
    throw Error("request " + std::to_string(request) + " needs " + std::to_string(need) + " tokens (prompt " +
                std::to_string(prompt_tokens) + " + max_tokens " + std::to_string(max_tokens) +
                ") but a KV slot holds " + std::to_string(capacity_) +
                "; shorten the prompt, lower max_tokens or raise the slot capacity");
}

int64_t SlotAllocator::allocate(int64_t request, int64_t prompt_tokens, int64_t max_tokens) {
  int64_t found = 0;
  while (found < num_slots() && slots_[found].request >= 0) ++found;
  if (found == num_slots()) {
    check_fits(request, prompt_tokens, max_tokens);
    throw Error("no free KV slot for request " + std::to_string(request) + " (all " +
                std::to_string(num_slots()) + " in use); wait for a request to finish or raise max_batch");
  }
  return allocate_at(found, request, prompt_tokens, max_tokens, 0);
}

int64_t SlotAllocator::allocate_at(int64_t slot, int64_t request, int64_t prompt_tokens, int64_t max_tokens,
                                   int64_t held) {
  check_fits(request, prompt_tokens, max_tokens);
  for (int64_t i = 0; i < num_slots(); ++i)
    if (slots_[i].request == request)
      throw Error("request " + std::to_string(request) + " already holds KV slot " + std::to_string(i));
  DFLASH_INVARIANT(slot >= 0 && slot < num_slots() && slots_[slot].request < 0);
  // the request prefills at least its last prompt token (its first output comes from that position)
  DFLASH_INVARIANT(held >= 0 && held < prompt_tokens);
  Slot& s = slots_[slot];
  DFLASH_INVARIANT(s.length == 0 && s.reserved == 0);
  s.request = request;
  s.length = held;
  check(s);
  return slot;
}

void SlotAllocator::free(int64_t slot) {
  Slot& s = owned(slot);
  s = Slot{};
}

void SlotAllocator::reserve(int64_t slot, int64_t n) {
  Slot& s = owned(slot);
  // The scheduler sizes blocks to the room left; asking for more is its bug, not the user's.
  DFLASH_INVARIANT(s.reserved == 0 && n >= 1 && s.length + n <= capacity_);
  s.reserved = n;
  check(s);
}

void SlotAllocator::commit(int64_t slot, int64_t keep) {
  Slot& s = owned(slot);
  DFLASH_INVARIANT(keep >= 0 && keep <= s.reserved);
  s.length += keep;
  s.reserved = 0;
  check(s);
}

void SlotAllocator::rollback(int64_t slot) { commit(slot, 0); }

int64_t SlotAllocator::length(int64_t slot) const { return owned(slot).length; }
int64_t SlotAllocator::reserved(int64_t slot) const { return owned(slot).reserved; }

int64_t SlotAllocator::request(int64_t slot) const {
  DFLASH_INVARIANT(slot >= 0 && slot < num_slots());
  return slots_[slot].request;
}

int64_t SlotAllocator::num_free() const {
  int64_t n = 0;
  for (const Slot& s : slots_) n += s.request < 0;
  return n;
}

SlotAllocator::Slot& SlotAllocator::owned(int64_t slot) {
  return const_cast<Slot&>(static_cast<const SlotAllocator*>(this)->owned(slot));
}

const SlotAllocator::Slot& SlotAllocator::owned(int64_t slot) const {
  DFLASH_INVARIANT(slot >= 0 && slot < num_slots());
  DFLASH_INVARIANT(slots_[slot].request >= 0);  // a free slot has no length to read or move
  return slots_[slot];
}

void SlotAllocator::check(const Slot& s) const {
  DFLASH_INVARIANT(s.length >= 0 && s.reserved >= 0 && s.length + s.reserved <= capacity_);
  DFLASH_INVARIANT(s.request >= 0 || (s.length == 0 && s.reserved == 0));
}

}  // namespace dflash

// slots.h: the KV slot allocator. A fixed number of slots, each a fixed-capacity region of every
// KV buffer (graph contract v2); a request owns one slot from admission to finish or abort.
//
// The cache contents live in the executors' buffers; this class only keeps the books: which
// request owns which slot and how many of its positions hold committed tokens. Rollback is moving
// a length, never copying a cache. Per slot the life is:
//   allocate -> (reserve n -> the executor writes n positions -> commit keep | rollback)* -> free
#pragma once

#include <cstdint>
#include <vector>

namespace dflash {

class SlotAllocator {
 public:
  SlotAllocator(int64_t num_slots, int64_t capacity);

  // Admit a request needing room for prompt_tokens + max_tokens positions. Returns the lowest free
  // slot (so the allocator's state is a function of which slots are in use, not of history).
  // Throws dflash::Error, one line, when the request can never fit or no slot is free.
  int64_t allocate(int64_t request, int64_t prompt_tokens, int64_t max_tokens);
  // Admit into a given free slot whose first `held` positions the request reuses (prefix reuse):
  // they count as committed.
  int64_t allocate_at(int64_t slot, int64_t request, int64_t prompt_tokens, int64_t max_tokens, int64_t held);
  // The first half of allocate: throws the same one line when the request can never fit a slot
  // (empty prompt, prompt + max_tokens over the capacity), whatever is free now.
  void check_fits(int64_t request, int64_t prompt_tokens, int64_t max_tokens) const;
  // Give the slot back at once (finish or abort); its length returns to 0.
  void free(int64_t slot);

  // Claim n positions after the committed length for the executor to write (a verify block).
  void reserve(int64_t slot, int64_t n);
  // Keep the first `keep` reserved positions (keep <= reserved); the rest are dropped.
  void commit(int64_t slot, int64_t keep);
  // Drop everything reserved.
  void rollback(int64_t slot);

  int64_t length(int64_t slot) const;    // committed positions
  int64_t reserved(int64_t slot) const;  // positions claimed by the step in flight
  int64_t request(int64_t slot) const;   // owner, or -1 when free
  int64_t num_slots() const { return int64_t(slots_.size()); }
  int64_t capacity() const { return capacity_; }
  int64_t num_free() const;

 private:
  struct Slot {
    int64_t request = -1;  // -1: free
    int64_t length = 0;
    int64_t reserved = 0;
  };
  Slot& owned(int64_t slot);
  const Slot& owned(int64_t slot) const;
  void check(const Slot& s) const;

  int64_t capacity_;
  std::vector<Slot> slots_;
};

}  // namespace dflash

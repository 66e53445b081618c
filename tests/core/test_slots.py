"""KV slot allocator (csrc/slots.cpp): admission, exhaustion, over-capacity refusal, length moves,
and 1,000 allocate/free cycles that leave it exactly as it began."""

import random

import pytest

from dflash_trt.errors import DFlashError


def snapshot(slots):
    owners = [slots.request(i) for i in range(slots.num_slots)]
    lengths = [slots.length(i) if owners[i] >= 0 else 0 for i in range(slots.num_slots)]
    return slots.num_free, owners, lengths


def test_a_thousand_allocate_free_cycles_leave_the_allocator_as_it_began(core):
    slots = core.SlotAllocator(num_slots=8, capacity=64)
    begin = snapshot(slots)
    rng = random.Random(0)
    live = {}  # request -> slot
    next_request = 0
    for _ in range(1000):
        if live and (len(live) == 8 or rng.random() < 0.5):
            request = rng.choice(sorted(live))
            slots.free(live.pop(request))
        else:
            slot = slots.allocate(next_request, prompt_tokens=rng.randint(1, 32), max_tokens=rng.randint(1, 32))
            assert slot not in live.values() and slots.request(slot) == next_request
            live[next_request] = slot
            next_request += 1
            slots.reserve(slot, rng.randint(1, 16))
            slots.commit(slot, rng.randint(0, slots.reserved(slot)))
        assert slots.num_free == 8 - len(live)
    for slot in list(live.values()):
        slots.free(slot)
    assert snapshot(slots) == begin
    assert slots.allocate(10**6, 1, 1) == 0, "the lowest free slot is handed out first"


def test_exhaustion_is_a_one_line_error_and_a_freed_slot_is_reusable_at_once(core):
    slots = core.SlotAllocator(num_slots=2, capacity=16)
    assert [slots.allocate(0, 4, 4), slots.allocate(1, 4, 4)] == [0, 1]
    with pytest.raises(DFlashError, match=r"no free KV slot for request 2 \(all 2 in use\)") as err:
        slots.allocate(2, 4, 4)
    assert "\n" not in str(err.value)
    slots.free(0)  # an abort: the slot is free at once
    assert slots.allocate(2, 4, 4) == 0


def test_a_request_over_capacity_is_refused_with_one_line_and_the_others_continue(core):
    slots = core.SlotAllocator(num_slots=2, capacity=100)
    kept = slots.allocate(0, 10, 10)
    with pytest.raises(DFlashError) as err:
        slots.allocate(1, prompt_tokens=80, max_tokens=30)
    message = str(err.value)
    assert "\n" not in message
    assert "request 1 needs 110 tokens (prompt 80 + max_tokens 30)" in message and "holds 100" in message
    assert slots.num_free == 1 and slots.request(kept) == 0
    assert slots.allocate(1, prompt_tokens=70, max_tokens=30) == 1  # exactly full fits


def test_reserve_commit_rollback_move_a_length(core):
    slots = core.SlotAllocator(num_slots=1, capacity=20)
    slot = slots.allocate(5, 4, 16)
    slots.reserve(slot, 4)  # the prompt
    slots.commit(slot, 4)
    slots.reserve(slot, 8)  # a verify block of 8
    slots.commit(slot, 3)  # 2 drafts accepted + the bonus slot
    assert (slots.length(slot), slots.reserved(slot)) == (7, 0)
    slots.reserve(slot, 8)
    slots.rollback(slot)
    assert (slots.length(slot), slots.reserved(slot)) == (7, 0)


def test_broken_invariants_raise_assertion_errors_not_crashes(core):
    slots = core.SlotAllocator(num_slots=2, capacity=10)
    slot = slots.allocate(0, 2, 2)
    slots.reserve(slot, 3)
    with pytest.raises(AssertionError, match="invariant failed"):
        slots.commit(slot, 4)  # keeps more than was reserved
    with pytest.raises(AssertionError):
        slots.reserve(slot, 1)  # a step is already in flight
    slots.rollback(slot)
    with pytest.raises(AssertionError):
        slots.reserve(slot, 11)  # past the capacity
    with pytest.raises(AssertionError):
        slots.free(1)  # never allocated
    with pytest.raises(AssertionError):
        slots.length(2)  # no such slot


@pytest.mark.parametrize("args, match", [
    ((0, 10), "at least 1 slot"),
    ((2, 0), "capacity must be at least 1"),
])
def test_bad_allocator_shapes_are_refused(core, args, match):
    with pytest.raises(DFlashError, match=match):
        core.SlotAllocator(*args)


def test_a_request_id_holds_at_most_one_slot(core):
    slots = core.SlotAllocator(num_slots=3, capacity=10)
    slots.allocate(4, 1, 1)
    with pytest.raises(DFlashError, match="request 4 already holds KV slot 0"):
        slots.allocate(4, 1, 1)

"""Prefix reuse in the core (SchedulerConfig.prefix_reuse): a finished request's KV slot keeps what its
caches hold, and a request whose prompt starts with those tokens takes that slot and prefills only the
rest. Over tiny `slots` bundles on the onnxruntime executor, against the torch reference: a request
on a reused prefix gives its own autoregressive output token for token (attention-only, sliding-window
and hybrid targets; partial and whole matches; after retained rows moved between places, were
forgotten, or came from an abort), and a hybrid target reuses only all of a slot (its states exist
only after the last kept position)."""

import pytest
from factories import make_drafter, make_target
from scheduler_checks import python_loop

from dflash_trt.export.bundle import export_bundle
from dflash_trt.models.checkpoints import load_drafter, load_target

KINDS = {  # name -> target family and config; every target over 6 tokens (MASK is 5): drafts get accepted
    "dense": ("qwen3", {}),
    "sliding-window": ("qwen3", dict(use_sliding_window=True, sliding_window=3, max_window_layers=2)),
    "hybrid": ("qwen3_5_text", {}),
}


@pytest.fixture(scope="module", params=list(KINDS))
def pair(ort, request, tmp_path_factory):
    """(kind, slots bundle, TargetModel, DFlashDrafter)."""
    family, config = KINDS[request.param]
    root = tmp_path_factory.mktemp(request.param)
    target_dir = make_target(root / "target", family, seed=5, tokenizer=False, vocab_size=6, **config)
    draft_dir = make_drafter(root / "draft", seed=5, block_size=4, target_layer_ids=[1, 2], mask_token_id=5)
    target, _ = load_target(str(target_dir))
    drafter = load_drafter(draft_dir)
    bundle = export_bundle(target, drafter, None, root / "bundle", flavour="slots", check=False)
    return request.param, bundle, target, drafter


def scheduler(core, ort, bundle, max_batch, prefix_reuse=True, capacity=64, prefix_wait_tokens=128, max_waiting=-1):
    executor = ort.ort_executor(bundle, max_batch=max_batch, capacity=capacity)
    config = core.SchedulerConfig(max_batch=max_batch, capacity=capacity, block_size=4, engine_seed=0,
                                  prefix_reuse=prefix_reuse, prefix_wait_tokens=prefix_wait_tokens,
                                  max_waiting=max_waiting)
    return core.Scheduler(executor, config), executor


def run(core, sched, prompts, max_tokens=10, max_block=0):
    """Add `prompts` at once, step until they finish -> [(tokens, cached_tokens, slot)] in order."""
    params = core.RequestParams(max_tokens=max_tokens, ignore_eos=True, max_block=max_block)
    ids = [sched.add_request(p, params) for p in prompts]
    slots = {i: next(s for s in range(sched.slots.num_slots) if sched.slots.request(s) == i)
             for i in ids if any(sched.slots.request(s) == i for s in range(sched.slots.num_slots))}
    tokens, cached = {i: [] for i in ids}, {}
    while sched.has_work:
        for out in sched.step():
            tokens[out["request"]] += out["new_tokens"]
            cached[out["request"]] = out["cached_tokens"]
    return [(tokens[i], cached[i], slots.get(i)) for i in ids]


def reference(pair, prompt, max_tokens=10):
    _, _, target, drafter = pair
    return python_loop(target, drafter, prompt, max_tokens, 1)[0]  # autoregressive


def test_a_later_turn_prefills_only_what_the_slot_did_not_hold(core, ort, pair):
    """Request A runs alone; B's prompt is A's prompt, A's reply and two more tokens (a chat's next
    turn): B takes A's slot with every position A committed (its prompt and all of its reply but the
    last token, never fed) and prefills only the rest; both equal their autoregressive outputs."""
    sched, executor = scheduler(core, ort, pair[1], 2)
    prompt_a = [1, 2, 3, 4, 0, 1, 2, 3]
    ((reply_a, cached_a, slot),) = run(core, sched, [prompt_a])
    assert reply_a == reference(pair, prompt_a) and cached_a == 0
    committed = len(prompt_a) + len(reply_a) - 1
    assert executor.retained(slot) == committed and executor.live_rows == []
    prompt_b = prompt_a + reply_a + [4, 1]
    sched.add_request(prompt_b, core.RequestParams(max_tokens=10, ignore_eos=True))
    assert sched.slots.request(slot) >= 0 and sched.slots.length(slot) == committed  # counted as committed
    assert executor.committed(slot) == committed and executor.retained(slot) == 0  # reopened: live again
    tokens, cached = [], None
    while sched.has_work:
        for out in sched.step():
            tokens += out["new_tokens"]
            cached = out["cached_tokens"]
    assert cached == committed and tokens == reference(pair, prompt_b)
    stats = sched.stats()
    assert (stats["prompt_tokens"], stats["cached_tokens"]) == (len(prompt_a) + len(prompt_b), committed)


def test_a_prompt_sharing_only_a_head_reuses_that_head_on_attention_targets(core, ort, pair):
    """B shares A's first 5 prompt tokens, C is a prefix of A's kept tokens (all but its last token can
    be reused: the first output comes from prefilling at least one): attention targets reuse exactly
    those; a hybrid target reuses nothing (its states are those after all of A's positions)."""
    kind = pair[0]
    sched, executor = scheduler(core, ort, pair[1], 1)
    prompt_a = [1, 2, 3, 4, 0, 1, 2, 3]
    run(core, sched, [prompt_a])
    prompt_b = prompt_a[:5] + [4, 4, 0]
    ((tokens_b, cached_b, _),) = run(core, sched, [prompt_b])
    assert tokens_b == reference(pair, prompt_b)
    assert cached_b == (0 if kind == "hybrid" else 5)
    prompt_c = prompt_b[:6]
    ((tokens_c, cached_c, _),) = run(core, sched, [prompt_c])
    assert tokens_c == reference(pair, prompt_c)
    assert cached_c == (0 if kind == "hybrid" else 5)


def test_retained_slots_move_up_for_live_rows_and_the_oldest_is_forgotten_first(core, ort, pair):
    """Two slots, requests one after another: each new request without a match takes a slot that
    keeps nothing, else the one released longest ago, and moves what the other slot keeps out of the
    lowest place (where a starting row goes); a later request on the newest kept tokens still finds
    them, in the other place, and equals its autoregressive output."""
    sched, executor = scheduler(core, ort, pair[1], 2)
    first, second, third = [1, 1, 2], [3, 3, 4, 0], [4, 2, 2, 1, 0]
    ((_, _, slot_1),) = run(core, sched, [first])
    ((reply_2, _, slot_2),) = run(core, sched, [second])
    assert (slot_1, slot_2) == (0, 1)  # slot 1 kept nothing: slot 0's tokens stay
    assert executor.retained_place(0) == 1 and executor.retained_place(1) == 0  # slot 0's moved up for slot 1
    ((_, cached_3, slot_3),) = run(core, sched, [third])
    assert (slot_3, cached_3) == (0, 0)  # released longer ago than slot 1: forgotten
    assert executor.retained_place(1) == 1 and executor.retained(0) == len(third) + 9
    again = second + reply_2 + [2]
    ((tokens, cached, slot),) = run(core, sched, [again])
    assert slot == 1 and cached == len(second) + len(reply_2) - 1
    assert tokens == reference(pair, again)


def test_a_retained_slot_changes_places_with_a_live_row_and_keeps_its_tokens(core, ort, pair):
    """Two slots, both running: the one that finishes first changes places with the other's live row
    (which needs the lowest place; no place is free) and keeps its tokens, and so does the second; a
    request continuing the second's reuses it, and an abort keeps what was committed too."""
    sched, executor = scheduler(core, ort, pair[1], 2)
    short, long = [1, 2, 3], [2, 3, 4, 1, 0]
    ids = [sched.add_request(short, core.RequestParams(max_tokens=3, ignore_eos=True)),
           sched.add_request(long, core.RequestParams(max_tokens=12, ignore_eos=True))]
    tokens, seen = {i: [] for i in ids}, []
    while sched.has_work:
        for out in sched.step():
            tokens[out["request"]] += out["new_tokens"]
        if sched.num_running == 1:
            seen.append((executor.retained(0), executor.place(1)))
    assert set(seen) == {(len(short) + 2, 0)}  # kept, above the live row
    assert tokens[ids[1]] == reference(pair, long, 12)
    kept = len(long) + 11
    assert executor.retained(1) == kept
    again = long + tokens[ids[1]][:11] + [3]  # all it kept, and one more token
    request = sched.add_request(again, core.RequestParams(max_tokens=10, ignore_eos=True))
    assert sched.slots.request(1) == request and sched.slots.length(1) == kept
    assert executor.retained(0) == len(short) + 2
    sched.step()  # prefills the one token
    assert sched.abort(request) and executor.retained(1) == len(again)
    sched.step()  # the abort's output
    ((tokens_again, cached, slot),) = run(core, sched, [again + [2]])
    assert slot == 1 and cached == len(again)
    assert tokens_again == reference(pair, again + [2])
    turn = short + tokens[ids[0]][:2] + [1]  # what the swapped-up slot kept, and one more token
    ((tokens_turn, cached, slot),) = run(core, sched, [turn])
    assert slot == 0 and cached == len(turn) - 1 and tokens_turn == reference(pair, turn)


def test_requests_finishing_in_one_step_all_keep_their_tokens(core, ort, pair):
    """Both slots' requests finish in the same step (plain decoding: a token a step each): neither has
    to make room for a live row, so both keep their tokens, and each next turn reuses all of its own."""
    sched, executor = scheduler(core, ort, pair[1], 2)
    prompts = [[1, 2, 3, 4], [2, 2, 0, 1]]
    firsts = run(core, sched, prompts, max_block=1)
    assert [executor.retained(slot) for _, _, slot in firsts] == [len(p) + 9 for p in prompts]
    turns = [p + reply + [3] for p, (reply, _, _) in zip(prompts, firsts, strict=True)]
    for (tokens, cached, _), turn in zip(run(core, sched, turns), turns, strict=True):
        assert cached == len(turn) - 2 and tokens == reference(pair, turn)


def test_a_shared_head_is_copied_into_another_slot_and_the_first_keeps_all_it_held(core, ort, pair):
    """B shares only A's head: it takes a slot keeping nothing and A's head is copied there (attention
    targets; a hybrid target cannot start mid-slot), so A's slot still holds its whole turn for A's next
    one."""
    kind = pair[0]
    sched, executor = scheduler(core, ort, pair[1], 3)
    head = [1, 2, 3, 4, 0, 1]
    ((reply_a, _, slot_a),) = run(core, sched, [head + [2, 2]])
    ((tokens_b, cached_b, slot_b),) = run(core, sched, [head + [4, 4, 3]])
    assert slot_b != slot_a and cached_b == (0 if kind == "hybrid" else len(head))
    assert tokens_b == reference(pair, head + [4, 4, 3])
    turn = head + [2, 2] + reply_a + [0]
    ((tokens, cached, slot),) = run(core, sched, [turn])
    assert slot == slot_a and cached == len(turn) - 2 and tokens == reference(pair, turn)


def test_a_partial_head_takes_its_own_slot_when_that_loses_less_than_another(core, ort, pair):
    """Both slots keep a finished turn. C shares all but the last two of A's kept tokens: taking A's slot
    loses those two, taking B's would lose all of B's, so C takes A's (a hybrid target reuses nothing
    mid-slot and takes the slot released longest ago: A's too); B's next turn still finds all of B's."""
    kind = pair[0]
    sched, executor = scheduler(core, ort, pair[1], 2)
    prompt_a, prompt_b = [1, 2, 3, 4, 0, 1, 2, 3], [4, 4, 3, 2, 0, 0, 1]
    ((reply_a, _, slot_a),) = run(core, sched, [prompt_a])
    ((reply_b, _, slot_b),) = run(core, sched, [prompt_b])
    kept_a = prompt_a + reply_a[:-1]
    partial = kept_a[:-2] + [(kept_a[-2] + 1) % 5]
    ((tokens_c, cached_c, slot_c),) = run(core, sched, [partial])
    assert slot_c == slot_a and cached_c == (0 if kind == "hybrid" else len(kept_a) - 2)
    assert tokens_c == reference(pair, partial)
    turn = prompt_b + reply_b + [2]
    ((tokens, cached, slot),) = run(core, sched, [turn])
    assert slot == slot_b and cached == len(prompt_b) + len(reply_b) - 1 and tokens == reference(pair, turn)


def test_a_request_starts_on_a_running_requests_positions(core, ort, pair):
    """A runs; B's prompt is what A's slot holds so far and one more token: B's slot gets A's positions
    (and a hybrid target's states, since B continues all of them) copied while A decodes on, and both
    equal their autoregressive outputs."""
    sched, executor = scheduler(core, ort, pair[1], 2)
    prompt_a = [3, 1, 4, 1, 0, 2]
    a = sched.add_request(prompt_a, core.RequestParams(max_tokens=20, ignore_eos=True))
    tokens = {a: []}
    for _ in range(3):
        for out in sched.step():
            tokens[out["request"]] += out["new_tokens"]
    turn = prompt_a + tokens[a][:-1] + [2]  # A's last token is not in its cache yet
    b = sched.add_request(turn, core.RequestParams(max_tokens=10, ignore_eos=True))
    tokens[b], cached = [], None
    while sched.has_work:
        for out in sched.step():
            tokens[out["request"]] += out["new_tokens"]
            if out["request"] == b:
                cached = out["cached_tokens"]
    assert cached == len(turn) - 1
    assert tokens[a] == reference(pair, prompt_a, 20) and tokens[b] == reference(pair, turn)


@pytest.mark.parametrize("wait_tokens", [4, 9, 10, 0])
def test_requests_sharing_a_long_head_with_one_still_prefilling_wait_for_its_prefill(core, ort, pair, wait_tokens):
    """Three requests sent at once (n choices of one prompt, then one sharing 8 tokens): the first
    prefills; where the others would reuse at least prefix_wait_tokens more of their prompts after it
    (9 and 8 tokens here), they wait one step and start on its positions; a hybrid target (whole rows
    only) and a larger threshold never wait. Every output equals its autoregressive one."""
    kind = pair[0]
    sched, _ = scheduler(core, ort, pair[1], 4, prefix_wait_tokens=wait_tokens)
    prompt = [1, 2, 3, 4, 0, 1, 2, 3, 4, 0]
    prompts = [prompt, prompt, prompt[:8] + [2, 1]]
    params = core.RequestParams(max_tokens=8, ignore_eos=True)
    ids = [sched.add_request(p, params) for p in prompts]
    waits = kind != "hybrid" and 0 < wait_tokens <= 9
    assert sched.num_waiting == (2 if waits else 0)
    tokens, cached = {i: [] for i in ids}, {}
    while sched.has_work:
        for out in sched.step():
            tokens[out["request"]] += out["new_tokens"]
            cached[out["request"]] = out["cached_tokens"]
    assert [cached[i] for i in ids] == ([0, 9, 8] if waits else [0, 0, 0])
    assert [tokens[i] for i in ids] == [reference(pair, p, 8) for p in prompts]


def test_a_request_waiting_for_a_prefill_holds_a_free_slot_not_a_place_in_a_full_queue(core, ort, pair):
    """max_waiting 0 refuses requests beyond the free slots; one waiting for another's prefill keeps a
    slot free for itself, so the next request, with slots still free, is taken, not refused (a hybrid
    target never waits: each takes a slot at once)."""
    sched, _ = scheduler(core, ort, pair[1], 3, prefix_wait_tokens=4, max_waiting=0)
    prompt = [1, 2, 3, 4, 0, 1, 2, 3]
    params = core.RequestParams(max_tokens=4, ignore_eos=True)
    sched.add_request(prompt, params)
    sched.add_request(prompt, params)
    waits = pair[0] != "hybrid"
    assert (sched.num_waiting, sched.slots.num_free) == ((1, 2) if waits else (0, 1))
    sched.add_request(prompt, params)  # queued behind it, with a slot for each
    with pytest.raises(Exception, match="waiting queue is full"):
        sched.add_request(prompt, params)  # a fourth has no slot
    while sched.has_work:
        sched.step()


@pytest.mark.parametrize("source_live", [False, True])
def test_a_reopened_row_gives_a_fresh_prefills_logits(ort, pair, source_live):
    """The executor alone: row 1 reopened on row 0's first positions (copied; row 0 released or still
    live) then prefilled with the rest gives the logits of prefilling the whole prompt on a fresh
    executor; reopened on itself after a release, the same."""
    import numpy as np

    kind, bundle = pair[0], pair[1]
    first, rest = [1, 2, 3, 4, 0, 1, 2], [4, 3]
    n = len(first) if kind == "hybrid" else 5  # a hybrid row starts only on all of a row's positions
    prompt = first[:n] + rest
    fresh = ort.ort_executor(bundle, max_batch=2, capacity=64).prefill_logits([0], [prompt])[0]
    executor = ort.ort_executor(bundle, max_batch=3, capacity=64)
    executor.keep_released(True)
    executor.prefill_logits([2], [[3, 3, 3]])  # a row in place 0: row 0 takes place 1
    executor.prefill_logits([0], [first])
    if not source_live:
        executor.release(0)
        assert executor.retained(0) == len(first)
    assert executor.reusable(0, n) == n and executor.reusable(0, n - 1) == (0 if kind == "hybrid" else n - 1)
    executor.reopen(1, 0, n)
    assert executor.committed(1) == n
    np.testing.assert_allclose(executor.prefill_logits([1], [rest])[0], fresh, rtol=1e-5, atol=1e-5)
    if not source_live:  # and on itself: the rows it kept, moved between places as others came and went
        executor.release(1)
        executor.reopen(0, 0, n)
        np.testing.assert_allclose(executor.prefill_logits([0], [rest])[0], fresh, rtol=1e-5, atol=1e-5)


def test_without_prefix_reuse_nothing_is_kept(core, ort, pair):
    sched, executor = scheduler(core, ort, pair[1], 2, prefix_reuse=False)
    prompt = [1, 2, 3, 4]
    ((reply, _, slot),) = run(core, sched, [prompt])
    assert executor.retained(slot) == 0
    ((tokens, cached, _),) = run(core, sched, [prompt + reply])
    assert cached == 0 and tokens == reference(pair, prompt + reply)

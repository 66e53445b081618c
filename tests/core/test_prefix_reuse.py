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


def scheduler(core, ort, bundle, max_batch, prefix_reuse=True, capacity=64):
    executor = ort.ort_executor(bundle, max_batch=max_batch, capacity=capacity)
    config = core.SchedulerConfig(max_batch=max_batch, capacity=capacity, block_size=4, engine_seed=0,
                                  prefix_reuse=prefix_reuse)
    return core.Scheduler(executor, config), executor


def run(core, sched, prompts, max_tokens=10):
    """Add `prompts` at once, step until they finish -> [(tokens, cached_tokens, slot)] in order."""
    ids = [sched.add_request(p, core.RequestParams(max_tokens=max_tokens, ignore_eos=True)) for p in prompts]
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


def test_a_retained_slot_gives_its_place_to_live_rows_and_is_forgotten_when_none_is_free(core, ort, pair):
    """Two slots, both running: the one that finishes first cannot stay (the other's live row needs
    the lowest place and no place is free), the second keeps its tokens; a request on them reuses them
    though a lower slot is free, and an abort keeps what was committed too."""
    sched, executor = scheduler(core, ort, pair[1], 2)
    short, long = [1, 2, 3], [2, 3, 4, 1, 0]
    ids = [sched.add_request(short, core.RequestParams(max_tokens=3, ignore_eos=True)),
           sched.add_request(long, core.RequestParams(max_tokens=12, ignore_eos=True))]
    tokens = {i: [] for i in ids}
    while sched.has_work:
        for out in sched.step():
            tokens[out["request"]] += out["new_tokens"]
        if sched.num_running == 1:
            assert executor.retained(0) == 0 and executor.place(1) == 0
    assert tokens[ids[1]] == reference(pair, long, 12)
    kept = len(long) + 11
    assert executor.retained(1) == kept
    again = long + tokens[ids[1]][:11] + [3]  # all it kept, and one more token
    request = sched.add_request(again, core.RequestParams(max_tokens=10, ignore_eos=True))
    assert sched.slots.request(1) == request and sched.slots.length(1) == kept  # slot 0, lower, keeps nothing
    sched.step()  # prefills the one token
    assert sched.abort(request) and executor.retained(1) == len(again)
    sched.step()  # the abort's output
    ((tokens_again, cached, slot),) = run(core, sched, [again + [2]])
    assert slot == 1 and cached == len(again)
    assert tokens_again == reference(pair, again + [2])


def test_without_prefix_reuse_nothing_is_kept(core, ort, pair):
    sched, executor = scheduler(core, ort, pair[1], 2, prefix_reuse=False)
    prompt = [1, 2, 3, 4]
    ((reply, _, slot),) = run(core, sched, [prompt])
    assert executor.retained(slot) == 0
    ((tokens, cached, _),) = run(core, sched, [prompt + reply])
    assert cached == 0 and tokens == reference(pair, prompt + reply)

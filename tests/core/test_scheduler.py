"""The core's scheduler (csrc/scheduler.cpp) over the torch backend's slot executor (runtime/torch_graphs.py),
against the oracle: every request's greedy output equals its own autoregressive output from the
Python reference loop (tests/reference.py, plain decoding), whatever else is in the batch and whenever
it arrived. Adaptive speculation is on unless a test pins the block size."""

import random

import pytest
from scheduler_checks import autoregressive, drive, reference, workload

from dflash_trt import SamplingParams
from dflash_trt.errors import DFlashError
from dflash_trt.runtime.native import native_core


@pytest.mark.parametrize("name", ["qwen3", "llama", "small_vocab"])
@pytest.mark.parametrize("concurrency", [1, 3, 8])
def test_greedy_equals_each_requests_autoregressive_output(runner_module, llms, name, concurrency):
    llm = llms[name]
    work = workload(llm.vocab_size, 8 if concurrency > 1 else 4, seed=concurrency)
    # The small pair pins its block so that speculation surely happens (adaptive may pick B = 1 for a
    # drafter that is rarely right); the random pairs run adaptive.
    pinned = llm.block_size if name == "small_vocab" else None
    engine = runner_module.BatchRunner(llm, max_batch=concurrency, capacity=64, block_size=pinned)
    outputs = drive(engine, work)
    for (_, prompt, params), out in zip(work, outputs, strict=True):
        ref = autoregressive(llm, name, prompt, params)
        assert out.token_ids == ref.token_ids, (prompt, params)
        assert out.finish_reason == ref.finish_reason
    assert engine.slots.num_free == concurrency and not engine.executor.live_rows
    if name == "small_vocab":  # speculation really happened: drafts were made and some accepted
        drafts = sum(o.core_metrics["num_drafts"] for o in outputs)
        accepted = sum(o.core_metrics["num_accepted_tokens"] for o in outputs)
        assert drafts > 0 and accepted > 0


def test_plain_decoding_through_the_core_equals_autoregressive(runner_module, llms):
    llm = llms["qwen3"]
    work = workload(llm.vocab_size, 5, seed=11)
    engine = runner_module.BatchRunner(llm, max_batch=3, capacity=64, speculative=False)
    for (_, prompt, params), out in zip(work, drive(engine, work), strict=True):
        assert out.token_ids == autoregressive(llm, "qwen3", prompt, params).token_ids
        assert out.core_metrics["num_drafts"] == 0


def test_greedy_equals_the_python_speculative_loop(runner_module, llms):
    llm = llms["small_vocab"]
    params = SamplingParams(max_tokens=30, ignore_eos=True)
    prompts = [[1, 2, 3], [4, 0, 4, 0, 1, 1, 2]]
    engine = runner_module.BatchRunner(llm, max_batch=2, capacity=64, block_size=llm.block_size)  # pinned
    assert not engine.core_stats()["adaptive"]
    ids = [engine.add(p, params) for p in prompts]
    taus = {i: [] for i in ids}  # acceptance length per verify step while the block was not cut short
    while engine.has_work:
        before = {
            i: (
                len(i.token_ids),
                i.core_metrics.get("num_drafts", 0),
                i.core_metrics.get("num_accepted_tokens", 0),
            )
            for i in ids
        }
        engine.step()
        for i in ids:
            emitted, drafts, accepted = before[i]
            m = i.core_metrics
            if m["num_drafts"] > drafts and params.max_tokens - emitted >= llm.block_size:
                taus[i].append(m["num_accepted_tokens"] - accepted + 1)
    for i, prompt in zip(ids, prompts, strict=True):
        ref = reference(llm, "small_vocab", prompt, params, speculative=True)
        assert i.token_ids == ref.token_ids
        # the same drafts step for step: the executor hands the drafter the same features as the loop
        assert taus[i] == ref.metrics.acceptance_lengths[: len(taus[i])] and len(taus[i]) >= 5


@pytest.mark.parametrize("name", ["qwen3", "small_vocab"])
def test_seeded_sampling_is_the_same_alone_and_in_a_batch(runner_module, llms, name):
    llm = llms[name]
    top = 5 if name == "small_vocab" else llm.vocab_size
    rng = random.Random(3)
    prompts = [[rng.randrange(top) for _ in range(rng.randint(2, 12))] for _ in range(5)]
    params = [
        SamplingParams(
            max_tokens=16,
            temperature=0.9,
            top_p=0.95,
            top_k=50 if i % 2 else 0,
            seed=100 + i,
            ignore_eos=True,
        )
        for i in range(5)
    ]
    alone = [
        runner_module.BatchRunner(llm, max_batch=1, capacity=64).run([p], s)[0].token_ids
        for p, s in zip(prompts, params, strict=True)
    ]
    work = [(i, p, s) for i, (p, s) in enumerate(zip(prompts, params, strict=True))]
    batched = [o.token_ids for o in drive(runner_module.BatchRunner(llm, max_batch=4, capacity=64), work)]
    assert batched == alone
    # the seed matters (so the equality above is not vacuous)
    other = runner_module.BatchRunner(llm, max_batch=1, capacity=64).run(
        [prompts[0]], SamplingParams(max_tokens=16, temperature=0.9, top_p=0.95, seed=999, ignore_eos=True)
    )[0]
    assert other.token_ids != alone[0]


def test_abort_mid_stream_frees_the_slot_and_the_others_continue(runner_module, llms):
    llm = llms["qwen3"]
    params = SamplingParams(max_tokens=20, ignore_eos=True)
    prompts = [[5, 6, 7], [9, 8, 7, 6, 5, 4], [1, 2]]
    engine = runner_module.BatchRunner(llm, max_batch=3, capacity=64)
    ids = [engine.add(p, params) for p in prompts]
    engine.step()
    engine.step()
    assert engine.slots.num_free == 0
    victim = ids[1]
    streamed = list(victim.token_ids)
    assert 0 < len(streamed) < 20
    assert engine.abort(victim.id) is victim and victim.finish_reason == "abort"
    assert engine.slots.num_free == 1, "abort frees the slot at once"
    assert len(engine.executor.live_rows) == 2, "and the executor's row"
    assert engine.abort(victim.id) is None, "a second abort is a no-op"
    assert victim not in engine.step()  # the core's own "abort" output closes its books, unseen
    assert victim.token_ids == streamed
    # a newcomer takes the freed slot while the others run on
    late = engine.add([3, 3, 3, 3], params)
    while engine.has_work:
        engine.step()
    for request, prompt in ((ids[0], prompts[0]), (ids[2], prompts[2]), (late, [3, 3, 3, 3])):
        assert request.token_ids == autoregressive(llm, "qwen3", prompt, params).token_ids
    assert engine.slots.num_free == 3


def test_a_thousand_add_abort_cycles_leave_the_allocator_as_it_began(runner_module, llms):
    engine = runner_module.BatchRunner(llms["qwen3"], max_batch=4, capacity=64)
    slots = engine.slots

    def snapshot():
        return slots.num_free, [slots.request(i) for i in range(slots.num_slots)]

    begin = snapshot()
    rng = random.Random(0)
    live = []
    for cycle in range(1000):
        if live and (len(live) == 4 or rng.random() < 0.5):
            assert engine.abort(live.pop(rng.randrange(len(live))).id)
        else:
            prompt = [rng.randrange(200) for _ in range(rng.randint(1, 8))]
            live.append(
                engine.add(prompt, SamplingParams(max_tokens=rng.randint(2, 30), ignore_eos=True))
            )
        if cycle % 50 == 0:  # some requests get to run (and some finish on their own)
            engine.step()
            live = [r for r in live if r.finish_reason is None]
        assert slots.num_free == 4 - len(live)
    for request in live:
        engine.abort(request.id)
    while engine.has_work:
        engine.step()
    assert snapshot() == begin
    assert not engine.executor.live_rows and engine.scheduler.num_running == 0


def test_over_capacity_and_empty_prompts_are_refused_in_one_line_others_continue(runner_module, llms):
    llm = llms["qwen3"]
    params = SamplingParams(max_tokens=12, ignore_eos=True)
    engine = runner_module.BatchRunner(llm, max_batch=2, capacity=32)
    first = engine.add([4, 5, 6], params)
    engine.step()
    with pytest.raises(DFlashError) as err:
        engine.add(list(range(10, 40)), params)  # 30 + 12 > 32: the runner refuses it before the core
    assert str(err.value) == ("prompt (30 tokens) + max_tokens (12) exceeds the context capacity of 32 tokens "
                              "per request; shorten the prompt or lower max_tokens")
    with pytest.raises(DFlashError) as err:  # and the core itself, for callers that reach it directly
        engine.scheduler.add_request(list(range(10, 40)), native_core().RequestParams(max_tokens=12))
    message = str(err.value)
    assert "\n" not in message and "42 tokens" in message and "KV slot holds 32" in message
    with pytest.raises(DFlashError, match="at least 1 token"):
        engine.scheduler.add_request([], native_core().RequestParams(max_tokens=4))
    assert engine.slots.num_free == 1 and engine.scheduler.num_waiting == 0, "refused before any work"
    second = engine.add([7, 8], params)
    third = engine.add([1], params)  # every slot taken: it waits
    assert engine.scheduler.num_waiting == 1
    while engine.has_work:
        engine.step()
    for request, prompt in ((first, [4, 5, 6]), (second, [7, 8]), (third, [1])):
        assert request.token_ids == autoregressive(llm, "qwen3", prompt, params).token_ids
        assert request.finish_reason == "length"


def test_a_python_graph_error_reaches_the_caller_fails_what_ran_and_leaves_no_claim(runner_module, llms, monkeypatch):
    from dflash_trt.runtime import torch_graphs

    llm = llms["qwen3"]
    engine = runner_module.BatchRunner(llm, max_batch=2, capacity=64)
    params = SamplingParams(max_tokens=8, ignore_eos=True)
    running = engine.add([1, 2, 3], params)
    engine.step()
    call = torch_graphs.InPlaceSlotAttention.__call__

    def broken(*args):
        raise RuntimeError("attention broke")

    monkeypatch.setattr(torch_graphs.InPlaceSlotAttention, "__call__", broken)
    with pytest.raises(runner_module.StepFailed, match="attention broke") as failed:
        engine.step()
    assert isinstance(failed.value.__cause__, RuntimeError) and failed.value.requests == [running]
    assert running.finish_reason == "error" and "RuntimeError: attention broke" in running.error
    assert engine.slots.num_free == 2 and not engine.live, "no slot keeps a claim"
    monkeypatch.setattr(torch_graphs.InPlaceSlotAttention, "__call__", call)
    again = engine.add([1, 2, 3], params)  # the runner serves on; nothing of the failed step is reused
    while engine.has_work:
        engine.step()
    assert again.token_ids == autoregressive(llm, "qwen3", [1, 2, 3], params).token_ids
    assert engine.output(again).metrics.cached_tokens == 0

"""The engine: many requests at once through the C++ core, from many threads and from asyncio.

The oracle is the Python reference loop (tests/reference.py, one request alone): every request's greedy
output through the engine equals it, whatever else runs beside it."""

import asyncio
import threading
import time

import pytest
from reference import reference_output

from dflash_trt import LLM, DFlashError, SamplingParams
from dflash_trt.runtime.engine import Engine
from dflash_trt.runtime.batch_runner import BatchRunner
from dflash_trt.runtime.native import native_core

pytest.importorskip("dflash_trt._core", reason="dflash_trt._core is not built: run `bash scripts/setup.sh`")

PROMPTS = [[5, 6, 7], "abc", [1] * 9, "zz top", [3, 1, 4, 1, 5, 9, 2, 6], "x", [8, 8], "hello there"]


@pytest.fixture(scope="module")
def llm(tiny_pairs):
    target, draft = tiny_pairs["qwen3"]
    return LLM(str(target), str(draft), max_batch=3, backend="torch")


def alone(llm, prompt, params, speculative=True):
    return reference_output(llm, prompt, params, speculative)


@pytest.mark.parametrize("speculative", [True, False])
def test_generate_runs_a_list_concurrently_and_each_equals_its_reference(llm, speculative):
    params = SamplingParams(max_tokens=14, ignore_eos=True)
    outs = llm.generate(PROMPTS, params, speculative=speculative)  # 8 prompts through 3 slots: a queue
    for prompt, out in zip(PROMPTS, outs, strict=True):
        ref = alone(llm, prompt, params, speculative)
        assert (out.token_ids, out.finish_reason) == (ref.token_ids, ref.finish_reason)
        assert out.prompt == prompt and out.text == ref.text


def test_stop_strings_and_eos_through_the_core_equal_the_reference(llm):
    for params in (SamplingParams(max_tokens=30, stop=["e", "a"]), SamplingParams(max_tokens=30)):
        outs = llm.generate(PROMPTS, params)
        for prompt, out in zip(PROMPTS, outs, strict=True):
            ref = alone(llm, prompt, params)
            assert (out.text, out.token_ids, out.finish_reason) == (ref.text, ref.token_ids, ref.finish_reason)


def test_seeded_sampling_is_the_same_alone_and_in_a_batch(llm):
    params = SamplingParams(max_tokens=12, temperature=0.9, top_p=0.95, seed=11, ignore_eos=True)
    batch = llm.generate(PROMPTS, params)
    for prompt, out in zip(PROMPTS, batch, strict=True):
        assert out.token_ids == llm.generate(prompt, params)[0].token_ids


def test_the_runner_hands_freed_memory_back_when_its_work_ends(llm, monkeypatch):
    """What a burst's steps freed goes back to the system once no request is left (an idle server
    does not keep its largest step's memory), and not between steps."""
    runner = BatchRunner(llm, max_batch=3)
    calls = []
    monkeypatch.setattr(native_core(), "release_host_memory", lambda: calls.append(runner.has_work) or True)
    runner.run(PROMPTS[:5], SamplingParams(max_tokens=6, ignore_eos=True))
    assert calls == [False]


def test_a_finished_requests_timings_stop_at_its_finish(llm):
    # bench reads every output after the whole run: a request's decode time must not run on to then
    runner = BatchRunner(llm, max_batch=3)
    requests = [runner.prepare(p, SamplingParams(max_tokens=n, ignore_eos=True)) for p, n in zip(PROMPTS, [2, 30, 30])]
    for request in requests:
        runner.submit(request)
    while requests[0].finish_reason is None:
        runner.step()
    early = runner.output(requests[0]).metrics
    while runner.has_work:
        runner.step()
    late = runner.output(requests[0]).metrics
    assert late.decode_s == early.decode_s and late.prefill_s == early.prefill_s
    assert late.e2e_latency_s == early.e2e_latency_s == pytest.approx(late.prefill_s + late.decode_s)


def test_a_queued_requests_phases_are_vllm_s_queue_prefill_decode_and_inference(llm):
    """One slot, two requests: the second waits for the first to finish (its queue time covers the
    first's whole run), then prefills and decodes; the phases add up to its latencies; the KV usage
    the server exports is the share of slots held."""
    runner = BatchRunner(llm, max_batch=1)
    first, second = (runner.prepare(p, SamplingParams(max_tokens=12, ignore_eos=True)) for p in PROMPTS[:2])
    runner.submit(first)
    runner.submit(second)
    runner.step()
    assert runner.stats()["kv_cache_usage"] == 1.0
    while runner.has_work:
        runner.step()
    assert runner.stats()["kv_cache_usage"] == 0.0
    ran, waited = (runner.output(r).metrics.to_dict() for r in (first, second))
    # it waited out the first's run (1 ms: the Python and core clocks start a request apart)
    assert waited["queue_time_s"] > ran["inference_time_s"] - 1e-3 and ran["queue_time_s"] < waited["queue_time_s"]
    for r in (first, second):  # an inter-token latency per step after the first that gave tokens
        m = runner.output(r).metrics
        assert 1 <= len(m.token_gaps) <= m.output_tokens - 1
        assert sum(m.token_gaps) == pytest.approx(m.decode_s, abs=1e-3)  # first token to last, in pieces
    for m in (ran, waited):
        assert m["queue_time_s"] + m["prefill_time_s"] == pytest.approx(m["time_to_first_token_s"])
        assert m["inference_time_s"] == pytest.approx(m["prefill_time_s"] + m["decode_time_s"])
        assert m["e2e_latency_s"] == pytest.approx(m["queue_time_s"] + m["inference_time_s"])


def test_requests_are_checked_before_any_work(llm):
    runner = BatchRunner(llm, max_batch=2, capacity=16)
    with pytest.raises(DFlashError, match="exceeds the context capacity of 16 tokens"):
        runner.run([[1, 2, 3], [4] * 10], SamplingParams(max_tokens=8))
    assert not runner.has_work and runner.stats()["prompt_tokens_total"] == 0
    with pytest.raises(DFlashError, match="max_batch must be an integer >= 1"):
        BatchRunner(llm, max_batch=0)


def test_engine_generate_waits_for_every_prompt_and_a_cancel_aborts_them(llm):
    """Engine.generate (a beam search's step on a server): the outputs of LLM.generate, in order; asked to
    stop while waiting, it returns None and no request is left running."""
    params = SamplingParams(max_tokens=6, ignore_eos=True)
    engine = Engine(llm, max_batch=3)
    try:
        outputs = engine.generate(PROMPTS[:5], params, speculative=False)
        assert [o.token_ids for o in outputs] == [o.token_ids for o in llm.generate(PROMPTS[:5], params,
                                                                                     speculative=False)]
        long = SamplingParams(max_tokens=2000, ignore_eos=True)  # asked after its first 50 ms of waiting
        assert engine.generate(PROMPTS[:2], long, cancelled=lambda: True) is None
        deadline = time.monotonic() + 30
        while engine.stats()["running"] and time.monotonic() < deadline:
            time.sleep(0.01)
        assert engine.stats()["running"] == 0 and engine.stats()["waiting"] == 0
    finally:
        engine.shutdown()


def test_engine_serves_requests_from_many_threads(llm):
    params = SamplingParams(max_tokens=10, ignore_eos=True)
    # the block pinned: adaptive speculation chooses from measured costs, and on a loaded machine it may
    # choose plain steps only (seen in CI)
    engine = Engine(llm, max_batch=3, block_size=4)
    results = {}

    def client(i, prompt):
        *_, results[i] = engine.stream(prompt, params)

    threads = [threading.Thread(target=client, args=(i, p)) for i, p in enumerate(PROMPTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(600)
    engine.shutdown()
    for i, prompt in enumerate(PROMPTS):
        assert results[i].token_ids == alone(llm, prompt, params).token_ids
        assert results[i].metrics.output_tokens == 10 and results[i].metrics.prefill_s > 0  # one metrics type
    stats = engine.stats()
    assert stats["running"] == stats["waiting"] == 0
    assert stats["generation_tokens_total"] == 10 * len(PROMPTS)
    assert stats["requests_finished"] == {"length": len(PROMPTS)}
    # blocks of 4, shrunk near a request's end to what it may still emit
    assert 0 < stats["spec_decode_num_drafts"] <= stats["spec_decode_num_draft_tokens"] <= 3 * stats["spec_decode_num_drafts"]


def test_abort_and_closing_a_stream_free_the_slot(llm):
    engine = Engine(llm, max_batch=2)
    long = SamplingParams(max_tokens=200, ignore_eos=True)
    stream = engine.stream([1, 2, 3], long)
    first = next(stream)
    assert first.finish_reason is None
    stream.close()  # the client went away
    finals = []
    rid = engine.add_request([4, 5], long, lambda out: out.finish_reason and finals.append(out))
    assert engine.abort(rid)
    engine.shutdown()
    assert [o.finish_reason for o in finals] == ["abort"] and len(finals[0].token_ids) < 200
    assert not engine.abort(rid)  # not live any more
    stats = engine.stats()
    assert stats["running"] == stats["waiting"] == 0 and stats["requests_finished"] == {"abort": 2}
    assert engine.runner.slots.num_free == 2


def test_astream_yields_the_same_tokens_and_cancellation_aborts(llm):
    params = SamplingParams(max_tokens=8, ignore_eos=True)
    engine = Engine(llm, max_batch=2)

    async def main():
        outs = [out async for out in engine.astream("abc", params)]
        agen = engine.astream([7, 7, 7], SamplingParams(max_tokens=300, ignore_eos=True))
        await agen.__anext__()
        await agen.aclose()  # cancelled mid-stream
        return outs

    outs = asyncio.run(main())
    engine.shutdown()
    assert outs[-1].token_ids == alone(llm, "abc", params).token_ids and outs[-1].finish_reason == "length"
    assert engine.stats()["requests_finished"] == {"length": 1, "abort": 1}


def test_shutdown_drains_or_aborts_and_refuses_new_requests(llm):
    params = SamplingParams(max_tokens=20, ignore_eos=True)
    engine = Engine(llm, max_batch=2)
    finals = []
    for prompt in PROMPTS[:4]:
        engine.add_request(prompt, params, lambda out: out.finish_reason and finals.append(out.finish_reason))
    engine.shutdown(drain=True)
    assert finals == ["length"] * 4
    with pytest.raises(DFlashError, match="shutting down"):
        engine.add_request("abc", params)

    engine = Engine(llm, max_batch=2)
    finals.clear()
    for prompt in PROMPTS[:4]:
        engine.add_request(prompt, SamplingParams(max_tokens=500, ignore_eos=True),
                           lambda out: out.finish_reason and finals.append(out.finish_reason))
    engine.shutdown(drain=False)
    assert sorted(finals) == ["abort"] * 4


def test_a_full_waiting_queue_refuses_on_the_callers_thread_with_busy_429(llm):
    from dflash_trt.errors import Busy

    engine = Engine(llm, max_batch=1, max_waiting=1)
    long = SamplingParams(max_tokens=200, ignore_eos=True)
    try:
        running, waiting = engine.add_request([1, 2], long), engine.add_request([3, 4], long)
        with pytest.raises(Busy, match="all 1 slots are taken and 1 requests already wait") as err:
            engine.add_request([5, 6], long)
        assert err.value.status == 429
        engine.abort(waiting)
        deadline = time.monotonic() + 30
        while True:  # the abort takes effect between two steps; then there is room to wait again
            try:
                engine.add_request([5, 6], SamplingParams(max_tokens=2))
                break
            except Busy:
                assert time.monotonic() < deadline
                time.sleep(0.01)
        engine.abort(running)
    finally:
        engine.shutdown(drain=False)
    with pytest.raises(Busy, match="shutting down") as err:
        engine.add_request([1], SamplingParams(max_tokens=2))
    assert err.value.status == 503

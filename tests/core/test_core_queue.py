"""The scheduler's waiting queue and per-request timing (csrc/scheduler.cpp, csrc/metrics.cpp):
requests beyond the free slots wait in arrival order, abort reaches them too, and every output
carries vLLM-style latencies once they are known (checked for consistency, never for speed)."""

import pytest
from scheduler_checks import autoregressive

from dflash_trt import SamplingParams
from dflash_trt.errors import DFlashError

PARAMS = SamplingParams(max_tokens=6, ignore_eos=True)
PROMPTS = [[5, 6, 7], [9, 8], [1, 2, 3, 4], [3]]


def test_requests_beyond_the_slots_wait_and_are_admitted_in_arrival_order(runner_module, llms):
    llm = llms["qwen3"]
    engine = runner_module.BatchRunner(llm, max_batch=2, capacity=32)
    ids = [engine.add(p, PARAMS) for p in PROMPTS]
    assert (engine.scheduler.num_running, engine.scheduler.num_waiting) == (2, 2)
    assert engine.slots.num_free == 0
    first_step = {}
    step = 0
    while engine.has_work:
        for out in engine.step():
            first_step.setdefault(out, step)
        step += 1
        assert engine.scheduler.num_running <= 2
    # the first two prefill at once; each later one only when a slot frees, in order
    assert first_step[ids[0]] == first_step[ids[1]] == 0
    assert first_step[ids[1]] < first_step[ids[2]] <= first_step[ids[3]]
    for request, prompt in zip(ids, PROMPTS, strict=True):
        assert request.token_ids == autoregressive(llm, "qwen3", prompt, PARAMS).token_ids
    assert engine.scheduler.num_waiting == 0 and engine.slots.num_free == 2


def test_abort_reaches_a_waiting_request(runner_module, llms):
    llm = llms["qwen3"]
    engine = runner_module.BatchRunner(llm, max_batch=1, capacity=32)
    running, waiting, last = (engine.add(p, PARAMS) for p in PROMPTS[:3])
    assert engine.scheduler.num_waiting == 2
    assert engine.abort(waiting.id) is waiting
    assert engine.scheduler.num_waiting == 1 and engine.abort(waiting.id) is None
    assert waiting.finish_reason == "abort" and waiting.token_ids == []
    assert waiting not in engine.step()
    while engine.has_work:
        engine.step()
    for request, prompt in ((running, PROMPTS[0]), (last, PROMPTS[2])):
        assert request.token_ids == autoregressive(llm, "qwen3", prompt, PARAMS).token_ids


def test_a_capped_queue_refuses_with_one_line_and_the_others_continue(runner_module, llms):
    engine = runner_module.BatchRunner(llms["qwen3"], max_batch=1, capacity=32, max_waiting=1)
    queued = [engine.add(PROMPTS[0], PARAMS), engine.add(PROMPTS[1], PARAMS)]
    with pytest.raises(DFlashError, match="waiting queue is full") as err:
        engine.add(PROMPTS[2], PARAMS)
    assert "\n" not in str(err.value)
    assert engine.scheduler.num_waiting == 1
    no_queue = runner_module.BatchRunner(llms["qwen3"], max_batch=1, capacity=32, max_waiting=0)
    no_queue.add(PROMPTS[0], PARAMS)
    with pytest.raises(DFlashError, match="no free KV slot"):
        no_queue.add(PROMPTS[1], PARAMS)
    while engine.has_work:
        engine.step()
    assert [r.finish_reason for r in queued] == ["length", "length"]


def test_every_output_carries_its_latencies_once_known(runner_module, llms):
    engine = runner_module.BatchRunner(llms["small_vocab"], max_batch=1, capacity=32)
    one = engine.add([1, 2], SamplingParams(max_tokens=1, ignore_eos=True))
    many = engine.add([3, 4, 1], SamplingParams(max_tokens=9, ignore_eos=True))  # waits for `one`
    seen = []
    while engine.has_work:
        seen += [(o, dict(o.core_metrics)) for o in engine.step()]
    for request, m in seen:
        assert m["queue_time_s"] >= 0 and m["time_to_first_token_s"] >= m["queue_time_s"]
        if m is seen[-1][1] or request == one:
            assert m["e2e_latency_s"] >= m["time_to_first_token_s"]
        else:
            assert m["e2e_latency_s"] is None, "not finished yet"
    final_one, final_many = one.core_metrics, many.core_metrics
    assert final_one["time_per_output_token_s"] is None, "one token: no gap between tokens"
    assert final_many["time_per_output_token_s"] > 0
    # `many` waited for `one` to finish before its prefill
    assert final_many["queue_time_s"] > 0

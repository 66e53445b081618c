"""Priority scheduling (vLLM's `scheduling_policy="priority"`, csrc/scheduler.h): waiting requests are
admitted by (priority, arrival), lower first, and one that finds every KV slot taken preempts the
running request of the lowest priority below its own. The preempted request gives its slot up and,
readmitted, prefills its prompt and the tokens it had committed again, then goes on: it emits what it
emits alone (greedy: the autoregressive reference; seeded T>0, penalties, allowed tokens, prompt
logprobs: the same request run alone), on dense, sliding-window and hybrid targets, with DFlash and
plainly. The torch backend's slot executor on the CPU."""

import threading

import pytest
from factories import tiny_slots_pair
from reference import reference_output

from dflash_trt import LLM, DFlashError, SamplingParams
from dflash_trt.runtime.engine import Engine
from dflash_trt.runtime.batch_runner import BatchRunner

pytest.importorskip("dflash_trt._core", reason="dflash_trt._core is not built: run `bash scripts/setup.sh`")

LOW, HIGH = [5, 9, 2, 6, 7, 1], [8, 3, 4]
GREEDY = SamplingParams(max_tokens=14, ignore_eos=True)


@pytest.fixture(scope="module")
def llms(tmp_path_factory):
    made = {}
    for kind in ("dense", "sliding-window", "hybrid"):
        _, target, draft = tiny_slots_pair(tmp_path_factory.mktemp(kind), kind, export=False)
        made[kind] = LLM(target, draft, backend="torch", max_batch=1, scheduling_policy="priority")
    return made


def runner(llm, max_batch=1, **kwargs):
    return BatchRunner(llm, max_batch=max_batch, capacity=64, scheduling_policy="priority", **kwargs)


def preempted(run, low_prompt, low_params, high_prompt, high_params, speculative=None, steps=2):
    """`low` (priority 5) runs `steps` steps alone, then `high` (priority 0) arrives and takes its slot
    -> (low, high, low's tokens when high came), both run to their ends."""
    low = run.add(low_prompt, low_params, speculative=speculative, priority=5)
    for _ in range(steps):
        run.step()
    before = list(low.token_ids)
    high = run.add(high_prompt, high_params, speculative=speculative, priority=0)
    run.step()
    assert (run.scheduler.num_running, run.scheduler.num_waiting, run.scheduler.preemptions) == (1, 1, 1)
    while high.finish_reason is None:
        assert low.token_ids == before, "a preempted request emits nothing while it waits"
        run.step()
    while run.has_work:
        run.step()
    return low, high, before


@pytest.mark.parametrize("speculative", [True, False], ids=["dflash", "plain"])
@pytest.mark.parametrize("kind", ["dense", "sliding-window", "hybrid"])
def test_a_preempted_request_resumes_and_both_decode_as_autoregressive(llms, kind, speculative):
    llm = llms[kind]
    low, high, before = preempted(runner(llm), LOW, GREEDY, HIGH, GREEDY, speculative)
    assert before, "preempted after its first tokens"
    assert low.token_ids == reference_output(llm, LOW, GREEDY).token_ids
    assert high.token_ids == reference_output(llm, HIGH, GREEDY).token_ids
    assert (low.metrics.num_preemptions, high.metrics.num_preemptions) == (1, 0)
    assert low.metrics.to_dict()["num_preemptions"] == 1
    # the prompt is counted once, though it was prefilled twice
    assert runner_stats_prompt_tokens(llm) == len(LOW) + len(HIGH)


def runner_stats_prompt_tokens(llm):
    run = runner(llm)
    preempted(run, LOW, GREEDY, HIGH, GREEDY)
    return run.scheduler.stats()["prompt_tokens"]


def test_seeded_sampling_with_penalties_and_allowed_tokens_is_the_same_preempted(llms):
    """Draws are keyed by (seed, position); a penalty's counts and the allowed set go on as they were."""
    llm = llms["dense"]
    sampled = SamplingParams(max_tokens=14, temperature=0.9, top_p=0.9, seed=11, repetition_penalty=1.3,
                             frequency_penalty=0.4, ignore_eos=True)
    ruled = SamplingParams(max_tokens=10, temperature=0.8, seed=4, allowed_token_ids=[3, 7, 11, 19, 23],
                           ignore_eos=True)
    for params in (sampled, ruled):
        alone = llm.generate([LOW], params)[0]
        low, _, before = preempted(runner(llm), LOW, params, HIGH, GREEDY, steps=3)
        assert before and low.token_ids == alone.token_ids
        assert set(low.token_ids) <= set(ruled.allowed_token_ids) or params is sampled


def test_a_request_preempted_while_its_prompt_is_scored_scores_it_again_whole(llms):
    llm = llms["dense"]
    prompt = [5, 9, 2, 6, 7, 1, 8, 3, 4, 12]
    params = SamplingParams(max_tokens=6, prompt_logprobs=2, ignore_eos=True)
    alone = BatchRunner(llm, max_batch=1, capacity=64, prefill_chunk=2).run([prompt], params)[0]
    low, _, before = preempted(runner(llm, prefill_chunk=2), prompt, params, HIGH, GREEDY, steps=2)
    assert before == [], "preempted before its prompt was in"
    assert low.token_ids == alone.token_ids
    assert len(low.prompt_logprobs) == len(prompt)
    for mine, theirs in zip(low.prompt_logprobs[1:], alone.prompt_logprobs[1:], strict=True):
        assert mine.keys() == theirs.keys()
        assert all(mine[t] == pytest.approx(theirs[t], abs=1e-5) for t in mine)


def test_waiting_requests_are_admitted_by_priority_then_arrival_without_preempting_an_equal(llms):
    llm = llms["dense"]
    run = runner(llm)
    params = SamplingParams(max_tokens=3, ignore_eos=True)
    first = run.add([1, 2], params, priority=0)
    waiting = {name: run.add(prompt, params, priority=rank) for name, prompt, rank in (
        ("b", [3, 4], 5), ("c", [5, 6], 1), ("d", [7, 8], 1), ("e", [9, 10], 0))}
    admitted, step = {}, 0
    while run.has_work:
        for request in run.step():
            admitted.setdefault(request.id, step)
        step += 1
    order = sorted(waiting, key=lambda name: admitted[waiting[name].id])
    assert order == ["e", "c", "d", "b"]  # e ties the running request's 0: it waits, preempting nothing
    assert admitted[first.id] == 0 and run.scheduler.preemptions == 0
    for request in (first, *waiting.values()):
        assert request.token_ids == reference_output(llm, request.ids, params).token_ids


def test_a_request_preempted_twice_and_one_aborted_while_preempted(llms):
    llm = llms["dense"]
    run = runner(llm)
    lowest = run.add(LOW, GREEDY, priority=9)
    run.step()
    middle = run.add([2, 4, 6], GREEDY, priority=5)
    run.step()
    top = run.add(HIGH, GREEDY, priority=-3)
    run.step()
    assert run.scheduler.preemptions == 2 and run.scheduler.num_waiting == 2
    assert run.abort(middle.id) is middle and middle.finish_reason == "abort"
    while run.has_work:
        run.step()
    assert lowest.token_ids == reference_output(llm, LOW, GREEDY).token_ids
    assert top.token_ids == reference_output(llm, HIGH, GREEDY).token_ids
    assert run.slots.num_free == 1 and run.stats()["num_preemptions"] == 2


def test_a_request_that_will_wait_for_a_running_prefill_preempts_nobody_until_it_is_done(llms):
    """C shares A's long head; A is still prefilling (chunks of 2): C waits for it (prefix_wait_tokens)
    before preempting, then takes A's slot and reuses A's positions there."""
    llm = llms["dense"]
    run = runner(llm, max_batch=2, prefill_chunk=2, prefix_wait_tokens=4)
    head = [5, 9, 2, 6, 7, 1, 8, 3, 4, 12, 14, 15]
    b = run.add([2, 4, 6], GREEDY, priority=5)
    run.step()
    a = run.add(head + [20], GREEDY, priority=5)
    run.step()
    c = run.add(head + [30, 31], GREEDY, priority=0)
    while not a.token_ids:
        assert run.scheduler.preemptions == 0, "preempted while the prefill it waits for runs"
        run.step()
    while run.has_work:
        run.step()
    assert run.scheduler.preemptions == 1 and a.metrics.num_preemptions == 1
    assert c.metrics.cached_tokens == len(head)
    for request in (a, b, c):
        assert request.token_ids == reference_output(llm, request.ids, GREEDY).token_ids


def test_llm_generate_serves_lower_priorities_first(llms):
    llm = llms["dense"]  # one slot: each waits for the ones before it
    params = SamplingParams(max_tokens=4, ignore_eos=True)
    outs = llm.generate([[1, 2], [3, 4], [5, 6]], params, priority=[2, 0, 1])
    waited = [o.metrics.prefill_s for o in outs]
    assert waited[1] < waited[2] < waited[0]
    for out in outs:
        assert out.token_ids == reference_output(llm, out.prompt_token_ids, params).token_ids


def test_an_engine_preempts_for_a_request_added_mid_stream(llms):
    llm = llms["dense"]
    params = SamplingParams(max_tokens=40, ignore_eos=True)
    engine = Engine(llm, max_batch=1, capacity=64, scheduling_policy="priority")
    finished, done = [], threading.Event()

    def on_low(out):  # on the engine thread: high arrives after low's first output, while low runs
        if not finished and out.finish_reason is None and len(out.token_ids) < 30:
            finished.append(engine.add_request(HIGH, GREEDY, priority=-1))
        if out.finish_reason is not None:
            finished.append(out)
            done.set()

    try:
        engine.add_request(LOW, params, on_output=on_low, priority=1)
        assert done.wait(120)
    finally:
        engine.shutdown(drain=False)
    low = finished[-1]
    assert low.token_ids == reference_output(llm, LOW, params).token_ids
    assert low.metrics.num_preemptions == 1 and engine.stats()["num_preemptions"] == 1
    engine = Engine(llm, max_batch=1, capacity=64, scheduling_policy="priority")
    try:  # the stream's own priority
        assert list(engine.stream(HIGH, GREEDY, priority=-4))[-1].token_ids == \
            reference_output(llm, HIGH, GREEDY).token_ids
    finally:
        engine.shutdown()


def test_priorities_are_refused_in_one_line_where_they_cannot_be_honoured(llms, tiny_pairs):
    fcfs = BatchRunner(llms["dense"], max_batch=1, capacity=64)
    with pytest.raises(DFlashError, match=r"^priority 2 needs scheduling_policy='priority'") as err:
        fcfs.add(LOW, GREEDY, priority=2)
    assert "\n" not in str(err.value)
    fcfs.add(LOW, GREEDY, priority=0)  # 0 is every request's priority there
    for bad in (1.5, "1", True, None, 2**63):
        with pytest.raises(DFlashError, match="priority must be an integer"):
            runner(llms["dense"]).add(LOW, GREEDY, priority=bad)
    with pytest.raises(DFlashError, match="scheduling_policy must be one of fcfs, priority, got 'lifo'"):
        LLM(*map(str, tiny_pairs["qwen3"]), backend="torch", scheduling_policy="lifo")
    with pytest.raises(DFlashError, match="2 priorities for 3 prompts"):
        llms["dense"].generate([[1], [2], [3]], GREEDY, priority=[0, 1])
    plain = LLM(*map(str, tiny_pairs["qwen3"]), backend="torch")
    with pytest.raises(DFlashError, match="needs scheduling_policy='priority'"):
        plain.generate([[1], [2]], GREEDY, priority=[0, 1])

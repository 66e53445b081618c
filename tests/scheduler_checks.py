"""Workloads and the oracle shared by the core scheduler's tests (tests/core): requests arriving at
different steps, and each request's own output from the Python reference loop."""

from __future__ import annotations

import random

from reference import reference_output

from dflash_trt import SamplingParams

_REFERENCE: dict = {}


def reference(llm, name, prompt, params, speculative=False):
    """The Python reference loop's final output for one request alone (tests/reference.py, not the core)."""
    key = (name, tuple(prompt), params, speculative)
    if key not in _REFERENCE:
        _REFERENCE[key] = reference_output(llm, prompt, params, speculative)
    return _REFERENCE[key]


def autoregressive(llm, name, prompt, params):
    return reference(llm, name, prompt, params, speculative=False)


def workload(vocab, count, seed):
    """`count` (arrival step, prompt, params): prompts of 1..24 tokens, max_tokens 3..20, some
    stopping on EOS."""
    rng = random.Random(seed)
    top = min(vocab, 5) if vocab <= 6 else vocab  # the small pair's MASK (5) is not a prompt token
    work, step = [], 0
    for i in range(count):
        prompt = [rng.randrange(top) for _ in range(rng.randint(1, 24))]
        params = SamplingParams(max_tokens=rng.randint(3, 20), ignore_eos=i % 2 == 0)
        work.append((step, prompt, params))
        step += rng.choice([0, 1, 2])
    return work


def drive(runner, work):
    """Add each request at its arrival step (the core queues it while every slot is taken); step
    until all finish -> the requests, in order."""
    pending = list(enumerate(work))
    requests, step = {}, 0
    while pending or runner.has_work:
        while pending and pending[0][1][0] <= step:
            index, (_, prompt, params) = pending.pop(0)
            requests[index] = runner.add(prompt, params)
        runner.step()
        step += 1
        assert step < 2000, "the runner does not finish"
    return [requests[i] for i in range(len(work))]


def decode_together(core, sched, prompts, max_tokens, block_size):
    """Run `prompts` to `max_tokens` each, all added at once -> (tokens, drafts accepted per verify
    step while the block was not cut short by the request's end), one list per prompt."""
    ids = [sched.add_request(p, core.RequestParams(max_tokens=max_tokens, ignore_eos=True)) for p in prompts]
    tokens, accepted, drafts = {i: [] for i in ids}, {i: [] for i in ids}, {i: 0 for i in ids}
    while sched.has_work:
        for out in sched.step():
            i, m = out["request"], out["metrics"]
            if m["num_drafts"] > drafts[i] and max_tokens - len(tokens[i]) >= block_size:
                accepted[i].append(m["num_accepted_tokens"] - sum(accepted[i]))
            drafts[i] = m["num_drafts"]
            tokens[i] += out["new_tokens"]
    return [tokens[i] for i in ids], [accepted[i] for i in ids]


def decode_on(core, executor, prompts, block_size, max_batch=3, capacity=64, max_tokens=12, prefill_chunk=0):
    """decode_together on a fresh scheduler over `executor` (greedy, engine seed 0)."""
    config = core.SchedulerConfig(max_batch=max_batch, capacity=capacity, block_size=block_size, engine_seed=0,
                                  prefill_chunk=prefill_chunk)
    return decode_together(core, core.Scheduler(executor, config), prompts, max_tokens, block_size)


def decode_preempted(core, executor, low, high, block_size, max_tokens=12, steps=2):
    """`low` (priority 5) decodes `steps` steps alone in a scheduler of one slot over `executor`, then
    `high` (priority 0) arrives and preempts it -> (low's tokens, high's tokens, the preemptions), greedy."""
    config = core.SchedulerConfig(max_batch=1, capacity=64, block_size=block_size, engine_seed=0, by_priority=True)
    sched = core.Scheduler(executor, config)
    tokens = {}

    def step():
        for out in sched.step():
            tokens.setdefault(out["request"], []).extend(out["new_tokens"])

    first = sched.add_request(low, core.RequestParams(max_tokens=max_tokens, ignore_eos=True, priority=5))
    for _ in range(steps):
        step()
    second = sched.add_request(high, core.RequestParams(max_tokens=max_tokens, ignore_eos=True, priority=0))
    while sched.has_work:
        step()
    return tokens[first], tokens[second], sched.preemptions


def python_loop(target, drafter, prompt, max_tokens, block_size):
    """(tokens, accepted drafts per verify step) of the Python reference loop on the torch models, greedy;
    block 1: autoregressive. A step cut short by max_tokens records no acceptance."""
    from dflash_trt.runtime.torch_backend import TorchDraftSession, TorchTargetSession
    from dflash_trt.spec.loop import autoregressive_decode, speculative_decode
    from dflash_trt.spec.sampling import Sampler

    sampler = Sampler(SamplingParams(max_tokens=max_tokens, ignore_eos=True))
    if block_size == 1:
        steps = autoregressive_decode(TorchTargetSession(target, ()), prompt, sampler)
    else:
        taps = drafter.config.target_layer_ids
        steps = speculative_decode(TorchTargetSession(target, taps), TorchDraftSession(drafter, target), prompt,
                                   block_size, sampler)
    tokens, accepted = [], []
    for step in steps:
        if len(tokens) + len(step.tokens) <= max_tokens and step.accepted is not None:
            accepted.append(step.accepted)
        tokens += step.tokens
        if len(tokens) >= max_tokens:
            break
    return tokens[:max_tokens], accepted


def bundle_scheduler(core, ort, bundle, rows, block_size, capacity=64):
    """A greedy core scheduler (engine seed 0) over a bundle's onnxruntime executor -> (scheduler, executor)."""
    executor = ort.ort_executor(bundle, max_batch=rows, capacity=capacity)
    config = core.SchedulerConfig(max_batch=rows, capacity=capacity, block_size=block_size, engine_seed=0)
    return core.Scheduler(executor, config), executor


def drive_scheduler(core, sched, work):
    """Add each request at its arrival step (later when every slot is taken); step until all finish
    -> {index: output tokens}, {index: metrics}."""
    waiting, ids, tokens, metrics, step = list(enumerate(work)), {}, {}, {}, 0
    while waiting or sched.has_work:
        while waiting and waiting[0][1][0] <= step and sched.num_live < sched.slots.num_slots:
            index, (_, prompt, max_tokens) = waiting.pop(0)
            ids[sched.add_request(prompt, core.RequestParams(max_tokens=max_tokens, ignore_eos=True))] = index
            tokens[index] = []
        for out in sched.step():
            tokens[ids[out["request"]]] += out["new_tokens"]
            metrics[ids[out["request"]]] = out["metrics"]
        step += 1
        assert step < 2000, "the scheduler does not finish"
    return tokens, metrics


def check_draft_kernels(llm, monkeypatch, mode) -> None:
    """With runtime/torch_graphs.DRAFT_KERNELS at `mode` the draft graphs run as dflash:: ops: phase by
    phase they draft what the standard graphs draft, and greedy output equals autoregressive decoding."""
    from dflash_trt.runtime import torch_graphs
    from dflash_trt.runtime.cuda_ops import KERNEL_OPS

    monkeypatch.setattr(torch_graphs, "DRAFT_KERNELS", False)
    standard = llm.executor(2, 64)
    monkeypatch.setattr(torch_graphs, "DRAFT_KERNELS", mode)
    kernels = llm.executor(2, 64)
    assert llm.draft_kernels == KERNEL_OPS
    for executor in (standard, kernels):
        executor.prefill_logits([0, 1], [[3, 1, 4, 1, 5, 9, 2], [2, 7, 1]])
    for bonus, kept in (([7, 11], [2, 0]), ([4, 5], [3, 1])):
        drafts = [executor.draft([0, 1], bonus, 4) for executor in (standard, kernels)]
        assert drafts[0] == drafts[1]
        for executor in (standard, kernels):
            executor.verify_logits([0, 1], [[t, *d] for t, d in zip(bonus, drafts[0], strict=True)])
            executor.commit([0, 1], kept)
    check_batched_greedy(llm, 4, seed=9)
    assert llm.draft_kernels == KERNEL_OPS


def check_batched_greedy(llm, count: int, seed: int) -> None:
    """`count` workload requests through a BatchRunner of 3 slots (blocks of 4): each greedy output equals
    autoregressive decoding."""
    from dflash_trt.runtime.batch_runner import BatchRunner

    work = workload(llm.vocab_size, count, seed=seed)
    runner = BatchRunner(llm, max_batch=3, capacity=64, block_size=4)
    requests = [runner.add(prompt, params) for _, prompt, params in work]
    while runner.has_work:
        runner.step()
    for request, (_, prompt, params) in zip(requests, work, strict=True):
        assert request.token_ids == reference_output(llm, prompt, params).token_ids


def set_up_per_step(executor, rows: list[int], bonus: list[int], steps: int, block: int = 4) -> list[int]:
    """The executor's set_up_runs each of `steps` steps paid (a draft of `block`, its verify, one position
    kept a row): what the scheduler would leave out of its cost model."""
    paid = []
    for _ in range(steps):
        before = executor.set_up_runs
        drafts = executor.draft(rows, bonus, block)
        executor.verify_logits(rows, [[b, *d] for b, d in zip(bonus, drafts, strict=True)])
        executor.commit(rows, [1] * len(rows))
        paid.append(executor.set_up_runs - before)
    return paid

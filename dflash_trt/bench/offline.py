"""Offline mode: run prompts through an in-process `LLM`, DFlash and `speculative=False` alike."""

from __future__ import annotations

import time
from collections import deque
from dataclasses import replace

from tqdm import tqdm

from dflash_trt.bench.summary import RequestRecord
from dflash_trt.runtime.batch_runner import BatchRunner
from dflash_trt.runtime.llm import LLM
from dflash_trt.spec.sampling import SamplingParams


def record_of(output) -> RequestRecord:
    m = output.metrics
    return RequestRecord(
        text=output.text,
        output_tokens=m.output_tokens,
        latency_s=m.prefill_s + m.decode_s,
        ttft_s=m.prefill_s,
        token_ids=list(output.token_ids),
        acceptance_lengths=list(m.acceptance_lengths) if m.block_size else None,
        cached_tokens=m.cached_tokens,
    )


def run_offline(llm: LLM, prompts: list[str], params: SamplingParams, speculative: bool,
                block_size: int | None, desc: str, concurrency: int = 1) -> tuple[list[RequestRecord], float, dict]:
    """The prompts through the core with at most `concurrency` requests in flight, as a client with that
    many connections would send them (the next one starts when one finishes, so no request waits in a
    queue). `block_size` 0 (or None) lets each step choose its block (adaptive speculation).
    Returns the records, in prompt order, the wall time, and where the time went (`step_times`)."""
    runner = BatchRunner(llm, max_batch=concurrency, capacity=llm.capacity, speculative=speculative,
                         block_size=(block_size or None) if speculative else None,
                         prefix_caching=llm.prefix_caching)
    requests = [runner.prepare(p, params) for p in prompts]  # every prompt is checked before any work
    # Untimed: first calls pay for lazy set-up (allocators, onnxruntime's per-shape plans).
    runner.run(prompts[:concurrency], replace(params, max_tokens=min(params.max_tokens, 8)))
    runner.forget_cached()  # the timed prompts prefill whole, as they would arriving first
    before = runner.core_stats()
    pending = deque(requests)
    start = time.perf_counter()
    with tqdm(total=len(requests), desc=desc, unit="prompt", leave=False) as bar:
        while pending or runner.has_work:
            while pending and len(runner.live) < concurrency:
                runner.submit(pending.popleft(), arrival=time.perf_counter())
            bar.update(sum(1 for r in runner.step() if r.finish_reason is not None))
    wall = time.perf_counter() - start
    return [record_of(runner.output(r)) for r in requests], wall, step_times(before, runner.core_stats(), wall)


def step_times(before: dict, after: dict, wall_s: float) -> dict:
    """Where a run's time went, from the core's phase clocks: seconds in the executor's prefill /
    draft / verify / commit calls, in whole core steps, their count, and the wall time. What is not
    model execution (the core's scheduling, acceptance and sampling, and the Python runner around it:
    detokenising, stop strings) is `wall - executor`."""
    seconds = {k: after["seconds"][k] - before["seconds"][k] for k in after["seconds"]}
    moved = None if after["host_bytes"] is None else after["host_bytes"] - before["host_bytes"]
    return {**seconds, "steps": after["steps"] - before["steps"], "wall": wall_s, "host_bytes": moved}

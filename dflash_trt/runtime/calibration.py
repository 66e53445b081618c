"""Seeding the core scheduler's cost model at load, so adaptive speculation starts from measured costs."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from dflash_trt.runtime.native import native_core

# Runs per (rows, block) at most: set-up takes two (a first run, then a CUDA graph's capture), the
# timing a third.
RUNS_AT_MOST = 4


def calibrate_costs(
    scheduler, executor, rows: Sequence[int], blocks: Sequence[int], prompt: Sequence[int]
) -> None:
    """Seed the scheduler's cost model before any request: time one verify (and one draft, for a block
    of 2 or more) per (rows, block) on dummy rows, run again until a run pays no set-up
    (`executor.set_up_runs`: onnxruntime plans a shape on its first run, a GPU captures a CUDA graph on
    its second; a cold verify timed at 5 s once kept the policy at B=1 for good). The verify is a greedy
    request's, decided where the executor decides (a GPU's tokens alone come back, not its logits: 0.3 GB
    of them at 32 rows x 16 tokens x Qwen3's vocabulary would make every large block look dear). Rows
    0..n-1 must be free; they are released after."""
    for n in rows:
        slots = list(range(n))
        executor.prefill_logits(slots, [list(prompt)] * n)
        bonus = [int(prompt[-1])] * n
        greedy = [native_core().RowSampling()] * n
        for block in blocks:
            seeded: set[str] = set()
            for _ in range(RUNS_AT_MOST):
                drafts = [[] for _ in slots]
                if block > 1:
                    drafts = _timed(scheduler, executor, "draft", n, block, seeded,
                                    lambda: executor.draft(slots, bonus, block))
                _timed(scheduler, executor, "verify", n, block, seeded,
                       lambda: executor.verify(slots, [[b, *d] for b, d in zip(bonus, drafts, strict=True)], greedy))
                executor.commit(slots, [1] * n)
                if len(seeded) == (2 if block > 1 else 1):
                    break
        for row in slots:
            executor.release(row)


def _timed(scheduler, executor, phase: str, rows: int, block: int, seeded: set[str], call: Callable):
    """call() -> its result; its time seeds `phase`'s cost when it paid no set-up and none seeded it yet."""
    set_ups = executor.set_up_runs
    start = time.perf_counter()
    result = call()
    seconds = time.perf_counter() - start
    if executor.set_up_runs == set_ups and phase not in seeded:
        scheduler.seed_cost(phase, rows, block, seconds)
        seeded.add(phase)
    return result

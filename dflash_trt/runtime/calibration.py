"""Seeding the core scheduler's cost model at load, so adaptive speculation starts from measured costs."""

from __future__ import annotations

import time
from collections.abc import Sequence


def calibrate_costs(
    scheduler, executor, rows: Sequence[int], blocks: Sequence[int], prompt: Sequence[int]
) -> None:
    """Seed the scheduler's cost model before any request: time one verify (and one draft, for a block
    of 2 or more) per (rows, block) on dummy rows, each after an untimed run of the same shape (first
    calls pay for lazy set-up: onnxruntime plans a shape on its first run, and a cold verify timed at
    5 s once kept the policy at B=1 for good). Rows 0..n-1 must be free; they are released after."""
    for n in rows:
        slots = list(range(n))
        executor.prefill_logits(slots, [list(prompt)] * n)
        bonus = [int(prompt[-1])] * n
        for block in blocks:
            for timed in (False, True):
                drafts = [[] for _ in slots]
                if block > 1:
                    start = time.perf_counter()
                    drafts = executor.draft(slots, bonus, block)
                    if timed:
                        scheduler.seed_cost("draft", n, block, time.perf_counter() - start)
                start = time.perf_counter()
                executor.verify_logits(slots, [[b, *d] for b, d in zip(bonus, drafts, strict=True)])
                if timed:
                    scheduler.seed_cost("verify", n, block, time.perf_counter() - start)
                executor.commit(slots, [1] * n)
        for row in slots:
            executor.release(row)

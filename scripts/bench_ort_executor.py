"""Phase times of a C++ slot executor (csrc/slot_executor.cpp): onnxruntime over a `slots` bundle, or
TensorRT over an engine bundle built from a `slots-trt` export (on its GPU; the bundle's static
capacity must then cover --cached + --block + --repeats + 2).

For each batch size and cached length: prefill `batch` rows of `cached` random tokens once, then
time (median and min over --repeats) one batched verify of a block per row, one draft (block pass; nothing
left to inject), and one whole step (inject the one committed position, draft, verify, commit 1).
With --released K, K more rows are prefilled among them and released before the timing (rows 1..K
of batch + K): the timed rows are then what a batch looks like after requests beside them finished.
Prints a table and writes JSON (--json).

    .venv/bin/python scripts/bench_ort_executor.py BUNDLE [--batch 1 8] [--cached 256 2048] [--block 4]
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import time
from pathlib import Path

from dflash_trt.runtime.engine_bundles import bundle_capacity
from dflash_trt.runtime.ort_executor import ort_executor


def timed(fn, repeats: int) -> tuple[float, float]:
    """(median, min) milliseconds of `repeats` calls after one warm-up call. On a shared machine the
    minimum is the closer estimate of the cost itself; the median says how noisy it was."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times), min(times)


def measure(bundle: Path, batch: int, cached: int, block: int, repeats: int, threads: int | None,
            released: int = 0) -> dict:
    # room for the block, the steps (one committed position each) and their warm-ups; a slots-trt
    # bundle's capacity is fixed in its graphs
    needed = cached + block + repeats + 2
    capacity = bundle_capacity(bundle) or needed
    if capacity < needed:
        raise SystemExit(f"{bundle}: its static capacity {capacity} is below the {needed} tokens this run needs")
    executor = ort_executor(bundle, max_batch=batch + released, capacity=capacity, threads=threads)
    vocab, rows = executor.config.vocab, list(range(batch + released))
    rng = random.Random(0)
    start = time.perf_counter()
    executor.prefill_logits(rows, [[rng.randrange(vocab) for _ in range(cached)] for _ in rows])
    prefill_s = time.perf_counter() - start
    for row in range(1, 1 + released):
        executor.release(row)
    rows = [0, *range(1 + released, batch + released)]
    bonus = [rng.randrange(vocab) for _ in rows]
    blocks = [[b] + [rng.randrange(vocab) for _ in range(block - 1)] for b in bonus]

    def verify():
        executor.verify_logits(rows, blocks)
        executor.commit(rows, [0] * batch)  # nothing kept: the next verify runs at the same length

    def draft():
        executor.draft(rows, bonus, block)

    def step():
        executor.draft(rows, bonus, block)
        executor.verify_logits(rows, blocks)
        executor.commit(rows, [1] * batch)

    draft()  # injects the prompt's features once
    result = {"batch": batch, "released": released, "cached": cached, "block": block, "prefill_s": prefill_s}
    for name, fn in (("verify", verify), ("draft", draft), ("step", step)):
        result[f"{name}_ms"], result[f"{name}_min_ms"] = timed(fn, repeats)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("bundle", type=Path, help="a slots bundle (dflash-trt export --flavour slots)")
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--cached", type=int, nargs="+", default=[256, 2048])
    parser.add_argument("--block", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--released", type=int, default=0, help="rows released among the timed ones first")
    parser.add_argument(
        "--threads", type=int, default=None, help="intra-op threads per session (default: onnxruntime's)"
    )
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    results = [
        measure(args.bundle, b, c, args.block, args.repeats, args.threads, args.released)
        for b in args.batch
        for c in args.cached
    ]
    cpu = platform.processor() or platform.machine()
    print(f"{args.bundle}  block {args.block}  threads {args.threads or 'default'}  released {args.released}  ({cpu})")
    print("ms: median / min of the repeats")
    print(f"{'batch':>5} {'cached':>6} {'prefill s':>9} {'verify ms':>15} {'draft ms':>15} {'step ms':>15}")
    for r in results:
        phases = ("verify", "draft", "step")
        times = " ".join(f"{r[f'{p}_ms']:>7.2f} /{r[f'{p}_min_ms']:>7.2f}" for p in phases)
        print(f"{r['batch']:>5} {r['cached']:>6} {r['prefill_s']:>9.2f} {times}")
    if args.json:
        args.json.write_text(json.dumps({"bundle": str(args.bundle), "results": results}, indent=2) + "\n")


if __name__ == "__main__":
    main()

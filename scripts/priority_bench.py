"""Priority scheduling, measured: what interactive requests gain, and what the batch they preempt pays.

One LLM's C++ core with S KV slots, stepped on this thread, under each policy on the same requests:
- a batch: 2 S long requests (priority 1) sent together, so S run and S wait;
- interactive requests (priority 0), one every `--gap` steps once the batch runs.
First come first served, an interactive request waits behind the whole queue; by priority it takes the
next free slot, or preempts a batch request (which later prefills what it had again and goes on).
Reports per class the mean and largest time to first token, the mean end-to-end latency, the wall time
and the preemptions. Greedy replies must be the same under both policies (a request's tokens never
depend on its scheduling), else it exits with status 3. Prints a table and writes JSON.

    python3 scripts/priority_bench.py [--target smollm2-135m] [--backend auto] [--slots 4]
        [--interactive 6] [--gap 6] [--batch-tokens 128] [--interactive-tokens 32]
        [--json docs/bench/priority-smollm2-135m.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from dflash_trt import LLM, SamplingParams
from dflash_trt.bench.datasets import load_prompts
from dflash_trt.bench.report import environment
from dflash_trt.runtime.batch_runner import SCHEDULING_POLICIES, BatchRunner


def run(llm: LLM, policy: str, slots: int, batch: list[str], interactive: list[str], gap: int,
        batch_tokens: int, interactive_tokens: int) -> dict:
    runner = BatchRunner(llm, max_batch=slots, capacity=llm.capacity, scheduling_policy=policy)
    runner.run([[1, 2, 3, 4]], SamplingParams(max_tokens=4))  # untimed: lazy set-up
    runner.forget_cached()
    rank = (lambda p: p) if policy == "priority" else (lambda p: 0)
    start = time.perf_counter()
    slow = [runner.add(p, SamplingParams(max_tokens=batch_tokens, ignore_eos=True), priority=rank(1)) for p in batch]
    quick, step = [], 0
    while runner.has_work or len(quick) < len(interactive):
        if len(quick) < len(interactive) and step >= gap * (len(quick) + 1):
            quick.append(runner.add(interactive[len(quick)], SamplingParams(max_tokens=interactive_tokens),
                                    priority=rank(0)))
        runner.step()
        step += 1
    wall = time.perf_counter() - start

    def summary(requests) -> dict:
        outs = [runner.output(r) for r in requests]
        ttft = [1e3 * o.metrics.prefill_s for o in outs]
        return {"requests": len(outs), "ttft_ms_mean": statistics.mean(ttft), "ttft_ms_max": max(ttft),
                "e2e_s_mean": statistics.mean(o.metrics.e2e_latency_s for o in outs),
                "tokens": sum(len(o.token_ids) for o in outs),
                "preempted": sum(o.metrics.num_preemptions for o in outs)}

    return {"policy": policy, "wall_s": wall, "steps": step, "preemptions": runner.preemptions,
            "interactive": summary(quick), "batch": summary(slow),
            "token_ids": [r.token_ids for r in slow + quick]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default="smollm2-135m")
    parser.add_argument("--draft", default="auto")
    parser.add_argument("--backend", default="auto")
    parser.add_argument("--slots", type=int, default=4)
    parser.add_argument("--interactive", type=int, default=6)
    parser.add_argument("--gap", type=int, default=6, help="steps between interactive arrivals")
    parser.add_argument("--batch-tokens", type=int, default=128)
    parser.add_argument("--interactive-tokens", type=int, default=32)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()

    llm = LLM(args.target, args.draft, backend=args.backend)
    prompts = load_prompts("mt-bench", 2 * args.slots + args.interactive)
    batch, interactive = prompts[:2 * args.slots], prompts[2 * args.slots:]
    runs = [run(llm, policy, args.slots, batch, interactive, args.gap, args.batch_tokens, args.interactive_tokens)
            for policy in SCHEDULING_POLICIES]
    same = runs[0].pop("token_ids") == runs[1].pop("token_ids")

    print("| policy | class | requests | TTFT ms mean | TTFT ms max | e2e s mean | preempted | wall s |")
    print("|---|---|---|---|---|---|---|---|")
    for r in runs:
        for name in ("interactive", "batch"):
            c = r[name]
            print(f"| {r['policy']} | {name} | {c['requests']} | {c['ttft_ms_mean']:.0f} | {c['ttft_ms_max']:.0f} | "
                  f"{c['e2e_s_mean']:.2f} | {c['preempted']} | {r['wall_s']:.2f} |")
    print(f"greedy replies the same under both policies: {'yes' if same else 'NO'}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"command": " ".join(["python3", *sys.argv]), "backend": llm.backend,
                                         "environment": environment(), "same_tokens": same, "runs": runs},
                                        indent=1) + "\n")
        print(f"written to {args.json}", file=sys.stderr)
    return 0 if same else 3


if __name__ == "__main__":
    sys.exit(main())

"""Structured output, measured: what a JSON schema costs DFlash and plain decoding, and what it keeps.

The same prompts through one LLM's C++ core, greedy: free DFlash, then DFlash and plain decoding under a
JSON schema (SamplingParams.structured_output, llguidance's masks at every position, drafts included),
each at concurrency 1 (one request at a time) and C (all together). Per setting: output tokens per
second of wall time, τ (tokens committed per verify step that drafted), the share of the wall spent
computing masks on the host (GrammarConstraint.masks), and how many replies parse as JSON with the
schema's keys. The constrained DFlash replies must equal the constrained plain ones token for token
(lossless), else it exits with status 3. Prints a table and writes JSON.

    python3 scripts/structured_bench.py [--target smollm2-135m] [--backend auto] [--max-tokens 64]
        [--concurrency 4] [--json docs/bench/structured-output-smollm2-135m.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from dflash_trt import LLM, SamplingParams
from dflash_trt.bench.report import environment
from dflash_trt.runtime import constraints
from dflash_trt.runtime.batch_runner import BatchRunner

SCHEMA = {"type": "object", "additionalProperties": False, "required": ["name", "year", "tags"], "properties": {
    "name": {"type": "string", "maxLength": 40}, "year": {"type": "integer"},
    "tags": {"type": "array", "items": {"type": "string", "maxLength": 20}, "maxItems": 3}}}
SUBJECTS = ["the Eiffel Tower", "the Python language", "the Moon landing", "the printing press", "jazz",
            "the Great Wall of China", "the telephone", "the Linux kernel"]


class MaskClock:
    """Seconds spent in GrammarConstraint.masks, summed over every request."""

    def __init__(self):
        self.seconds = 0.0
        inner = constraints.GrammarConstraint.masks

        def timed(constraint, *args):
            start = time.perf_counter()
            try:
                return inner(constraint, *args)
            finally:
                self.seconds += time.perf_counter() - start

        constraints.GrammarConstraint.masks = timed


def run(llm: LLM, prompts: list[str], params: SamplingParams, speculative: bool, concurrency: int,
        clock: MaskClock) -> tuple[dict, list]:
    runner = BatchRunner(llm, max_batch=concurrency, capacity=llm.capacity, speculative=speculative,
                         prefix_caching=False)
    runner.run(prompts[:1], params)  # untimed: lazy set-up, llguidance's tokenizer
    clock.seconds, outs, start = 0.0, [], time.perf_counter()
    for at in range(0, len(prompts), concurrency):
        outs += runner.run(prompts[at:at + concurrency], params)
    wall = time.perf_counter() - start
    tokens = sum(len(o.token_ids) for o in outs)
    steps = [tau for o in outs for tau in o.metrics.acceptance_lengths]
    return {"concurrency": concurrency, "speculative": speculative,
            "constrained": params.structured_output is not None, "output_tokens": tokens, "wall_s": round(wall, 3),
            "tok_per_s": round(tokens / wall, 1), "tau": round(statistics.mean(steps), 3) if steps else None,
            "mask_share": round(clock.seconds / wall, 3), "valid_json": sum(map(valid, outs))}, outs


def valid(out) -> bool:
    try:
        value = json.loads(out.text)
    except ValueError:
        return False
    return isinstance(value, dict) and set(value) == set(SCHEMA["required"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default="smollm2-135m")
    parser.add_argument("--backend", default="auto")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    llm = LLM(args.target, backend=args.backend)
    prompts = [f"Describe {s} as a JSON object with its name, a year and up to three tags." for s in SUBJECTS]
    free = SamplingParams(max_tokens=args.max_tokens)
    constrained = SamplingParams(max_tokens=args.max_tokens, structured_output={"json": SCHEMA})
    clock = MaskClock()
    rows, replies = [], {}
    for concurrency in sorted({1, args.concurrency}):
        for params, speculative in ((free, True), (constrained, True), (constrained, False)):
            row, outs = run(llm, prompts, params, speculative, concurrency, clock)
            rows.append(row)
            replies[(concurrency, row["constrained"], speculative)] = [o.token_ids for o in outs]
    print(f"{'C':>2} {'setting':<20} {'tok/s':>7} {'tau':>6} {'masks':>6} {'valid':>6}")
    for row in rows:
        name = ("json " if row["constrained"] else "free ") + ("DFlash" if row["speculative"] else "plain")
        print(f"{row['concurrency']:>2} {name:<20} {row['tok_per_s']:>7} {row['tau'] or '-':>6} "
              f"{row['mask_share']:>6} {row['valid_json']:>3}/{len(prompts)}")
    lossless = all(replies[(c, True, True)] == replies[(c, True, False)] for c in sorted({1, args.concurrency}))
    if args.json:
        args.json.write_text(json.dumps({"schema": SCHEMA, "prompts": prompts, "max_tokens": args.max_tokens,
                                         "target": args.target, "backend": llm.backend, "rows": rows,
                                         "constrained_dflash_equals_plain": lossless,
                                         "environment": environment()}, indent=1) + "\n")
    if not lossless:
        print("constrained DFlash replies differ from constrained plain ones", file=sys.stderr)
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())

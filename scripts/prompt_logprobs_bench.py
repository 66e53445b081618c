"""Prompt scoring, measured: what SamplingParams.prompt_logprobs costs a prefill, and what it gives.

The same prompts through one LLM's C++ core, one output token each (what lm-evaluation-harness's
log-likelihood requests are), at concurrency C: plain prefills, then prefills scoring every prompt token
(prompt_logprobs n: every position's logits, a Run of their own, 256 tokens a step). Per setting: prompt
tokens per second of wall time. The scored run's per-token log-probabilities give the prompts' mean
negative log-likelihood (and perplexity); its first tokens must equal the plain run's, else it exits with
status 3. Prints a table and writes JSON.

    python3 scripts/prompt_logprobs_bench.py [--target smollm2-135m] [--backend auto] [--dataset humaneval]
        [--num-prompts 16] [--top 1] [--concurrency 4] [--json docs/bench/prompt-logprobs-smollm2-135m.json]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

from dflash_trt import LLM, SamplingParams
from dflash_trt.bench.datasets import load_prompts
from dflash_trt.bench.report import environment
from dflash_trt.runtime.batch_runner import BatchRunner


def run(llm: LLM, prompts: list[str], params: SamplingParams, concurrency: int) -> tuple[dict, list]:
    runner = BatchRunner(llm, max_batch=concurrency, capacity=llm.capacity, prefix_caching=False)
    runner.run(prompts[:1], params)  # untimed: lazy set-up
    outs, start = [], time.perf_counter()
    for at in range(0, len(prompts), concurrency):
        outs += runner.run(prompts[at:at + concurrency], params)
    wall = time.perf_counter() - start
    tokens = sum(len(o.prompt_token_ids) for o in outs)
    return {"concurrency": concurrency, "prompt_logprobs": params.prompt_logprobs, "prompt_tokens": tokens,
            "wall_s": round(wall, 3), "prompt_tok_per_s": round(tokens / wall, 1)}, outs


def nll(outs) -> float:
    """Mean negative log-likelihood per scored prompt token."""
    scores = [entries[token] for o in outs for token, entries in zip(o.prompt_token_ids[1:], o.prompt_logprobs[1:])]
    return -sum(scores) / len(scores)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default="smollm2-135m")
    parser.add_argument("--backend", default="auto")
    parser.add_argument("--dataset", default="humaneval")
    parser.add_argument("--num-prompts", type=int, default=16)
    parser.add_argument("--top", type=int, default=1, help="prompt_logprobs n")
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    llm = LLM(args.target, backend=args.backend)
    prompts = load_prompts(args.dataset, args.num_prompts)
    rows, firsts, scored = [], {}, None
    for concurrency in sorted({1, args.concurrency}):
        for top in (None, args.top):
            row, outs = run(llm, prompts, SamplingParams(max_tokens=1, prompt_logprobs=top), concurrency)
            rows.append(row)
            firsts[(concurrency, top)] = [o.token_ids for o in outs]
            if top is not None:
                row["mean_nll"] = round(nll(outs), 4)
                scored = scored or row
    print(f"{'C':>2} {'setting':<18} {'prompt tok/s':>13} {'nll':>7}")
    for row in rows:
        name = "plain prefill" if row["prompt_logprobs"] is None else f"prompt_logprobs={row['prompt_logprobs']}"
        print(f"{row['concurrency']:>2} {name:<18} {row['prompt_tok_per_s']:>13} {row.get('mean_nll', '-'):>7}")
    same = all(firsts[(c, None)] == firsts[(c, args.top)] for c in sorted({1, args.concurrency}))
    if args.json:
        args.json.write_text(json.dumps({
            "target": args.target, "backend": llm.backend, "dataset": args.dataset, "prompts": len(prompts),
            "rows": rows, "perplexity": round(math.exp(scored["mean_nll"]), 3), "first_tokens_equal": same,
            "environment": environment()}, indent=1) + "\n")
    if not same:
        print("the scored run's first tokens differ from the plain run's", file=sys.stderr)
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())

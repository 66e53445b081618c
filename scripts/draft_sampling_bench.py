"""Acceptance at T>0 under the two lossless draft rules, on the embedded pair (SmolLM2-135M and our
drafter) and the same prompts: ours drafts the drafter's argmax (a point mass q) and accepts a draft
token with probability p(token), resampling from p without it on a rejection; the DFlash authors' loop
(PyPI `dflash`, `dflash_generate`) samples each draft token from the drafter's own distribution q (the
same temperature, top-k, top-p) and accepts with min(1, p/q), resampling from (p - q)+. Both sample the
target's distribution exactly; they differ in how many tokens a step commits (tau, accepted + 1).
Greedy (T=0) is run both ways too, a check that the two loops draft alike (up to the end of a reply and
float32 near-ties between HF eager and onnxruntime).

    .venv/bin/python scripts/draft_sampling_bench.py [--temperature 0.7] [--prompts 10] [--max-tokens 64]
        [--seeds 0,1] [--json out.json]

The authors' loop is HF eager PyTorch on the CPU: slow (seconds per request); ours runs on onnxruntime.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch


def authors_taus(draft, target, ids: list[int], max_tokens: int, temperature: float, seed: int,
                 eos: int) -> list[int]:
    import dflash.model as reference

    reference._cuda_time = time.perf_counter  # its stats synchronise CUDA; this CPU has none
    torch.manual_seed(seed)
    result = reference.dflash_generate(draft, target, torch.tensor([ids]), max_tokens, [eos],
                                       temperature=temperature, return_stats=True)
    return result.acceptance_lengths


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--prompts", type=int, default=10, help="per dataset (HumanEval, MT-Bench)")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--seeds", default="0,1")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()

    from dflash.model import DFlashDraftModel
    from transformers import AutoModelForCausalLM

    from dflash_trt import LLM, SamplingParams
    from dflash_trt.bench.datasets import load_prompts
    from dflash_trt.models.embedded import DEFAULT_TARGET, default_drafter, embedded_target_dir

    target_dir, draft_dir = embedded_target_dir(DEFAULT_TARGET), default_drafter(DEFAULT_TARGET)
    draft = DFlashDraftModel.from_pretrained(draft_dir, dtype=torch.float32).eval()
    ours = LLM(str(target_dir), str(draft_dir), block_size=draft.block_size)  # the authors' block, not adaptive
    target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
    eos = ours.tokenizer.eos_token_id
    seeds = [int(s) for s in args.seeds.split(",")]
    rows = []
    for dataset in ("humaneval", "mt-bench"):
        for prompt in load_prompts(dataset, args.prompts):
            ids = ours.encode(prompt)
            for temperature, run_seeds in ((0.0, seeds[:1]), (args.temperature, seeds)):
                for seed in run_seeds:
                    params = SamplingParams(max_tokens=args.max_tokens, temperature=temperature, seed=seed)
                    mine = ours.generate(ids, params)[0].metrics.acceptance_lengths
                    theirs = authors_taus(draft, target, ids, args.max_tokens, temperature, seed, eos)
                    rows.append({"dataset": dataset, "temperature": temperature, "seed": seed,
                                 "point_mass": mine, "drafter_distribution": theirs})
                    print(f"{dataset} T={temperature} seed {seed}: point mass tau "
                          f"{statistics.fmean(mine):.2f} ({len(mine)} steps), drafter's q "
                          f"{statistics.fmean(theirs):.2f} ({len(theirs)} steps)", file=sys.stderr)
    # a reply's last step is cut short by its end (max_tokens or a stop token), whichever rule ran it
    summary = {}
    for dataset in ("humaneval", "mt-bench", "all"):
        for temperature in (0.0, args.temperature):
            picked = [r for r in rows if r["temperature"] == temperature and dataset in ("all", r["dataset"])]
            summary[f"{dataset} T={temperature}"] = {
                rule: round(statistics.fmean([t for r in picked for t in r[rule][:-1]]), 3)
                for rule in ("point_mass", "drafter_distribution")}
    print(f"embedded pair, block {draft.block_size}, {args.prompts} prompts a dataset, {args.max_tokens} tokens, "
          f"seeds {seeds}: mean tau over the steps before each reply's last")
    print(f"{'':>22} {'point mass (ours)':>18} {'drafter q (authors)':>20}")
    for key, value in summary.items():
        print(f"{key:>22} {value['point_mass']:>18.3f} {value['drafter_distribution']:>20.3f}")
    if args.json:
        args.json.write_text(json.dumps({"command": " ".join(sys.argv), "summary": summary, "runs": rows},
                                        indent=1) + "\n")


if __name__ == "__main__":
    main()

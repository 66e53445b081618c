"""Acceptance and speed at T>0 under the two lossless draft rules, on the embedded pair (SmolLM2-135M and
our drafter) and the same prompts, on the C++ onnxruntime executor: point mass (LLM's default: drafts
are the drafter's argmax, a draft kept with probability p(token), a rejection resampled from p without
it) and the drafter's distribution (draft_rule="drafter": each draft drawn from the drafter's own q under
the same temperature, top-k and top-p, kept with min(1, p/q), a rejection drawn from (p - q)+). Both
sample the target's distribution exactly; they differ in how many tokens a step commits (tau, accepted
+ 1) and in what a step costs. Optionally the DFlash authors' own loop (PyPI `dflash`,
`dflash_generate`: the drafter-distribution rule in HF eager PyTorch, seconds per request) at the
drafter's block, as the reference for tau. Greedy (T=0) runs once per prompt and block: the rules
draft alike there (the check that they are wired alike).

    .venv/bin/python scripts/draft_sampling_bench.py [--temperature 0.7] [--prompts 10] [--max-tokens 64]
        [--seeds 0,1] [--blocks 4,16] [--authors] [--json out.json]

Requests run one at a time (concurrency 1). Decode tok/s = output tokens after the first / decode
seconds, summed over the requests of a configuration.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch

RULES = ("point-mass", "drafter")


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
    parser.add_argument("--blocks", default="4,16", help="fixed verify blocks (the drafter rule needs one)")
    parser.add_argument("--authors", action="store_true", help="also the authors' loop at the drafter's block (slow)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()

    from dflash_trt import LLM, SamplingParams
    from dflash_trt.bench.datasets import load_prompts
    from dflash_trt.models.embedded import DEFAULT_TARGET, default_drafter, embedded_target_dir

    target_dir, draft_dir = embedded_target_dir(DEFAULT_TARGET), default_drafter(DEFAULT_TARGET)
    blocks = [int(b) for b in args.blocks.split(",")]
    seeds = [int(s) for s in args.seeds.split(",")]
    configs = {f"{rule} B={b}": LLM(str(target_dir), str(draft_dir), block_size=b, draft_rule=rule)
               for b in blocks for rule in RULES}
    configs["point-mass adaptive"] = LLM(str(target_dir), str(draft_dir))  # the default: blocks chosen per step
    any_llm = next(iter(configs.values()))
    authors = None
    if args.authors:
        from dflash.model import DFlashDraftModel
        from transformers import AutoModelForCausalLM

        draft = DFlashDraftModel.from_pretrained(draft_dir, dtype=torch.float32).eval()
        target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
        authors = (draft, target)
    eos = any_llm.tokenizer.eos_token_id
    rows = []
    for dataset in ("humaneval", "mt-bench"):
        for prompt in load_prompts(dataset, args.prompts):
            ids = any_llm.encode(prompt)
            for temperature, run_seeds in ((0.0, seeds[:1]), (args.temperature, seeds)):
                for seed in run_seeds:
                    params = SamplingParams(max_tokens=args.max_tokens, temperature=temperature, seed=seed)
                    for name, llm in configs.items():
                        if temperature == 0.0 and name.startswith("drafter"):
                            continue  # greedy drafts the argmax under either rule
                        out = llm.generate(ids, params)[0]
                        rows.append({"dataset": dataset, "temperature": temperature, "seed": seed, "config": name,
                                     "taus": out.metrics.acceptance_lengths,
                                     "decode_tokens": len(out.token_ids) - 1, "decode_s": out.metrics.decode_s})
                    if authors is not None and temperature > 0:
                        rows.append({"dataset": dataset, "temperature": temperature, "seed": seed,
                                     "config": f"authors' loop B={authors[0].block_size}",
                                     "taus": authors_taus(*authors, ids, args.max_tokens, temperature, seed, eos)})
            print(f"{dataset}: {prompt[:40]!r} done", file=sys.stderr)
    # a reply's last step is cut short by its end (max_tokens or a stop token), whichever rule ran it
    summary = {}
    names = list(dict.fromkeys(r["config"] for r in rows))
    for dataset in ("humaneval", "mt-bench", "all"):
        for temperature in (0.0, args.temperature):
            for name in names:
                picked = [r for r in rows if r["config"] == name and r["temperature"] == temperature
                          and dataset in ("all", r["dataset"])]
                if not picked:
                    continue
                entry = {"tau": round(statistics.fmean([t for r in picked for t in r["taus"][:-1]]), 3)}
                if "decode_s" in picked[0]:
                    entry["decode_tok_s"] = round(sum(r["decode_tokens"] for r in picked)
                                                  / sum(r["decode_s"] for r in picked), 1)
                summary[f"{dataset} T={temperature} {name}"] = entry
    print(f"embedded pair, onnxruntime executor, {args.prompts} prompts a dataset, {args.max_tokens} tokens, seeds "
          f"{seeds}, concurrency 1: mean tau over the steps before each reply's last, decode tok/s")
    for key, value in summary.items():
        print(f"{key:>48} tau {value['tau']:.3f}" + (f"  {value['decode_tok_s']:6.1f} tok/s" if "decode_tok_s" in value else ""))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"command": " ".join(["scripts/draft_sampling_bench.py", *sys.argv[1:]]), "summary": summary,
                       "runs": rows}, f, indent=1)
            f.write("\n")


if __name__ == "__main__":
    main()

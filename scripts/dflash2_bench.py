"""What DFlash2's parts add to a draft step on the C++ onnxruntime executor: the embedded pair's
drafter (its weights, its draft vocabulary) against its DFlash2 twin (the same weights plus the
in-block convolutions and the candidate selector at the published settings: 2 taps per 16
channels, selector rank 256, top-16 candidates; random, since only the cost is measured), both
exported as `slots` bundles with the embedded SmolLM2-135M target, one row of --cached tokens.

The methods are timed in turns (each round runs every method's draft, then every method's whole
step, in a shuffled order), so a machine that slows down or speeds up during the run weighs on all
of them alike; a draft is the block pass and the selector walk, a step injects the committed
position, drafts, verifies and commits one token.

    .venv/bin/python scripts/dflash2_bench.py [--blocks 4,16] [--cached 256] [--rounds 200] [--parts] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch

PUBLISHED = dict(conv_kernel_size=2, conv_group_size=16, selector_rank=256, selector_top_k=16)


def twin_bundles(root: Path, parts: bool = False) -> dict[str, Path]:
    """The v1 drafter and its DFlash2 twin as slots bundles; with `parts`, also the twin with its
    convolutions alone ("convolutions": no selector, argmax drafts) and with its selector alone
    ("selector": no convolutions), to see which part costs what."""
    from dflash_trt.export.bundle import export_bundle
    from dflash_trt.models import embedded
    from dflash_trt.models.checkpoints import load_drafter, load_target
    from dflash_trt.models.drafter import DFlashDrafter

    target, tokenizer = load_target(str(embedded.embedded_target_dir(embedded.DEFAULT_TARGET)))
    v1 = load_drafter(embedded.default_drafter(embedded.DEFAULT_TARGET))
    config = replace(v1.config, **PUBLISHED, vocab_size=v1.config.vocab_size or target.vocab_size)

    def twin():
        torch.manual_seed(0)
        v2 = DFlashDrafter(config)
        v2.load_state_dict(v1.state_dict(), strict=False)  # the shared weights; conv and selector stay random
        v2.draft_vocab = v1.draft_vocab
        return v2.eval()

    drafters = {"dflash": v1, "dflash2": twin()}
    if parts:
        drafters["convolutions"] = convolutions = twin()
        del convolutions.candidate_selector
        convolutions.config = v1.config  # a DFlash head (argmax drafts); its layers keep their convolutions
        drafters["selector"] = selector = twin()
        for layer in selector.layers:
            del layer.attention_conv, layer.mlp_conv
    return {name: export_bundle(target, drafter, tokenizer, root / name, flavour="slots", check=False)
            for name, drafter in drafters.items()}


def timed_in_turns(bundles: dict[str, Path], cached: int, block: int, rounds: int) -> dict[str, dict]:
    """method -> the draft's and the step's times (ms: median, p25, min) over `rounds` turns."""
    from dflash_trt.runtime.ort_executor import ort_executor

    calls = {}
    for name, bundle in bundles.items():
        executor = ort_executor(bundle, max_batch=1, capacity=cached + block + rounds + 2)
        rng = random.Random(0)
        prompt = [rng.randrange(executor.config.vocab) for _ in range(cached)]
        executor.prefill_logits([0], [prompt])
        bonus, verified = [prompt[-1]], [[prompt[-1]] + prompt[: block - 1]]
        executor.draft([0], bonus, block)  # injects the prompt's features once

        def draft(executor=executor, bonus=bonus):
            executor.draft([0], bonus, block)

        def step(executor=executor, bonus=bonus, verified=verified):
            executor.draft([0], bonus, block)
            executor.verify_logits([0], verified)
            executor.commit([0], [1])

        calls[name] = {"draft": draft, "step": step}
    times = {name: {"draft": [], "step": []} for name in bundles}
    order = random.Random(1)
    for _ in range(rounds):
        for phase in ("draft", "step"):
            names = list(calls)
            order.shuffle(names)
            for name in names:
                start = time.perf_counter()
                calls[name][phase]()
                times[name][phase].append((time.perf_counter() - start) * 1e3)
    return {name: {f"{phase}_{stat}_ms": value for phase, t in phases.items()
                   for stat, value in (("median", statistics.median(t)), ("p25", sorted(t)[len(t) // 4]),
                                       ("min", min(t)))}
            for name, phases in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--blocks", default="4,16")
    parser.add_argument("--cached", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--parts", action="store_true",
                        help="also the twin with only its convolutions and with only its selector")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        bundles = twin_bundles(Path(tmp), args.parts)
        for block in (int(b) for b in args.blocks.split(",")):
            timed = timed_in_turns(bundles, args.cached, block, args.rounds)
            v1 = timed["dflash"]
            for method, t in timed.items():
                over = {f"{phase}_{stat}_over_dflash": t[f"{phase}_{stat}_ms"] / v1[f"{phase}_{stat}_ms"] - 1
                        for phase in ("draft", "step") for stat in ("median", "min")}
                rows.append({"method": method, "block": block, "cached": args.cached, "rounds": args.rounds, **t,
                             **over})
    print(f"embedded pair, 1 row, {args.cached} cached, {args.rounds} rounds in turns "
          f"({platform.processor() or platform.machine()}); ms median / min, and over the DFlash twin's")
    print(f"{'method':>12} {'B':>3} {'draft ms':>15} {'over dflash':>15} {'step ms':>15} {'over dflash':>15}")
    for r in rows:
        cols = [f"{r[f'{p}_median_ms']:>7.2f} /{r[f'{p}_min_ms']:>6.2f} "
                f"{r[f'{p}_median_over_dflash']:>+7.1%} /{r[f'{p}_min_over_dflash']:>+6.1%}" for p in ("draft", "step")]
        print(f"{r['method']:>12} {r['block']:>3} {' '.join(cols)}")
    if args.json:
        args.json.write_text(json.dumps({"command": " ".join(sys.argv), "published_settings": PUBLISHED,
                                         "results": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()

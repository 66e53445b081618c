"""What DFlash2's parts add to a draft step on the C++ onnxruntime executor: a DFlash drafter against
its DFlash2 twin (the same weights plus the in-block convolutions and the candidate selector at the
published settings: 2 taps per 16 channels, selector rank 256, top-16 candidates; random, since only
the cost is measured), both exported as `slots` bundles with their target, one row of --cached
tokens. --pair embedded: the SmolLM2-135M pair's drafter (its weights, its draft vocabulary);
qwen3-4b-drafter: a drafter of a published one's shapes (Qwen3-4B-DFlash-b16), random weights.

The methods are timed in turns (each round runs every method's draft, then every method's whole
step, in a shuffled order), so a machine that slows down or speeds up during the run weighs on all
of them alike; a draft is the block pass and the selector walk, a step injects the committed
position, drafts, verifies and commits one token.

    .venv/bin/python scripts/dflash2_bench.py [--pair embedded] [--blocks 4,16] [--cached 256] [--rounds 200] [--parts]
        [--json out.json]
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


# The shapes of z-lab's Qwen3-4B-DFlash-b16 (5 layers, 2560 wide, Qwen3's vocabulary), with random weights,
# beside a target of its width whose 5 layers are as thin as they may be (only their features reach the
# drafter) and whose head is tied: the draft step at a published drafter's size, in less memory.
QWEN3_4B_DRAFTER = dict(hidden_size=2560, intermediate_size=9728, num_attention_heads=32, num_key_value_heads=8,
                        head_dim=128, vocab_size=151936)


def embedded_pair():
    """(target, tokenizer, v1 drafter): the embedded SmolLM2-135M pair."""
    from dflash_trt.models import embedded
    from dflash_trt.models.checkpoints import load_drafter, load_target

    target, tokenizer = load_target(str(embedded.embedded_target_dir(embedded.DEFAULT_TARGET)))
    return target, tokenizer, load_drafter(embedded.default_drafter(embedded.DEFAULT_TARGET))


def qwen3_4b_drafter_pair():
    """(target, None, v1 drafter) of QWEN3_4B_DRAFTER's shapes, random weights."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from dflash_trt.models.draft_config import DraftConfig
    from dflash_trt.models.drafter import DFlashDrafter
    from dflash_trt.models.target import TargetModel

    shape = QWEN3_4B_DRAFTER
    config = Qwen3Config(**{**shape, "intermediate_size": 64}, num_hidden_layers=5, tie_word_embeddings=True)
    torch.manual_seed(0)
    target = Qwen3ForCausalLM(config)
    raw = dict(shape, num_hidden_layers=5, rms_norm_eps=1e-6, rope_theta=1e6, max_position_embeddings=40960,
               architectures=["DFlashDraftModel"], model_type="qwen3",
               dflash_config=dict(block_size=16, mask_token_id=shape["vocab_size"] - 1,
                                  target_layer_ids=[0, 1, 2, 3, 4]))
    raw.pop("vocab_size")
    drafter = DFlashDrafter(DraftConfig.from_dict(raw)).eval()
    return TargetModel(target), None, drafter


PAIRS = {"embedded": embedded_pair, "qwen3-4b-drafter": qwen3_4b_drafter_pair}


def twin_bundles(root: Path, parts: bool = False, pair: str = "embedded") -> dict[str, Path]:
    """The v1 drafter of PAIRS[pair] and its DFlash2 twin as slots bundles; with `parts`, also the twin
    with its convolutions alone ("convolutions": no selector, argmax drafts) and with its selector alone
    ("selector": no convolutions), to see which part costs what."""
    from dflash_trt.export.bundle import export_bundle
    from dflash_trt.models.drafter import DFlashDrafter

    target, tokenizer, v1 = PAIRS[pair]()
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
    bundles = {}
    for name in list(drafters):  # one drafter in memory beside its export at a time
        bundles[name] = export_bundle(target, drafters.pop(name), tokenizer, root / name, flavour="slots", check=False)
    return bundles


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
    parser.add_argument("--pair", choices=list(PAIRS), default="embedded",
                        help="embedded: the SmolLM2-135M pair's drafter; qwen3-4b-drafter: a drafter of "
                             "Qwen3-4B-DFlash-b16's shapes, random weights")
    parser.add_argument("--parts", action="store_true",
                        help="also the twin with only its convolutions and with only its selector")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        bundles = twin_bundles(Path(tmp), args.parts, args.pair)
        for block in (int(b) for b in args.blocks.split(",")):
            timed = timed_in_turns(bundles, args.cached, block, args.rounds)
            v1 = timed["dflash"]
            for method, t in timed.items():
                over = {f"{phase}_{stat}_over_dflash": t[f"{phase}_{stat}_ms"] / v1[f"{phase}_{stat}_ms"] - 1
                        for phase in ("draft", "step") for stat in ("median", "min")}
                rows.append({"method": method, "block": block, "cached": args.cached, "rounds": args.rounds, **t,
                             **over})
    print(f"{args.pair} pair, 1 row, {args.cached} cached, {args.rounds} rounds in turns "
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

"""What a hybrid target's step costs in each form we run it: a random Qwen3.5-shaped target (Gated
DeltaNet layers, every 4th full attention), exported portable (the recurrence as an ONNX Loop) and
plugin (one dflash::GatedDeltaRule node per layer, the op library's CPU kernel), against the torch
backend, whose rollback after a partial acceptance restores a snapshot and re-feeds the kept tokens.

For one request: a prefill of --prompt tokens, and a verify of --block tokens followed by a commit
of --keep of them (a partial acceptance: the rollback is part of the step). Median / min over
--repeats. Prints a table and writes JSON (--json). Weights are random: this measures time, not
acceptance.

    .venv/bin/python scripts/bench_hybrid_step.py [--prompt 256] [--block 16] [--keep 5] [--repeats 10]

--slots DIR also exports the same target as a slots bundle (graph contract 2) to DIR, for the C++
executor's batched phases: scripts/bench_ort_executor.py DIR.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import tempfile
from pathlib import Path

import torch
from bench_ort_executor import timed as median_min  # scripts/ is on sys.path when a script runs
from transformers import AutoModelForCausalLM
from transformers.models.qwen3_5 import Qwen3_5TextConfig

from dflash_trt.export import op_library
from dflash_trt.export.bundle import export_bundle
from dflash_trt.models.checkpoints import load_target
from dflash_trt.models.draft_config import DraftConfig
from dflash_trt.models.drafter import DFlashDrafter
from dflash_trt.runtime.ort_backend import OrtBundle, OrtTargetSession

SHAPE = dict(vocab_size=4096, hidden_size=512, intermediate_size=1024, num_hidden_layers=8, num_attention_heads=8,
             num_key_value_heads=2, head_dim=64, linear_conv_kernel_dim=4, linear_key_head_dim=64,
             linear_value_head_dim=64, linear_num_key_heads=4, linear_num_value_heads=8,
             layer_types=["linear_attention"] * 3 + ["full_attention"] + ["linear_attention"] * 3 + ["full_attention"],
             max_position_embeddings=4096)


def make_pair(root: Path):
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(Qwen3_5TextConfig(**SHAPE), dtype=torch.float32)
    model.save_pretrained(root / "target")
    target, _ = load_target(str(root / "target"))
    draft = DraftConfig.from_dict({
        "architectures": ["DFlashDraftModel"], "model_type": "qwen3", "hidden_size": 512, "intermediate_size": 1024,
        "num_hidden_layers": 1, "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 64,
        "vocab_size": SHAPE["vocab_size"], "rms_norm_eps": 1e-6, "rope_theta": 1e6, "max_position_embeddings": 4096,
        "block_size": 16, "dflash_config": {"mask_token_id": 5, "target_layer_ids": [1, 6]}})
    return target, DFlashDrafter(draft).eval()


def timed(step, repeats: int) -> dict:
    median, least = median_min(step, repeats)  # after a warm-up: onnxruntime plans a new shape on its first run
    return {"median_ms": round(median, 2), "min_ms": round(least, 2)}


def measure_bundle(path: Path, prompt: list[int], block: list[int], keep: int, repeats: int) -> dict:
    bundle = OrtBundle(path)

    def prefill():
        OrtTargetSession(bundle).prefill(prompt)

    session = OrtTargetSession(bundle)
    session.prefill(prompt)
    committed = (list(session.past), session.length)

    def verify():
        session.past, session.length = list(committed[0]), committed[1]
        session.forward(block)
        session.commit(keep)  # picks the states after position keep - 1: nothing re-fed

    return {"prefill": timed(prefill, repeats), "verify+commit": timed(verify, repeats)}


def measure_torch(target, prompt: list[int], block: list[int], keep: int, repeats: int) -> dict:
    import copy

    def prefill():
        cache = target.new_cache()
        target.forward(prompt, cache, last_logits_only=True)
        target.commit(cache, len(prompt))

    cache = target.new_cache()
    target.forward(prompt, cache, last_logits_only=True)
    target.commit(cache, len(prompt))

    def verify():
        state = copy.copy(cache)
        state.kv = copy.deepcopy(cache.kv)
        target.forward(block, state)
        target.commit(state, keep)  # restores the snapshot and re-feeds the kept tokens

    return {"prefill": timed(prefill, repeats), "verify+commit": timed(verify, repeats)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompt", type=int, default=256)
    parser.add_argument("--block", type=int, default=16)
    parser.add_argument("--keep", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--slots", type=Path, help="also export the target as a slots bundle here")
    args = parser.parse_args()
    if not 1 <= args.keep <= args.block:
        parser.error(f"--keep must be between 1 and --block ({args.block}), got {args.keep}")
    rng = random.Random(0)
    prompt = [rng.randrange(SHAPE["vocab_size"]) for _ in range(args.prompt)]
    block = [rng.randrange(SHAPE["vocab_size"]) for _ in range(args.block)]
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        target, drafter = make_pair(root)
        rows["torch (snapshot + re-feed)"] = measure_torch(target, prompt, block, args.keep, args.repeats)
        flavours = ["portable"] + (["plugin"] if op_library.LIBRARY.is_file() else [])
        for flavour in flavours:
            path = export_bundle(target, drafter, None, root / flavour, flavour=flavour, check=False)
            name = "onnxruntime portable (ONNX Loop)" if flavour == "portable" else "onnxruntime plugin (GatedDeltaRule op)"
            rows[name] = measure_bundle(path, prompt, block, args.keep, args.repeats)
        if args.slots:
            export_bundle(target, drafter, None, args.slots, flavour="slots", check=False)
    print(f"hybrid target {SHAPE['hidden_size']} hidden, {SHAPE['num_hidden_layers']} layers (6 Gated DeltaNet), "
          f"prefill {args.prompt}, verify {args.block} keep {args.keep}; median (min) ms over {args.repeats}")
    print(f"{'form':<42}{'prefill':>20}{'verify+commit':>20}")
    for name, row in rows.items():
        cells = [f"{row[k]['median_ms']} ({row[k]['min_ms']})" for k in ("prefill", "verify+commit")]
        print(f"{name:<42}{cells[0]:>20}{cells[1]:>20}")
    if args.json:
        args.json.write_text(json.dumps({
            "command": "scripts/bench_hybrid_step.py " + " ".join(f"--{k} {v}" for k, v in
                                                                   (("prompt", args.prompt), ("block", args.block),
                                                                    ("keep", args.keep), ("repeats", args.repeats))),
            "machine": {"cpu_count": __import__("os").cpu_count(), "platform": platform.platform()},
            "target_shape": SHAPE, "results": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()

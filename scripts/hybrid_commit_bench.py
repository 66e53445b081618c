"""What a hybrid target's verify and commit cost on the C++ onnxruntime executor, by how much of the
block the commit keeps: a random-weight Qwen3.5-shaped target (Gated DeltaNet layers with a full
attention layer every 4th) and a one-layer drafter, exported as a `slots` bundle; after --cached
tokens, each repeat verifies a block of --block tokens and commits `kept` of them (the whole block:
the graph's own states; fewer: the states rebuilt at commit, csrc/state_rebuild.h). Prints a table
and writes JSON (--json).

    .venv/bin/python scripts/hybrid_commit_bench.py [--block 16] [--kept 1,8,16] [--json out.json]
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
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from real_width_bench import random_drafter, random_target  # noqa: E402

# A 1.4 GB float32 target: Qwen3.5's layer kinds at a mid width (recurrent state 1 MiB per layer)
SHAPE = dict(
    model_type="qwen3_5_text", full_layers=4, pattern=["linear_attention"] * 3 + ["full_attention"],
    config=dict(hidden_size=1024, num_attention_heads=8, num_key_value_heads=2, head_dim=128, vocab_size=32000,
                intermediate_size=3072, linear_conv_kernel_dim=4, linear_key_head_dim=128, linear_value_head_dim=128,
                linear_num_key_heads=8, linear_num_value_heads=16, tie_word_embeddings=False))


def measure(bundle: Path, cached: int, block: int, kept: list[int], repeats: int) -> list[dict]:
    from dflash_trt.runtime.ort_executor import ort_executor

    executor = ort_executor(bundle, max_batch=1, capacity=cached + (repeats + 2) * len(kept) * block + block)
    rng = random.Random(0)
    vocab = executor.config.vocab
    executor.prefill_logits([0], [[rng.randrange(vocab) for _ in range(cached)]])
    rows = []
    for keep in kept:
        verify, commit = [], []
        for repeat in range(repeats + 1):  # the first is a warm-up
            blocks = [[rng.randrange(vocab) for _ in range(block)]]
            start = time.perf_counter()
            executor.verify_logits([0], blocks)
            middle = time.perf_counter()
            executor.commit([0], [keep])
            end = time.perf_counter()
            if repeat:
                verify.append((middle - start) * 1e3)
                commit.append((end - middle) * 1e3)
        rows.append({"kept": keep, "verify_ms": statistics.median(verify), "verify_min_ms": min(verify),
                     "commit_ms": statistics.median(commit), "commit_min_ms": min(commit)})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--block", type=int, default=16)
    parser.add_argument("--kept", default="1,8,16")
    parser.add_argument("--cached", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    from dflash_trt.export.bundle import export_bundle

    with tempfile.TemporaryDirectory() as tmp:
        target = random_target(SHAPE, SHAPE["full_layers"], torch.float32)
        drafter = random_drafter(SHAPE, SHAPE["full_layers"], torch.float32)
        bundle = export_bundle(target, drafter, None, Path(tmp) / "bundle", flavour="slots", check=False)
        rows = measure(bundle, args.cached, args.block, [int(k) for k in args.kept.split(",")], args.repeats)
    print(f"hybrid target (3 Gated DeltaNet + 1 attention layers, hidden 1024), 1 row, {args.cached} cached, "
          f"verify of {args.block} ({platform.processor() or platform.machine()}); ms, median / min")
    print(f"{'kept':>5} {'verify ms':>17} {'commit ms':>17}")
    for r in rows:
        print(f"{r['kept']:>5} {r['verify_ms']:>8.2f} /{r['verify_min_ms']:>7.2f} {r['commit_ms']:>8.3f} /{r['commit_min_ms']:>7.3f}")
    if args.json:
        args.json.write_text(json.dumps({"command": " ".join(sys.argv), "shape": SHAPE, "block": args.block,
                                         "cached": args.cached, "results": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()

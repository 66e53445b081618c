"""Sparse MoE on the C++ onnxruntime executor: random-weight Qwen3-MoE targets of one width, each
with its own expert count (top-k fixed), exported as `slots` bundles and timed on the C++ onnxruntime executor: a verify of B tokens after
--cached tokens (B=1 is a plain decoding step), committed with nothing kept so every repeat runs at
the same length.

The exported MoE reads the experts a call's tokens picked (export/moe.py), so a decode step should
cost about the same with 2 experts as with 64; routing every token through every expert would make
the 64-expert step ~32x the 2-expert one. --form standard-ops exports the MoE layers in the
standard-op form the TensorRT flavours use (into the same slots bundle) instead of onnxruntime's
MoE kernel, to compare the two on one executor.

    .venv/bin/python scripts/moe_bench.py [--experts 2,64] [--top-k 2] [--blocks 1,16] [--form onnxruntime-moe]
                                          [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from bench_ort_executor import timed  # noqa: E402

WIDTH = dict(hidden_size=1024, num_attention_heads=8, num_key_value_heads=4, head_dim=128, moe_intermediate_size=512,
             intermediate_size=2048, vocab_size=32000)


def random_moe_bundle(out: Path, experts: int, top_k: int, layers: int, form: str) -> Path:
    """A random Qwen3-MoE target (`experts`, top `top_k`) and a one-layer drafter of its width -> slots bundle."""
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    from dflash_trt.export import bundle
    from dflash_trt.export.bundle import export_bundle
    from dflash_trt.models.draft_config import DraftConfig
    from dflash_trt.models.drafter import DFlashDrafter
    from dflash_trt.models.target import TargetModel

    config = Qwen3MoeConfig(**WIDTH, num_hidden_layers=layers, num_experts=experts, num_experts_per_tok=top_k,
                            norm_topk_prob=True, rms_norm_eps=1e-6, tie_word_embeddings=False)
    torch.manual_seed(0)
    model = Qwen3MoeForCausalLM(config)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.02)
    raw = {k: v for k, v in WIDTH.items() if k not in ("vocab_size", "moe_intermediate_size")}
    raw |= dict(num_hidden_layers=1, rms_norm_eps=1e-6, rope_theta=10000.0, max_position_embeddings=4096,
                architectures=["DFlashDraftModel"], model_type="qwen3",
                dflash_config=dict(block_size=16, mask_token_id=WIDTH["vocab_size"] - 1, target_layer_ids=[0, layers - 1]))
    drafter = DFlashDrafter(DraftConfig.from_dict(raw)).eval()
    if form == "standard-ops":
        bundle.use_moe_op = lambda graph, op: None
    return export_bundle(TargetModel(model.eval()), drafter, None, out, flavour="slots", check=False)


def verify_ms(bundle: Path, cached: int, block: int, repeats: int) -> tuple[float, float]:
    """(median, min) ms of one row's verify of `block` tokens after `cached` committed ones."""
    from dflash_trt.runtime.ort_executor import ort_executor

    executor = ort_executor(bundle, max_batch=1, capacity=cached + block + 1)
    rng = random.Random(0)
    executor.prefill_logits([0], [[rng.randrange(executor.config.vocab) for _ in range(cached)]])
    tokens = [[rng.randrange(executor.config.vocab) for _ in range(block)]]

    def verify():
        executor.verify_logits([0], tokens)
        executor.commit([0], [0])

    return timed(verify, repeats)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--experts", default="2,64")
    parser.add_argument("--top-k", type=int, default=2)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--blocks", default="1,16")
    parser.add_argument("--cached", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--form", choices=["onnxruntime-moe", "standard-ops"], default="onnxruntime-moe")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for experts in (int(e) for e in args.experts.split(",")):
            bundle = random_moe_bundle(Path(tmp) / f"e{experts}", experts, args.top_k, args.layers, args.form)
            for block in (int(b) for b in args.blocks.split(",")):
                median, least = verify_ms(bundle, args.cached, block, args.repeats)
                rows.append({"form": args.form, "experts": experts, "top_k": args.top_k, "block": block, "verify_ms": median,
                             "verify_min_ms": least})
    print(f"Qwen3-MoE width {WIDTH['hidden_size']}, {args.layers} layers, MoE as {args.form}, 1 row, {args.cached} cached "
          f"({platform.processor() or platform.machine()}); verify ms, median / min")
    print(f"{'experts':>7} {'top-k':>5} {'B':>3} {'verify ms':>17}")
    for r in rows:
        print(f"{r['experts']:>7} {r['top_k']:>5} {r['block']:>3} {r['verify_ms']:>8.2f} /{r['verify_min_ms']:>7.2f}")
    if args.json:
        args.json.write_text(json.dumps({"command": " ".join(sys.argv), "width": WIDTH, "layers": args.layers,
                                         "cached": args.cached, "results": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()

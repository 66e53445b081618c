"""One sparse MoE layer at a flagship's real width on onnxruntime (CPU), in each form a graph can hold
it: every token through all experts (the dense oracle, tests/export/dense_moe.py), the standard-op
routed form (the TensorRT flavours'), onnxruntime's MoE kernel (the `slots` flavour) and our
dflash::MoE (the `plugin` flavour; its onnxruntime kernel is plugins/moe/moe_cpu.h).
Random weights, so routing is near uniform: a call of T tokens reads about E * (1 - (1 - k/E)^T)
distinct experts (plugins/moe/README.md), its floor on any device. Prints a table, writes JSON.

    .venv/bin/python scripts/moe_layer_bench.py [--preset qwen3.5-35b-a3b] [--tokens 1,16] [--json out.json]

A float32 layer of Qwen3.5-35B-A3B is 3.2 GB; each form is exported and timed in turn.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "export"))  # the dense oracle
from dense_moe import DenseRoutedMoE  # noqa: E402
from real_width_bench import PRESETS  # noqa: E402

FORMS = ("dense", "standard", "onnxruntime", "dflash")


def random_block(preset: dict) -> torch.nn.Module:
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(preset["model_type"], **preset["config"], num_hidden_layers=1, rms_norm_eps=1e-6,
                                  **({"layer_types": ["full_attention"]} if preset["pattern"] else {}))
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    block = model.model.layers[0].mlp.to_empty(device="cpu").float()
    torch.manual_seed(0)
    with torch.no_grad():
        for p in block.parameters():
            p.normal_(0.0, 0.02)
    return block.eval()


def distinct_experts(block: torch.nn.Module, x: torch.Tensor) -> int:
    top_k = block.gate.top_k
    logits = torch.nn.functional.linear(x, block.gate.weight)
    return int(torch.topk(logits, top_k, dim=-1).indices.unique().numel())


def time_form(block, form: str, tokens: list[int], repeats: int, tmp: Path) -> dict:
    import onnxruntime as ort

    from dflash_trt.export.moe import RoutedMoE
    from dflash_trt.export.moe_ops import register_moe_symbolic
    from dflash_trt.export.op_library import session_options

    module = (DenseRoutedMoE if form == "dense" else RoutedMoE)(block).eval()
    module.op = "standard" if form == "dense" else form
    register_moe_symbolic(17)
    path = tmp / f"{form}.onnx"
    hidden = block.gate.weight.shape[1]
    began = time.perf_counter()
    with torch.no_grad():
        torch.onnx.export(module, (torch.randn(1, hidden),), str(path), input_names=["x"], output_names=["y"],
                          dynamic_axes={"x": {0: "t"}, "y": {0: "t"}}, opset_version=17, dynamo=False,
                          custom_opsets={"onnxruntime": {"com.microsoft": 1}, "dflash": {"dflash": 1}}.get(form))
    export_s = time.perf_counter() - began
    session = ort.InferenceSession(str(path), session_options(form == "dflash"), providers=["CPUExecutionProvider"])
    result = {"form": form, "export_s": round(export_s, 1)}
    generator = torch.Generator().manual_seed(1)
    for t in tokens:
        x = torch.randn(t, hidden, generator=generator)
        session.run(None, {"x": x.numpy()})  # warm-up
        times = []
        for _ in range(repeats):
            began = time.perf_counter()
            session.run(None, {"x": x.numpy()})
            times.append((time.perf_counter() - began) * 1e3)
        result[f"tokens_{t}"] = {"ms": round(statistics.median(times), 2), "min_ms": round(min(times), 2),
                                 "distinct_experts": distinct_experts(block, x)}
    del session
    for f in tmp.iterdir():
        f.unlink()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", choices=list(PRESETS), default="qwen3.5-35b-a3b")
    parser.add_argument("--tokens", default="1,16")
    parser.add_argument("--forms", default=",".join(FORMS))
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    preset = PRESETS[args.preset]
    block = random_block(preset)
    tokens = [int(t) for t in args.tokens.split(",")]
    with tempfile.TemporaryDirectory(dir=".") as tmp:
        rows = [time_form(block, form, tokens, args.repeats, Path(tmp)) for form in args.forms.split(",")]
    c = preset["config"]
    expert_bytes = 3 * c["moe_intermediate_size"] * c["hidden_size"] * 4
    print(f"{args.preset}: one MoE layer, float32, {c['num_experts']} experts top-{c['num_experts_per_tok']} "
          f"({expert_bytes / 1e6:.1f} MB an expert), onnxruntime CPU ({platform.processor() or platform.machine()}); "
          f"median ms / min")
    print(f"{'form':>12} " + " ".join(f"{f'{t} tokens':>20}" for t in tokens))
    for r in rows:
        print(f"{r['form']:>12} " + " ".join(f"{r[f'tokens_{t}']['ms']:>10.2f} /{r[f'tokens_{t}']['min_ms']:>8.2f}"
                                             for t in tokens))
    dense = next((r for r in rows if r["form"] == "dense"), None)
    for r in rows:
        if dense and r is not dense:
            print(f"  dense / {r['form']}: " + ", ".join(
                f"{t} tokens {dense[f'tokens_{t}']['ms'] / r[f'tokens_{t}']['ms']:.1f}x" for t in tokens))
    print("  distinct experts read: " + ", ".join(f"{t} tokens {rows[0][f'tokens_{t}']['distinct_experts']}"
                                                 for t in tokens))
    if args.json:
        args.json.write_text(json.dumps({"command": " ".join(sys.argv), "preset": args.preset, "config": preset,
                                         "expert_bytes": expert_bytes, "results": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()

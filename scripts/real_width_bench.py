"""Export and step cost at a flagship MoE's real widths: a random-weight target with the true per-layer
dimensions of Qwen3.5-35B-A3B (or Qwen3-30B-A3B) and only a few of its layers, a one-layer DFlash
drafter of its width. For each dtype it exports a `slots` bundle in a fresh process (peak RSS is that
process's own) and records seconds, peak RSS and bytes; on the float32 bundle it times the C++
onnxruntime executor's verify of 1 and 16 tokens after --cached (another fresh process). Then it
extrapolates to the full layer count: weights and export time per layer, peak RSS per GB of weights.
With --dense it also exports the float32 pair with every MoE layer routed densely (each token through
all experts: the tests' oracle, tests/export/dense_moe.py) and times the same steps, the cost the
routed forms avoid. With --engine-cc CC it also exports the bfloat16 pair as `slots-trt` (--capacity) and builds
TensorRT-RTX engines for compute capability CC from it (`build --engine tensorrt-rtx`), each step in
a fresh process: seconds, peak RSS, engine bytes.

    .venv/bin/python scripts/real_width_bench.py [--preset qwen3.5-35b-a3b] [--layers 2] [--json out.json]
        [--dense] [--engine-cc 12.0 --capacity 4096]

Needs about 2.5x the float32 weights of the few layers in memory and disk (2 layers of
Qwen3.5-35B-A3B: 10.6 GB float32).
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

PRESETS = {
    "qwen3.5-35b-a3b": dict(
        model_type="qwen3_5_moe_text", full_layers=40, pattern=["linear_attention"] * 3 + ["full_attention"],
        config=dict(hidden_size=2048, num_attention_heads=16, num_key_value_heads=2, head_dim=256, vocab_size=248320,
                    linear_conv_kernel_dim=4, linear_key_head_dim=128, linear_value_head_dim=128,
                    linear_num_key_heads=16, linear_num_value_heads=32, num_experts=256, num_experts_per_tok=8,
                    moe_intermediate_size=512, shared_expert_intermediate_size=512, tie_word_embeddings=False)),
    "qwen3-30b-a3b": dict(
        model_type="qwen3_moe", full_layers=48, pattern=None,
        config=dict(hidden_size=2048, num_attention_heads=32, num_key_value_heads=4, head_dim=128, vocab_size=151936,
                    num_experts=128, num_experts_per_tok=8, moe_intermediate_size=768, intermediate_size=6144,
                    norm_topk_prob=True, tie_word_embeddings=False)),
    # the same layer kinds at a tiny width (tests)
    "tiny-qwen3.5-moe": dict(
        model_type="qwen3_5_moe_text", full_layers=4, pattern=["linear_attention"] * 3 + ["full_attention"],
        config=dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=512,
                    linear_conv_kernel_dim=4, linear_key_head_dim=16, linear_value_head_dim=16,
                    linear_num_key_heads=2, linear_num_value_heads=4, num_experts=8, num_experts_per_tok=2,
                    moe_intermediate_size=32, shared_expert_intermediate_size=32, tie_word_embeddings=False)),
}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def random_target(preset: dict, layers: int, dtype: torch.dtype, device: str | torch.device = "cpu"):
    from transformers import AutoConfig, AutoModelForCausalLM

    from dflash_trt.models.target import TargetModel

    extra = {"layer_types": [preset["pattern"][i % 4] for i in range(layers - 1)] + ["full_attention"]} \
        if preset["pattern"] else {}
    config = AutoConfig.for_model(preset["model_type"], **preset["config"], num_hidden_layers=layers,
                                  rms_norm_eps=1e-6, **extra)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    model = model.to_empty(device=device).to(dtype)  # random weights, drawn in place: one copy in memory
    torch.manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.02)
    model.model.rotary_emb = type(model.model.rotary_emb)(config).to(device)  # its buffers, computed
    return TargetModel(model.eval())


def random_drafter(preset: dict, layers: int, dtype: torch.dtype, device: str | torch.device = "cpu"):
    from dflash_trt.models.draft_config import DraftConfig
    from dflash_trt.models.drafter import DFlashDrafter

    c = preset["config"]
    raw = dict(hidden_size=c["hidden_size"], num_attention_heads=c["num_attention_heads"],
               num_key_value_heads=c["num_key_value_heads"], head_dim=c["head_dim"], intermediate_size=4096,
               num_hidden_layers=1, rms_norm_eps=1e-6, rope_theta=10000.0, max_position_embeddings=4096,
               architectures=["DFlashDraftModel"], model_type="qwen3",
               dflash_config=dict(block_size=16, mask_token_id=c["vocab_size"] - 1, target_layer_ids=[0, layers - 1]))
    torch.manual_seed(1)
    return DFlashDrafter(DraftConfig.from_dict(raw)).to(device=device, dtype=dtype).eval()


def export_once(preset_name: str, layers: int, dtype: str, out: Path, flavour: str = "slots",
                capacity: int | None = None, dense: bool = False) -> dict:
    from dflash_trt.export.bundle import export_bundle

    if dense:  # this process only (a child): every routed MoE layer traces as the dense oracle
        from dflash_trt.export.moe import RoutedMoE

        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "export"))
        from dense_moe import DenseRoutedMoE

        RoutedMoE.forward = DenseRoutedMoE.forward
    preset = PRESETS[preset_name]
    target = random_target(preset, layers, DTYPES[dtype])
    drafter = random_drafter(preset, layers, DTYPES[dtype])
    weights = sum(p.numel() * p.element_size() for m in (target.model, drafter) for p in m.parameters())
    began = time.perf_counter()
    export_bundle(target, drafter, None, out, flavour=flavour, check=False, dtype=dtype, capacity=capacity)
    seconds = time.perf_counter() - began
    files = {p.name: p.stat().st_size for p in out.iterdir()}
    embed = preset["config"]["vocab_size"] * preset["config"]["hidden_size"] * DTYPES[dtype].itemsize
    return {"dtype": dtype, "flavour": flavour, "moe": "dense" if dense else "routed", "layers": layers, "export_s": round(seconds, 1), "weight_bytes": weights,
            "embedding_bytes": embed, "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            "bundle_bytes": sum(files.values()), "files": files}


def build_once(bundle: Path, out: Path, compute_capability: str, max_seq_len: int) -> dict:
    """TensorRT-RTX engines (ahead of time, no GPU) of a slots-trt bundle: seconds, peak RSS, bytes."""
    from dflash_trt.engines.build import build_engines
    from dflash_trt.engines.config import BuildConfig

    config = BuildConfig(engine="tensorrt-rtx", compute_capabilities=(compute_capability,), max_batch=8,
                         max_seq_len=max_seq_len)
    began = time.perf_counter()
    build_engines(bundle, out, config)
    files = {p.name: p.stat().st_size for p in out.iterdir()}
    return {"compute_capability": compute_capability, "max_batch": config.max_batch, "max_seq_len": max_seq_len,
            "build_s": round(time.perf_counter() - began, 1),
            "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            "engine_bytes": sum(files.values()), "files": files}


def step_once(bundle: Path, cached: int, repeats: int) -> dict:
    sys.path.insert(0, str(Path(__file__).parent))
    from moe_bench import verify_ms

    return {f"verify_{block}_ms": verify_ms(bundle, cached, block, repeats)[0] for block in (1, 16)}


def child(*args: str) -> dict:
    """This script in a fresh process (its own peak RSS) -> the JSON it prints last."""
    done = subprocess.run([sys.executable, __file__, *args], check=True, capture_output=True, text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", choices=list(PRESETS), default="qwen3.5-35b-a3b")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--dtypes", default="bfloat16,float32")
    parser.add_argument("--cached", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--dense", action="store_true", help="also time the float32 pair with MoE routed densely")
    parser.add_argument("--engine-cc", default=None, help="also build TensorRT-RTX engines for this compute capability")
    parser.add_argument("--capacity", type=int, default=4096, help="with --engine-cc: the slots-trt KV capacity")
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        kind, *rest = args.child
        if kind == "export":
            result = export_once(rest[0], int(rest[1]), rest[2], Path(rest[3]), rest[4], int(rest[5]) or None,
                                 rest[6] == "dense")
        elif kind == "build":
            result = build_once(Path(rest[0]), Path(rest[1]), rest[2], int(rest[3]))
        else:
            result = step_once(Path(rest[0]), int(rest[1]), int(rest[2]))
        print(json.dumps(result))
        return
    preset, runs = PRESETS[args.preset], []
    with tempfile.TemporaryDirectory(dir=".") as tmp:
        for dtype in args.dtypes.split(","):
            out = Path(tmp) / dtype
            run = child("--child", "export", args.preset, str(args.layers), dtype, str(out), "slots", "0", "routed")
            if dtype == "float32":
                run["step"] = child("--child", "step", str(out), str(args.cached), str(args.repeats))
            shutil.rmtree(out)
            per_layer = (run["weight_bytes"] - 2 * run["embedding_bytes"]) / args.layers  # untied embeddings + head
            run["full_model"] = {"layers": preset["full_layers"],
                                 "weight_bytes": 2 * run["embedding_bytes"] + per_layer * preset["full_layers"],
                                 "peak_rss_per_weight_byte": round(run["peak_rss_bytes"] / run["weight_bytes"], 3)}
            run["full_model"]["export_s"] = round(run["export_s"] * run["full_model"]["weight_bytes"]
                                                  / run["weight_bytes"], 0)
            runs.append(run)
        if args.dense:
            out = Path(tmp) / "dense"
            run = child("--child", "export", args.preset, str(args.layers), "float32", str(out), "slots", "0", "dense")
            run["step"] = child("--child", "step", str(out), str(args.cached), str(args.repeats))
            shutil.rmtree(out)
            runs.append(run)
        if args.engine_cc:
            out, engines = Path(tmp) / "slots-trt", Path(tmp) / "engines"
            run = child("--child", "export", args.preset, str(args.layers), "bfloat16", str(out), "slots-trt",
                        str(args.capacity), "routed")
            run["engines"] = child("--child", "build", str(out), str(engines), args.engine_cc, str(args.capacity))
            shutil.rmtree(out)
            shutil.rmtree(engines)
            runs.append(run)
    print(f"{args.preset}: {args.layers} of {preset['full_layers']} layers, random weights "
          f"({platform.processor() or platform.machine()})")
    print(f"{'dtype':>9} {'weights GB':>10} {'export s':>8} {'peak RSS GB':>11} {'RSS/weights':>11} "
          f"{'full: weights GB':>16} {'full: export s':>14}")
    for r in runs:
        if "engines" in r:
            e = r["engines"]
            print(f"  slots-trt bf16: export {r['export_s']:.0f} s, peak RSS {r['peak_rss_bytes'] / 1e9:.2f} GB; "
                  f"TensorRT-RTX {e['compute_capability']} engines: build {e['build_s']:.0f} s, peak RSS "
                  f"{e['peak_rss_bytes'] / 1e9:.2f} GB ({e['peak_rss_bytes'] / r['weight_bytes']:.2f}x the weights), "
                  f"{e['engine_bytes'] / 1e9:.2f} GB of engines")
            continue
        if r["moe"] == "dense":
            print(f"  MoE routed densely (every token through all experts), float32: verify 1 token "
                  f"{r['step']['verify_1_ms']:.1f} ms, 16 tokens {r['step']['verify_16_ms']:.1f} ms")
            continue
        f = r["full_model"]
        print(f"{r['dtype']:>9} {r['weight_bytes'] / 1e9:>10.2f} {r['export_s']:>8.1f} {r['peak_rss_bytes'] / 1e9:>11.2f} "
              f"{f['peak_rss_per_weight_byte']:>11.2f} {f['weight_bytes'] / 1e9:>16.1f} {f['export_s']:>14.0f}")
        if "step" in r:
            print(f"  onnxruntime executor, 1 row, {args.cached} cached: verify 1 token {r['step']['verify_1_ms']:.1f} ms, "
                  f"16 tokens {r['step']['verify_16_ms']:.1f} ms")
    if args.json:
        args.json.write_text(json.dumps({"command": " ".join(sys.argv), "preset": args.preset, "config": preset,
                                         "runs": runs}, indent=2) + "\n")


if __name__ == "__main__":
    main()

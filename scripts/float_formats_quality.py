"""What TensorRT's float weight formats (export --quant fp8 | nvfp4, slots-trt) cost the embedded target,
measured on the CPU: the formats are for GPUs, but their weights are what they are anywhere.

fp8 runs as exported on onnxruntime (its DequantizeLinear of float8 weights; slowly: a check, not a
speed path). onnxruntime has no float4 DequantizeLinear, so nvfp4 runs as its float twin: the target
whose every matmul weight is ModelOpt's NVFP4 round trip, the values the nvfp4 graph dequantizes
(tests/core/test_float_formats.py checks they are equal), exported in float32. One difference: the
twin's drafter borrows the rounded LM head, the nvfp4 bundle's drafter the float one (τ only).

On held-out prompts (MT-Bench and GSM8K, greedy): agreement of each target's replies with the float32
target's, perplexity of the float32 replies under each (its executor's own logits), τ of the shipped
drafter against each (DFlash, B=4) and whether DFlash equals its target's plain decoding; the target
graph's bytes per format.

    .venv/bin/python scripts/float_formats_quality.py --out docs/bench/smollm2-135m-float-formats.json
"""

from __future__ import annotations

import argparse
import platform
import sys
from importlib import metadata
from pathlib import Path

import numpy as np
import torch

from dflash_trt import LLM, SamplingParams
from dflash_trt.bench.offline import run_offline
from dflash_trt.models import embedded
from dflash_trt.models.chat import encode_prompt
from dflash_trt.runtime.bundles import cached_bundle

sys.path.insert(0, str(Path(__file__).parent))
from int4_bench import agreement, command_line, emit, held_out_prompts, reply_logprobs  # noqa: E402


def nvfp4_twin(target: str, draft: str, out: Path, capacity: int) -> Path:
    """The float32 slots-trt bundle of the target with every Linear weight replaced by ModelOpt's NVFP4
    round trip (blocks of 16 along the input, as export/float_formats.py writes them)."""
    from dflash_trt.export.bundle import export_bundle
    from dflash_trt.export.float_formats import _qtensors
    from dflash_trt.models.checkpoints import load_drafter, load_target

    if (out / "bundle.json").is_file():
        return out
    _, NVFP4QTensor = _qtensors()
    model, tokenizer = load_target(target)
    head = model.lm_head
    if head.weight is model.model.get_input_embeddings().weight:  # tied: the export's LM head is its own copy
        head.weight = torch.nn.Parameter(head.weight.detach().clone())
    with torch.no_grad():
        for module in model.model.modules():
            if isinstance(module, torch.nn.Linear):
                quantized, block, tensor = NVFP4QTensor.quantize(module.weight.detach().clone(), 16)
                module.weight.copy_(quantized.dequantize(dtype=torch.float32, scale=block, double_scale=tensor,
                                                         block_sizes={-1: 16}))
    return export_bundle(model, load_drafter(draft), tokenizer, out, flavour="slots-trt", capacity=capacity,
                         check=False, force=True)


def replies(bundle: Path, prompts: list[str], max_tokens: int) -> dict:
    """Plain greedy replies, DFlash B=4's τ and how many of its replies equal the plain ones."""
    llm = LLM.from_bundle(bundle, max_batch=1)
    params = SamplingParams(max_tokens=max_tokens)
    plain, _, _ = run_offline(llm, prompts, params, False, None, "plain")
    dflash, _, _ = run_offline(llm, prompts, params, True, 4, "dflash_b4")
    lengths = [a for r in dflash for a in r.acceptance_lengths or []]
    return {"tokens": [r.token_ids for r in plain], "tau_dflash_b4": sum(lengths) / len(lengths),
            "dflash_b4_equal_to_plain": sum(d.token_ids == p.token_ids for d, p in zip(dflash, plain, strict=True))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quality-prompts", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--capacity", type=int, default=1024)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()

    target = embedded.DEFAULT_TARGET
    draft = str(embedded.default_drafter(target))
    bundles = {quant or "float32": cached_bundle(target, draft, flavour="slots-trt", capacity=args.capacity, quant=quant)
               for quant in (None, "fp8", "nvfp4")}
    runnable = {"float32": bundles["float32"], "fp8": bundles["fp8"],
                "nvfp4 (float twin)": nvfp4_twin(target, draft, embedded.cache_root() / f"nvfp4-twin-{args.capacity}",
                                                 args.capacity)}
    tokenizer = LLM.from_bundle(bundles["float32"]).tokenizer
    held_out = held_out_prompts(args.quality_prompts)
    held_ids = [encode_prompt(tokenizer, p) for p in held_out]
    results = {name: replies(bundle, held_out, args.max_tokens) for name, bundle in runnable.items()}
    quality = {}
    for name, bundle in runnable.items():
        scored = [lp for ids, reply in zip(held_ids, results["float32"]["tokens"], strict=True)
                  for lp in reply_logprobs(bundle, ids, reply, args.capacity)]
        quality[name] = {"perplexity_of_float32_replies": float(np.exp(-np.mean(scored))),
                         "agreement_with_float32": agreement(results[name]["tokens"], results["float32"]["tokens"]),
                         **{k: v for k, v in results[name].items() if k != "tokens"}}
    record = {
        "what": "embedded SmolLM2-135M + shipped drafter: target weights as export --quant fp8 / nvfp4 write them "
                "(slots-trt) against float32, on onnxruntime (nvfp4 as its float twin)",
        "command": command_line("float_formats_quality.py", args),
        "machine": {"cpus": 2, "platform": platform.platform(), "onnxruntime": metadata.version("onnxruntime"),
                    "modelopt": metadata.version("nvidia-modelopt")},
        "prompts": f"held out: mt-bench first {args.quality_prompts // 2} + gsm first {args.quality_prompts // 2}, "
                   f"greedy, <= {args.max_tokens} tokens",
        "note": "the float32 target is the packaged Q4_1 GGUF dequantized (embedded.py)",
        "quality": quality,
        "target_graph_bytes": {name: sum(f.stat().st_size for f in bundle.glob("target.onnx*"))
                               for name, bundle in bundles.items()},
    }
    emit(record, args.out)


if __name__ == "__main__":
    main()

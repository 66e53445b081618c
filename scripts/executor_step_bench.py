"""What our runtime's phases cost at a real model's widths: the C++ slot executor over the torch
graphs (runtime/torch_graphs.py) on a random-weight Qwen3-8B-shaped target with a few of its layers
(or a sparse MoE flagship's: Qwen3.5-35B-A3B, hybrid, or Qwen3-30B-A3B, as scripts/real_width_bench.py
shapes them) and a one-layer DFlash drafter of its width, on the GPU (the CUDA device: real driver, the decision
kernel) or the CPU. Unlike scripts/gpu_step_bench.py (a floor in plain PyTorch), this is the code a
request runs: staging, graph runs, device decisions, commits.

For each rows x case it times the executor's own phase calls (prefill of --chunk tokens, draft of a
block B, verify of B tokens: B=1 is a plain decoding step), --repeat times after a warm-up, with
every row's cache at --cached tokens (verify is committed with kept 0, so the length stays), and
reads the executor's host-boundary accounting per call. Prints a table; --json writes it.

    python3 scripts/executor_step_bench.py [--preset qwen3-8b|qwen3.5-35b-a3b|...] [--layers 4] [--rows 1,8,32]
"""

from __future__ import annotations

import argparse
import json
import time
from collections import Counter
from pathlib import Path

import torch
from real_width_bench import PRESETS as MOE_PRESETS
from real_width_bench import random_drafter, random_target

PRESETS = {
    "qwen3-8b": dict(hidden_size=4096, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                     intermediate_size=12288, vocab_size=151936, full_layers=36),
    "tiny": dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                 intermediate_size=128, vocab_size=512, full_layers=4),
}


class RandomPair:
    """What runtime/torch_graphs.torch_executor reads of an LLM, over random weights: a dense Qwen3 of
    PRESETS, or a sparse MoE target of scripts/real_width_bench.py's presets (hybrid for Qwen3.5)."""

    tokenizer = None
    has_drafter = True

    def __init__(self, preset: str, layers: int, device: torch.device, dtype: torch.dtype):
        if preset in MOE_PRESETS:
            self.target = random_target(MOE_PRESETS[preset], layers, dtype, device)
            self.drafter = random_drafter(MOE_PRESETS[preset], layers, dtype, device)
        else:
            self.target, self.drafter = self.dense(PRESETS[preset], layers, device, dtype)
        self.draft_head = self.drafter.head(self.target.lm_head)
        self.graph_stats = Counter()  # the torch graphs' CUDA graph counts: captured, replayed, eager

    @staticmethod
    def dense(preset: dict, layers: int, device: torch.device, dtype: torch.dtype):
        from transformers import Qwen3Config, Qwen3ForCausalLM

        from dflash_trt.models.draft_config import DraftConfig
        from dflash_trt.models.drafter import DFlashDrafter
        from dflash_trt.models.target import TargetModel

        shape = {k: v for k, v in preset.items() if k != "full_layers"}
        config = Qwen3Config(**shape, num_hidden_layers=layers, rms_norm_eps=1e-6, tie_word_embeddings=False)
        with torch.device("meta"):
            model = Qwen3ForCausalLM(config)
        model = model.to_empty(device=device).to(dtype)  # random weights, drawn on the device itself
        torch.manual_seed(0)
        with torch.no_grad():
            for p in model.parameters():
                p.normal_(0.0, 0.02)
        model.model.rotary_emb = type(model.model.rotary_emb)(config).to(device)  # its buffers, computed
        raw = dict(shape, num_hidden_layers=1, rms_norm_eps=1e-6, rope_theta=10000.0, max_position_embeddings=40960,
                   architectures=["DFlashDraftModel"], model_type="qwen3",
                   dflash_config=dict(block_size=16, mask_token_id=shape["vocab_size"] - 1,
                                      target_layer_ids=[0, layers - 1]))
        raw.pop("vocab_size")
        torch.manual_seed(1)
        drafter = DFlashDrafter(DraftConfig.from_dict(raw)).to(device=device, dtype=dtype).eval()
        return TargetModel(model.eval()), drafter


def timed(call, repeat: int, sync) -> float:
    call()  # warm-up (and the first call's allocations)
    call()  # a CUDA graph is captured the second time its bindings recur: not inside the timing
    sync()
    began = time.perf_counter()
    for _ in range(repeat):
        call()
    sync()
    return (time.perf_counter() - began) / repeat * 1e3


TOP_KERNELS = 12  # the kernels a profiled phase's record names, most device time first


def profile_calls(call, repeat: int, device: torch.device, sync, label: str,
                  trace: Path | None = None) -> tuple[float | None, list[dict]]:
    """torch.profiler over `repeat` calls of `call`: where their time goes, host side and device side
    (top operators printed). Returns the GPU's busy time per call in ms (the kernels' own time; None on
    the CPU) and its TOP_KERNELS kernels and operators by device time ({name, calls, us}, per call; empty
    on the CPU). `trace`: also write the timeline there (Chrome trace format, gzipped), to read where the
    GPU waits on the host (scripts/trace_gaps.py)."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    sync()
    with profile(activities=activities) as prof:
        for _ in range(repeat):
            call()
        sync()
    if trace is not None:
        trace.parent.mkdir(parents=True, exist_ok=True)
        prof.export_chrome_trace(str(trace))  # gzipped by torch: the path ends in .gz
    sort = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
    print(f"profile: {repeat} x {label}")
    print(prof.key_averages().table(sort_by=sort, row_limit=15, max_name_column_width=60))
    if device.type != "cuda":
        return None, []
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12, max_name_column_width=60))

    events = prof.key_averages()
    return sum(map(device_us, events)) / repeat / 1e3, top_device_events(events, repeat)


def device_us(event) -> float:
    """A profiler average's own device time in us (self_device_time_total, named self_cuda_time_total in
    older PyTorch)."""
    return getattr(event, "self_device_time_total", None) or getattr(event, "self_cuda_time_total", 0)


def top_device_events(events, repeat: int) -> list[dict]:
    """The TOP_KERNELS profiler averages with the most device time, per call of `repeat`."""
    ranked = sorted((e for e in events if device_us(e) > 0), key=device_us, reverse=True)
    return [{"name": e.key[:120], "calls": round(e.count / repeat, 2), "us": round(device_us(e) / repeat, 1)}
            for e in ranked[:TOP_KERNELS]]


def trace_path(folder: Path | None, phase: str) -> Path | None:
    return folder / (phase.replace(" ", "_").replace("=", "") + ".json.gz") if folder else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", choices=[*PRESETS, *MOE_PRESETS], default="qwen3-8b")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--rows", default="1,8,32")
    parser.add_argument("--blocks", default="1,4,8,16")
    parser.add_argument("--chunk", type=int, default=512)
    parser.add_argument("--cached", type=int, default=1024)
    parser.add_argument("--capacity", type=int,
                        help="tokens per KV slot (default: just what the phases need); a captured run in PyTorch's "
                             "attention (--kernels off, or a target the BlockAttention kernel does not take) attends "
                             "over all of them whatever the rows hold: what a server's capacity costs a step")
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--eager", action="store_true", help="no CUDA graphs (what capture saves)")
    parser.add_argument("--kernels", choices=["auto", "off"], default="auto",
                        help="auto: on a GPU the draft graphs run our InjectKV/BlockAttention kernels, the target's "
                             "decode-sized attention BlockAttention, a hybrid target our GatedDeltaRule and a sparse "
                             "one our MoE where the plugin library is built (runtime/cuda_ops.py); off: standard "
                             "graphs, PyTorch's attention, the recurrence's PyTorch body and the MoE's standard-op "
                             "form")
    parser.add_argument("--draft-rule", choices=["point-mass", "drafter"], default="point-mass",
                        help="how T>0 rows draft (runtime/llm.py's draft_rule): the 'step T=0.8' row's draft and "
                             "verify draw from the drafter's distribution on the device with 'drafter'")
    parser.add_argument("--profile", action="store_true",
                        help="also profile a 1-row verify of the largest block (torch.profiler: top ops)")
    parser.add_argument("--trace", type=Path,
                        help="with --profile: a folder for the profiles' timelines (<phase>.json.gz, Chrome trace)")
    parser.add_argument("--json")
    args = parser.parse_args()

    from dflash_trt.runtime import torch_graphs
    from dflash_trt.runtime.native import native_core
    from dflash_trt.runtime.torch_graphs import torch_executor

    torch_graphs.DRAFT_KERNELS = "auto" if args.kernels == "auto" else False
    torch_graphs.TARGET_KERNELS = args.kernels == "auto"

    core = native_core()
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    preset = PRESETS[args.preset] if args.preset in PRESETS else dict(MOE_PRESETS[args.preset]["config"],
                                                                      full_layers=MOE_PRESETS[args.preset]["full_layers"])
    rows_list, blocks = [int(r) for r in args.rows.split(",")], [int(b) for b in args.blocks.split(",")]
    need = args.cached + args.chunk + max(blocks) + 8
    if args.capacity is not None and args.capacity < need:
        parser.error(f"--capacity {args.capacity} is below the {need} tokens the phases need")
    pair = RandomPair(args.preset, args.layers, device, dtype)
    pair.draft_rule = args.draft_rule  # read by torch_executor: the block pass returns its logits for the rule
    pair.enforce_eager = args.eager  # read by torch_executor: no CUDA graphs
    capacity = args.capacity or need
    executor = torch_executor(pair, max(rows_list), capacity)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    greedy = core.RowSampling()
    sampled = [core.RowSampling(core.SamplingParams(temperature=0.8, top_p=0.95, seed=1))]
    plain_t = [core.RowSampling(core.SamplingParams(temperature=0.8, seed=1))]
    vocab = preset["vocab_size"] - 2
    results = []
    for n in rows_list:
        rows = list(range(n))
        for row in range(max(rows_list)):
            executor.release(row)
        g = torch.Generator().manual_seed(n)
        prompts = [torch.randint(0, vocab, (args.cached,), generator=g).tolist() for _ in rows]
        executor.prefill(rows, prompts, [greedy] * n)  # every row at --cached tokens

        def measure(name, block, call, committed):
            bytes_before, graphs_before = executor.host_bytes, Counter(pair.graph_stats)
            ms = timed(call, args.repeat, sync)
            per_call = (executor.host_bytes - bytes_before) / (args.repeat + 2)
            assert all(executor.committed(r) == committed for r in rows)
            results.append({"phase": name, "rows": n, "block": block, "ms": round(ms, 3),
                            "host_bytes_per_call": int(per_call),
                            "graph_runs": dict(Counter(pair.graph_stats) - graphs_before)})

        for block in blocks:
            ids = [[1] * block for _ in rows]

            def verify(ids=ids):
                executor.verify(rows, ids, [greedy] * n)
                executor.commit(rows, [0] * n)  # roll back: the length stays at --cached
            measure("verify", block, verify, args.cached)
            if block == max(blocks):
                # sampled verifies (what a chat request at temperature > 0 runs): the decision's cost
                # beside the greedy one's, on the same logits, with and without the nucleus
                for label, sampling in (("verify T=0.8 top-p 0.95", sampled), ("verify T=0.8", plain_t)):
                    def sampled_verify(ids=ids, sampling=sampling):
                        executor.verify(rows, ids, sampling * n)
                        executor.commit(rows, [0] * n)
                    measure(label, block, sampled_verify, args.cached)
            if block > 1:
                measure("draft", block, lambda block=block: executor.draft(rows, [1] * n, block), args.cached)
            if block > 1 and block == max(blocks):
                # a sampled request's whole step: its drafts (point mass: the argmax; the drafter rule: drawn
                # from q) and their verify at T=0.8, rolled back
                def sampled_step(block=block):
                    drafts = executor.draft(rows, [1] * n, block, plain_t * n)
                    executor.verify(rows, [[1, *d] for d in drafts], plain_t * n)
                    executor.commit(rows, [0] * n)
                measure("step T=0.8", block, sampled_step, args.cached)
        # Each prefill commits its chunk: one call per row set and length. The first goes after --cached
        # tokens; the second starts the rows afresh (a new request's first chunk) at a length no call has
        # had: what a prompt of a new length pays (an attention kernel that plans per shape pays it there).
        for length, fresh in ((args.chunk, False), (args.chunk - args.chunk // 8, True)):
            if fresh:
                for row in rows:
                    executor.release(row)
            before = executor.host_bytes
            sync()
            began = time.perf_counter()
            executor.prefill(rows, [[2] * length for _ in rows], [greedy] * n)
            sync()
            results.append({"phase": f"prefill {length}" + (" (fresh rows)" if fresh else ""), "rows": n,
                            "block": length, "ms": round((time.perf_counter() - began) * 1e3, 3),
                            "host_bytes_per_call": executor.host_bytes - before})
    scale = preset["full_layers"] / args.layers
    mode = "eager" if args.eager or device.type != "cuda" else "CUDA graphs"
    if pair.draft_kernels:
        mode += ", draft kernels " + "/".join(pair.draft_kernels)
    if pair.target_kernels:
        mode += ", target kernels " + "/".join(pair.target_kernels)
    print(f"{args.preset}-shaped, {args.layers} of {preset['full_layers']} layers, {args.dtype} on {args.device} ({mode}), "
          f"{args.cached} cached of {capacity} a slot; ms per call (x{scale:.1f} for the full depth, roughly: the LM head does not scale)")
    print("| phase | rows | B | ms | host bytes per call | graph runs |")
    print("|---|---|---|---|---|---|")
    for r in results:
        runs = " ".join(f"{k} {v}" for k, v in sorted(r.get("graph_runs", {}).items()))
        print(f"| {r['phase']} | {r['rows']} | {r['block']} | {r['ms']} | {r['host_bytes_per_call']} | {runs} |")
    profiles, prefill_profile = [], None
    if args.profile:
        block = max(blocks)
        # a plain step (a verify of one token: the speedup's baseline), then the largest verify, greedy and top-p
        profiled = [("plain step", "verify", greedy, 1)] if 1 in blocks else []
        profiled += [("verify", "verify", greedy, block), ("verify T=0.8 top-p 0.95", "verify T=0.8 top-p 0.95",
                                                           sampled[0], block)]
        for label, phase, sampling, tokens in profiled:
            def verify(sampling=sampling, tokens=tokens):  # a 1-row verify, rolled back
                executor.verify([0], [[1] * tokens], [sampling])
                executor.commit([0], [0])
            busy, top = profile_calls(verify, args.repeat, device, sync, f"{label} of 1 row x {tokens} tokens",
                                      trace_path(args.trace, label))
            wall = [r["ms"] for r in results if (r["phase"], r["rows"], r["block"]) == (phase, 1, tokens)]
            if busy is not None and wall:
                # the share of a timed verify (its commit included) the GPU sat idle, waiting on the host
                profiles.append({"phase": label, "rows": 1, "block": tokens, "gpu_busy_ms": round(busy, 3),
                                 "ms": wall[0], "gpu_idle_share": round(1 - busy / wall[0], 3), "top_kernels": top})
                print(f"{label}, 1 row x {tokens}: GPU busy {busy:.3f} of {wall[0]} ms "
                      f"({1 - busy / wall[0]:.0%} idle)")
        # a new request's first prefill chunk, of a length no call has had (row 0 starts afresh)
        length = args.chunk - args.chunk // 4
        executor.release(0)
        began = time.perf_counter()
        busy, top = profile_calls(lambda: executor.prefill([0], [[2] * length], [greedy]), 1, device, sync,
                                  f"prefill of 1 row x {length} tokens (a new length)",
                                  trace_path(args.trace, f"prefill {length}"))
        prefill_profile = {"phase": f"prefill {length}", "rows": 1, "block": length,
                           "ms_profiled": round((time.perf_counter() - began) * 1e3, 3),
                           "gpu_busy_ms": None if busy is None else round(busy, 3), "top_kernels": top}
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"preset": args.preset, "shape": preset, "layers": args.layers, "dtype": args.dtype,
                       "draft_rule": args.draft_rule,
                       "device": args.device, "graphs": mode.startswith("CUDA graphs"),
                       "draft_kernels": list(pair.draft_kernels),
                       "target_kernels": list(pair.target_kernels), "cached": args.cached, "capacity": capacity,
                       "repeat": args.repeat,
                       "results": results, "profile": profiles, "prefill_profile": prefill_profile},
                      f, indent=2)


if __name__ == "__main__":
    main()

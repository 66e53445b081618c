"""What deciding a verify's tokens costs on its own: the slot executor's decisions (csrc/decide.h; on a GPU
the decision kernels, csrc/decide_kernel.cu) over logits we choose, at a real vocabulary. The executor's
target graph is a table of logits (copied into the executor's buffer each run, as a model's LM head
would write them), so a verify times that copy and the decisions only; greedy is the baseline.

Two kinds of rows: "flat" (standard normal logits: a nucleus of most of the vocabulary, the worst case and
what random-weight models give) and "peaked" (normal x 3 with one token holding nearly all the mass at
every other position, as a trained model's rows often are).

    python3 scripts/decide_bench.py [--device cuda] [--vocab 151936] [--rows 1,8,32] [--block 16] [--json out.json]
        [--wide-pairs 0,16] [--threads 512]

--wide-pairs times the target-token decisions with each limit on the (row, position) pairs a cluster of
blocks decides (csrc/cuda_device.cpp: 0, a block per pair always; the default 16): both forms at the same
rows, on a GPU of SM 9.0 or later. --threads fixes the threads of a block-per-pair launch (the core's rule:
512 while the blocks fit the SMs, 256 past them): with 512 at rows whose pairs pass the SMs, what the
rule saves.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch

from dflash_trt.runtime.native import native_core
from dflash_trt.runtime.torch_graphs import TorchGraph

CASES = {"greedy": {}, "T=0.8": dict(temperature=0.8), "T=0.8 top-k 50": dict(temperature=0.8, top_k=50),
         "T=0.8 top-p 0.95": dict(temperature=0.8, top_p=0.95)}


def target_io(layers: int) -> tuple[list[str], list[str]]:
    """The bindings of a target graph of `layers` attention layers and no drafter: (inputs, outputs)."""
    caches = [f"cache_{kind}_{i}" for i in range(layers) for kind in ("key", "value")]
    return (["input_ids", "cache_lengths", "query_lengths", "logits_index", *caches],
            ["logits", "features", *(f"cache_{kind}_out_{i}" for i in range(layers) for kind in ("key", "value"))])


def target_config(core, rows: int, vocab: int, layers: int = 1):
    """An executor config for that target (one KV head of 8 a layer) over `rows` slots of 64 tokens."""
    config = core.ExecutorConfig()
    config.target_path, config.library_path = "target", "torch"
    config.max_batch, config.capacity, config.vocab = rows, 64, vocab
    config.target_layers, config.attention_layers = layers, list(range(layers))
    config.target_kv_heads, config.target_head_dim = 1, 8
    return config


class LogitsTarget(torch.nn.Module):
    """A target graph's I/O (one attention layer, no drafter) whose logits are `table` [rows, block, V]."""

    def __init__(self, table: torch.Tensor):
        super().__init__()
        self.table = table

    def forward(self, input_ids, cache_lengths, query_lengths, logits_index, key, value):
        n, r = logits_index.shape
        return self.table[:n, :r], input_ids.new_zeros(*input_ids.shape, 0, dtype=torch.float32), key, value


class LogitsGraphs:
    """The graph backend the executor runs (runtime/torch_graphs.py's interface), with one graph."""

    def __init__(self, table: torch.Tensor):
        self.target, self.device, self.stream = LogitsTarget(table), table.device, None

    def version(self) -> str:
        return "logits table"

    def use_stream(self, handle: int) -> None:
        self.stream = torch.cuda.ExternalStream(handle)

    def open(self, name: str) -> TorchGraph:
        return TorchGraph(self.target, *target_io(1), self.device, self.stream)


def rows_of(kind: str, rows: int, block: int, vocab: int, device: torch.device) -> torch.Tensor:
    g = torch.Generator(device=device).manual_seed(0)
    logits = torch.randn(rows, block, vocab, generator=g, device=device)
    if kind == "peaked":
        logits *= 3.0
        logits[:, 1::2, 17] += 25.0
    return logits


def measure(core, kind: str, rows: int, block: int, vocab: int, device: torch.device, repeat: int,
            wide_pairs: int | None = None, threads: int | None = None) -> list[dict]:
    table = rows_of(kind, rows, block, vocab, device)
    for name, value in (("DFLASH_DECIDE_WIDE_PAIRS", wide_pairs), ("DFLASH_DECIDE_THREADS", threads)):
        if value is None:  # read as the executor opens its device
            os.environ.pop(name, None)
        else:
            os.environ[name] = str(value)
    executor = core.PyGraphExecutor(target_config(core, rows, vocab), LogitsGraphs(table), device.type)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    slots = list(range(rows))
    executor.prefill(slots, [[1, 2, 3]] * rows, [core.RowSampling()] * rows)
    blocks = [[1] + [17] * (block - 1) for _ in slots]  # drafts a peaked row's picks often equal
    out = []
    for name, params in CASES.items():
        sampling = [core.RowSampling(core.SamplingParams(seed=i, **params), stream=i, position=3) for i in slots]

        def verify(sampling=sampling):
            executor.verify(slots, blocks, sampling)
            executor.commit(slots, [0] * rows)

        verify()
        sync()
        began = time.perf_counter()
        for _ in range(repeat):
            verify()
        sync()
        out.append({"rows_kind": kind, "rows": rows, "block": block, "case": name,
                    "ms": round((time.perf_counter() - began) / repeat * 1e3, 3),
                    **({"wide_pairs": wide_pairs} if wide_pairs is not None else {}),
                    **({"threads": threads} if threads is not None else {})})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--vocab", type=int, default=151936)
    parser.add_argument("--rows", default="1,8,32")
    parser.add_argument("--block", type=int, default=16)
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--json")
    parser.add_argument("--wide-pairs", help="comma-separated limits on the pairs a cluster decides (default: the core's)")
    parser.add_argument("--threads", type=int, help="the threads of every block-per-pair launch (default: the core's rule)")
    args = parser.parse_args()
    core, device = native_core(), torch.device(args.device)
    limits = [int(n) for n in args.wide_pairs.split(",")] if args.wide_pairs else [None]
    results = [r for limit in limits for kind in ("flat", "peaked") for rows in map(int, args.rows.split(","))
               for r in measure(core, kind, rows, args.block, args.vocab, device, args.repeat, limit, args.threads)]
    threads = "the core's rule" if args.threads is None else args.threads
    print(f"a verify of {args.block} tokens over {args.vocab:,} logits on {args.device} (block threads: {threads}): "
          "the logits' copy and the decisions, ms per call")
    print("| wide pairs | rows | kind | " + " | ".join(CASES) + " |")
    print("|---|---|---|" + "---|" * len(CASES))
    for limit in limits:
        for kind in ("flat", "peaked"):
            for rows in map(int, args.rows.split(",")):
                cells = [next(r["ms"] for r in results if (r["rows_kind"], r["rows"], r["case"], r.get("wide_pairs"))
                              == (kind, rows, c, limit)) for c in CASES]
                print(f"| {'default' if limit is None else limit} | {rows} | {kind} | "
                      + " | ".join(str(c) for c in cells) + " |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": args.device, "vocab": args.vocab, "block": args.block, "repeat": args.repeat,
                       "threads": args.threads,
                       "decides_on_device": bool(getattr(core, "HAS_DEVICE_DECIDE", False)) and device.type == "cuda",
                       "results": results}, f, indent=2)


if __name__ == "__main__":
    main()

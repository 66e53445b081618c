"""What the host spends on a replayed verify, GPU work aside: the slot executor (csrc/slot_executor.cpp:
staging, bindings, the decision's launch and its verdicts) and the torch backend's graph call
(csrc/py_graph.cpp, runtime/torch_graphs.py) down to a captured graph's replay, at a model's depth.

The target graph is a stand-in whose captured replay does nothing, so a call times the host's share of a
step: on a GPU the issue's target is 5 % of a step (Qwen3-8B, 1 row). Each of the stand-in's layers binds
an attention layer's K/V slots, as a model's do. The vocabulary is small, so the decision itself is
nearly free; greedy rows.

    python3 scripts/host_step_bench.py [--device cpu|cuda] [--layers 1,36] [--rows 1,8] [--block 16] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import time

import torch
from decide_bench import target_config, target_io

from dflash_trt.runtime.native import native_core
from dflash_trt.runtime.torch_graphs import TorchGraph

VOCAB = 64


class Replayed:
    """A captured graph that does nothing when replayed."""

    def replay(self) -> None:
        pass


class EveryRunReplayed(dict):
    """TorchGraph's captured graphs, as if every decode-sized run had been captured before."""

    def get(self, key, default=None):
        return Replayed()


class StandInGraphs:
    """The graphs a torch-backend executor opens (runtime/torch_graphs.py's interface): a target of
    `layers` attention layers whose decode-sized runs replay as captured."""

    def __init__(self, layers: int, device: torch.device):
        self.layers, self.device = layers, device

    def version(self) -> str:
        return "host step stand-in"

    def use_stream(self, handle: int) -> None:
        pass

    def open(self, name: str) -> TorchGraph:
        graph = TorchGraph(torch.nn.Identity(), *target_io(self.layers), self.device, None, graphed=True)
        graph._graphs = EveryRunReplayed()
        return graph


def measure(core, device: torch.device, layers: int, rows: int, block: int, repeat: int) -> dict:
    executor = core.PyGraphExecutor(target_config(core, rows, VOCAB, layers), StandInGraphs(layers, device),
                                    device.type)
    slots = list(range(rows))
    greedy = [core.RowSampling()] * rows
    executor.prefill(slots, [[1, 2, 3]] * rows, greedy)
    blocks = [[1] + [2] * (block - 1)] * rows

    def verify():
        executor.verify(slots, blocks, greedy)
        executor.commit(slots, [0] * rows)

    for _ in range(10):
        verify()
    began = time.perf_counter()
    for _ in range(repeat):
        verify()
    return {"layers": layers, "rows": rows, "block": block,
            "us": round((time.perf_counter() - began) / repeat * 1e6, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--layers", default="1,36")
    parser.add_argument("--rows", default="1,8")
    parser.add_argument("--block", type=int, default=16)
    parser.add_argument("--repeat", type=int, default=200)
    parser.add_argument("--json")
    args = parser.parse_args()
    core, device = native_core(), torch.device(args.device)
    results = [measure(core, device, layers, rows, args.block, args.repeat)
               for layers in map(int, args.layers.split(",")) for rows in map(int, args.rows.split(","))]
    print(f"host time of a replayed verify of {args.block} (and its commit) on {args.device}, us per call")
    print("| layers | rows | us |")
    print("|---|---|---|")
    for r in results:
        print(f"| {r['layers']} | {r['rows']} | {r['us']} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": args.device, "vocab": VOCAB, "block": args.block, "repeat": args.repeat,
                       "results": results}, f, indent=2)


if __name__ == "__main__":
    main()

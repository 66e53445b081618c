"""One contract-2 target step on onnxruntime CPU: the `slots` (GroupQueryAttention) graph against the
`slots-trt` (TensorScatter + Attention over the whole capacity) graph of the same target.

A tiny random qwen3 target (tests/factories.py) is exported in both flavours for each capacity, then
one verify step of `batch` rows x `new` tokens (ragged: committed lengths and valid rows differ per
row, caches bound in place as the runtime binds them) is timed: median / min over --repeats, after
a warm-up. Prints one line per capacity.

    .venv/bin/python scripts/bench_slots_trt_step.py [--capacity 256 2048] [--batch 4] [--new 4] [--cached N]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnxruntime as ort
from bench_ort_executor import timed  # scripts/ is on sys.path when a script runs

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from factories import make_drafter, make_target  # noqa: E402

from dflash_trt.export.bundle import export_bundle  # noqa: E402
from dflash_trt.export.manifest import read_bundle  # noqa: E402
from dflash_trt.models.checkpoints import load_drafter, load_target  # noqa: E402


def step_fn(bundle: Path, capacity: int, committed: list[int], valid: list[int], new: int, threads: int):
    """A callable running one step with every cache bound in place (the buffers live as long as it)."""
    spec = read_bundle(bundle)["graphs"]["target"]
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    session = ort.InferenceSession(str(bundle / "target.onnx"), options, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    batch = len(committed)
    binding = session.io_binding()
    feeds = {"input_ids": rng.integers(0, 200, (batch, new)), "cache_lengths": np.array(committed),
             "query_lengths": np.array(valid), "logits_index": np.tile(np.arange(new), (batch, 1))}
    for name, value in feeds.items():
        binding.bind_cpu_input(name, value.astype(np.int64))
    buffers = {}
    for io in spec["inputs"][4:]:
        shape = [batch if d == "batch" else capacity if d == "capacity" else d for d in io["shape"]]
        buffers[io["name"]] = ort.OrtValue.ortvalue_from_numpy(rng.standard_normal(shape).astype(np.float32))
        binding.bind_ortvalue_input(io["name"], buffers[io["name"]])
    for io in spec["outputs"]:
        if io["name"].startswith("cache_"):
            binding.bind_ortvalue_output(io["name"], buffers[io["name"].replace("_out_", "_")])
        else:
            binding.bind_output(io["name"])
    return lambda: session.run_with_iobinding(binding)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--capacity", type=int, nargs="+", default=[256, 2048])
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--new", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--cached", type=int, default=None,
                        help="committed tokens of row 0 (row i: cached - 10 i) at every capacity; default 80%%..10%% of it")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        target, tokenizer = load_target(str(make_target(root / "qwen3", "qwen3", seed=0)))
        drafter = load_drafter(make_drafter(root / "draft", seed=0, block_size=4, target_layer_ids=[1, 2]))
        print(f"tiny qwen3 ({target.num_layers} layers), batch {args.batch}, {args.new} new tokens, "
              f"{args.threads} threads: ms median / min of {args.repeats}")
        for capacity in args.capacity:
            # committed lengths spread over the capacity; valid rows 4, 3, 1, 4, ...
            committed = ([int(capacity * f) for f in np.linspace(0.8, 0.1, args.batch)] if args.cached is None
                         else [args.cached - 10 * i for i in range(args.batch)])
            valid = [[4, 3, 1, 4][i % 4] if args.new >= 4 else args.new for i in range(args.batch)]
            times = {}
            for flavour in ("slots", "slots-trt"):
                bundle = export_bundle(target, drafter, tokenizer, root / f"{flavour}-{capacity}", flavour=flavour,
                                       check=False, capacity=capacity if flavour == "slots-trt" else None)
                times[flavour] = timed(step_fn(bundle, capacity, committed, valid, args.new, args.threads),
                                       args.repeats)
            print(f"C {capacity:5d} (committed {committed}): "
                  + ", ".join(f"{f} {m:.3f} / {least:.3f}" for f, (m, least) in times.items()))


if __name__ == "__main__":
    main()

"""A contract-1 verify step for comparison with the slots executor (scripts/bench_ort_executor.py).

Contract 1 (portable bundles, the per-request onnxruntime backend): the target takes the whole cache
as input and returns `present = past ++ new`, and the session keeps the committed rows by a host
slice-copy. For one request with `cached` tokens, time (median / min over --repeats) one verify of a
block, including that copy. Prints a table and writes JSON (--json).

    .venv/bin/python scripts/bench_contract_v1_step.py PORTABLE_BUNDLE [--cached 256 2048] [--block 4]
"""

from __future__ import annotations

import argparse
import json
import platform
import random
from pathlib import Path

from bench_ort_executor import timed  # scripts/ is on sys.path when a script runs

from dflash_trt.runtime.ort_backend import OrtBundle, OrtTargetSession


def measure(bundle: OrtBundle, cached: int, block: int, repeats: int) -> dict:
    rng = random.Random(0)
    vocab = bundle.manifest["target"]["vocab_size"]
    session = OrtTargetSession(bundle)
    session.prefill([rng.randrange(vocab) for _ in range(cached)])
    ids = [rng.randrange(vocab) for _ in range(block)]

    def step():
        session.forward(ids)
        session.commit(0)  # keep nothing: the next repeat verifies at the same length

    median, least = timed(step, repeats)  # after a warm-up: onnxruntime plans a new shape on its first run
    return {"batch": 1, "cached": cached, "block": block, "verify_ms": median, "verify_min_ms": least}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bundle", type=Path, help="a portable bundle (dflash-trt export)")
    parser.add_argument("--cached", type=int, nargs="+", default=[256, 2048])
    parser.add_argument("--block", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    bundle = OrtBundle(args.bundle)
    results = [measure(bundle, cached, args.block, args.repeats) for cached in args.cached]
    print(f"{args.bundle}  contract 1  block {args.block}  ({platform.machine()})")
    print("batch cached  verify ms (median / min, the host slice-copy included)")
    for r in results:
        print(f"{r['batch']:5d} {r['cached']:6d}  {r['verify_ms']:7.2f} / {r['verify_min_ms']:7.2f}")
    if args.json:
        args.json.write_text(json.dumps({"bundle": str(args.bundle), "contract": 1, "results": results}, indent=2) + "\n")


if __name__ == "__main__":
    main()

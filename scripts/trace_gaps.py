"""Where a GPU waited on the host, from a torch.profiler timeline (Chrome trace, as
`executor_step_bench.py --profile --trace` writes it, gzipped or not): the device's busy intervals
(kernels, copies, sets) merged, the idle gaps between them longest first, and for each gap the host
events (operators, runtime and driver calls) that overlapped it most.

    python scripts/trace_gaps.py build/gpu-check/traces/verify_T0.8_top-p_0.95.json.gz --top 10
"""

from __future__ import annotations

import argparse
import gzip
import json
from pathlib import Path

DEVICE_CATEGORIES = {"kernel", "gpu_memcpy", "gpu_memset"}
HOST_CATEGORIES = {"cpu_op", "cuda_runtime", "cuda_driver", "user_annotation", "python_function"}


def load(path: Path) -> list[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        trace = json.load(f)
    return [e for e in trace.get("traceEvents", []) if e.get("ph") == "X" and "dur" in e]


def busy_intervals(events: list[dict]) -> list[tuple[float, float]]:
    """The device's busy time as disjoint (start, end) intervals in microseconds, in order."""
    spans = sorted((e["ts"], e["ts"] + e["dur"]) for e in events if e.get("cat") in DEVICE_CATEGORIES)
    merged: list[tuple[float, float]] = []
    for start, end in spans:
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def gaps(events: list[dict], top: int, min_us: float = 0.0) -> list[dict]:
    """The `top` longest idle gaps between busy intervals (at least min_us), each with its host events
    (name, microseconds of overlap), most overlap first."""
    busy = busy_intervals(events)
    host = [e for e in events if e.get("cat") in HOST_CATEGORIES]
    found = []
    for (_, end), (start, _) in zip(busy, busy[1:]):
        if start - end <= min_us:
            continue
        overlap: dict[str, float] = {}
        for e in host:
            shared = min(start, e["ts"] + e["dur"]) - max(end, e["ts"])
            if shared > 0:
                overlap[e["name"]] = overlap.get(e["name"], 0.0) + shared
        found.append({"from_us": end, "idle_us": start - end,
                      "host": sorted(overlap.items(), key=lambda kv: -kv[1])})
    return sorted(found, key=lambda g: -g["idle_us"])[:top]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trace", type=Path)
    parser.add_argument("--top", type=int, default=10, help="how many gaps to show")
    parser.add_argument("--min-us", type=float, default=2.0, help="ignore gaps this short")
    args = parser.parse_args()
    events = load(args.trace)
    busy = busy_intervals(events)
    if not busy:
        print("no device events in the trace (profiled on the CPU?)")
        return
    window = busy[-1][1] - busy[0][0]
    busy_us = sum(end - start for start, end in busy)
    print(f"device busy {busy_us:.0f} of {window:.0f} us between its first and last event "
          f"({1 - busy_us / window:.1%} idle)")
    for g in gaps(events, args.top, args.min_us):
        host = ", ".join(f"{name} {us:.0f}" for name, us in g["host"][:4]) or "no host event"
        print(f"  {g['idle_us']:8.1f} us idle at {g['from_us'] - busy[0][0]:10.1f}: {host}")


if __name__ == "__main__":
    main()

"""scripts/trace_gaps.py on a hand-written timeline in torch.profiler's Chrome-trace form: two kernels
overlapping, an idle gap spanned by host work, a copy, and a gap too short to list."""

from __future__ import annotations

import gzip
import json

from bench_scripts import run_script


def event(cat, name, ts, dur):
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": 0, "tid": 0}


TRACE = {"traceEvents": [
    {"ph": "M", "name": "process_name", "pid": 0},
    event("kernel", "gemm", 0.0, 100.0),
    event("kernel", "softmax", 90.0, 20.0),            # overlaps gemm: busy 0-110
    event("cpu_op", "dflash::decide", 105.0, 60.0),    # 5 us before the gap, 50 inside it
    event("cuda_runtime", "cudaGraphLaunch", 150.0, 30.0),  # 10 inside
    event("gpu_memcpy", "Memcpy DtoH", 160.0, 10.0),   # busy 160-170: the gap is 110-160
    event("kernel", "argmax", 171.0, 9.0),             # a 1 us gap: under --min-us
]}


def test_the_longest_gap_comes_with_the_host_work_that_spanned_it(tmp_path):
    path = tmp_path / "verify.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump(TRACE, f)
    done = run_script("trace_gaps.py", path, "--min-us", 2, timeout=60)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "device busy 129 of 180 us between its first and last event (28.3% idle)"
    assert lines[1:] == ["      50.0 us idle at      110.0: dflash::decide 50, cudaGraphLaunch 10"]

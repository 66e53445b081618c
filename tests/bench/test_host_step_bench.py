"""scripts/host_step_bench.py (the host's share of a replayed verify) on the CPU: every depth and row count
runs through the executor and the torch backend's graph call to a stand-in replay, and is recorded; the
timings are not checked (benchmarks print them)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).parents[2] / "scripts" / "host_step_bench.py"


def test_the_bench_times_every_depth_and_row_count_and_records_them(tmp_path):
    out = tmp_path / "host_step_bench.json"
    done = subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu", "--layers", "1,3", "--rows", "1,2",
                           "--block", "4", "--repeat", "3", "--json", str(out)], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    record = json.loads(out.read_text())
    assert [(r["layers"], r["rows"], r["block"]) for r in record["results"]] == [
        (1, 1, 4), (1, 2, 4), (3, 1, 4), (3, 2, 4)]
    assert all(r["us"] > 0 for r in record["results"])
    assert "| 3 | 2 |" in done.stdout

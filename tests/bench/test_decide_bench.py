"""scripts/decide_bench.py (the GPU check's decision costs) at a small vocabulary on the CPU: every row kind,
row count and sampling case runs through the executor's decisions and is recorded; the timings are not
checked (benchmarks print them)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).parents[2] / "scripts" / "decide_bench.py"


def test_the_bench_decides_every_case_and_records_it(tmp_path):
    out = tmp_path / "decide_bench.json"
    done = subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu", "--vocab", "3000", "--rows", "1,3",
                           "--block", "4", "--repeat", "2", "--json", str(out)], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    record = json.loads(out.read_text())
    assert not record["decides_on_device"]
    cases = {(r["rows_kind"], r["rows"], r["case"]) for r in record["results"]}
    assert cases == {(kind, rows, case) for kind in ("flat", "peaked") for rows in (1, 3)
                     for case in ("greedy", "T=0.8", "T=0.8 top-k 50", "T=0.8 top-p 0.95")}
    assert all(r["ms"] > 0 for r in record["results"])
    assert "| 3 | peaked |" in done.stdout


def test_the_bench_records_each_limit_on_the_pairs_a_cluster_decides(tmp_path):
    """--wide-pairs 0,16: every setting once per limit (set for the core through DFLASH_DECIDE_WIDE_PAIRS,
    which only a GPU's device reads), each result naming its limit."""
    out = tmp_path / "decide_bench.json"
    done = subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu", "--vocab", "500", "--rows", "1",
                           "--block", "4", "--repeat", "1", "--wide-pairs", "0,16", "--json", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    results = json.loads(out.read_text())["results"]
    assert sorted({r["wide_pairs"] for r in results}) == [0, 16]
    assert len(results) == 2 * 2 * 4  # limits x row kinds x cases
    assert "| 0 | 1 | flat |" in done.stdout and "| 16 | 1 | peaked |" in done.stdout

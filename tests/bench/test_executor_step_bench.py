"""scripts/executor_step_bench.py (the GPU check's step costs through our executor) at its tiny presets
(a dense Qwen3, a hybrid sparse-MoE Qwen3.5) on the CPU: it runs every phase on the real executor and writes a record of each; the timings are
not checked (benchmarks print them)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parents[2] / "scripts" / "executor_step_bench.py"


@pytest.mark.parametrize("preset, layers, rule", [("tiny", 2, "point-mass"), ("tiny", 2, "drafter"),
                                                 ("tiny-qwen3.5-moe", 4, "point-mass")])  # dense; hybrid sparse MoE
def test_the_bench_runs_every_phase_through_the_executor_and_records_it(tmp_path, preset, layers, rule):
    out = tmp_path / "executor_bench.json"
    done = subprocess.run([sys.executable, str(SCRIPT), "--preset", preset, "--layers", str(layers), "--rows", "1,3",
                           "--blocks", "1,4", "--chunk", "8", "--cached", "16", "--repeat", "2", "--device", "cpu",
                           "--dtype", "float32", "--draft-rule", rule, "--json", str(out)], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    record = json.loads(out.read_text())
    cases = {(r["phase"], r["rows"], r["block"]) for r in record["results"]}
    assert cases == {(phase, rows, block) for rows in (1, 3) for phase, block in
                     (("verify", 1), ("verify", 4), ("draft", 4), ("prefill 8", 8), ("prefill 7", 7), ("verify T=0.8 top-p 0.95", 4),
                      ("verify T=0.8", 4), ("step T=0.8", 4))}
    assert record["draft_rule"] == rule
    # on the CPU the executor's memory is the host's: nothing crosses a host boundary
    assert all(r["host_bytes_per_call"] == 0 and r["ms"] > 0 for r in record["results"])
    assert "| verify | 3 | 4 |" in done.stdout

"""scripts/executor_step_bench.py (the GPU check's step costs through our executor) at its tiny presets
(a dense Qwen3, a hybrid sparse-MoE Qwen3.5) on the CPU: it runs every phase on the real executor and writes a record of each; the timings are
not checked (benchmarks print them)."""

from __future__ import annotations

import importlib
from types import SimpleNamespace

import pytest
from bench_scripts import SCRIPTS, run_bench, run_script


@pytest.mark.parametrize("preset, layers, rule", [("tiny", 2, "point-mass"), ("tiny", 2, "drafter"),
                                                 ("tiny-qwen3.5-moe", 4, "point-mass")])  # dense; hybrid sparse MoE
def test_the_bench_runs_every_phase_through_the_executor_and_records_it(tmp_path, preset, layers, rule):
    traces = tmp_path / "traces"
    profiled = ["--profile", "--trace", traces] if rule == "drafter" else []  # once: the profiles' path
    wide = ["--capacity", 64] if preset != "tiny" else []  # once: a slot wider than the phases need
    stdout, record = run_bench("executor_step_bench.py", tmp_path / "executor_bench.json", "--preset", preset,
                               "--layers", layers, "--rows", "1,3", "--blocks", "1,4", "--chunk", 8, "--cached", 16,
                               "--repeat", 2, "--device", "cpu", "--dtype", "float32", "--draft-rule", rule,
                               *profiled, *wide)
    cases = {(r["phase"], r["rows"], r["block"]) for r in record["results"]}
    assert cases == {(phase, rows, block) for rows in (1, 3) for phase, block in
                     (("verify", 1), ("verify", 4), ("draft", 4), ("prefill 8", 8), ("prefill 7 (fresh rows)", 7), ("verify T=0.8 top-p 0.95", 4),
                      ("verify T=0.8", 4), ("step T=0.8", 4))}
    assert record["draft_rule"] == rule
    assert record["capacity"] == (64 if wide else 16 + 8 + 4 + 8)  # --cached + --chunk + the largest block + 8
    # on the CPU the executor's memory is the host's: nothing crosses a host boundary
    assert all(r["host_bytes_per_call"] == 0 and r["ms"] > 0 for r in record["results"])
    assert "| verify | 3 | 4 |" in stdout
    if profiled:  # the verifies' and a new-length prefill's timelines (on the CPU: host events only)
        assert sorted(p.name for p in traces.iterdir()) == [
            "plain_step.json.gz", "prefill_6.json.gz", "verify.json.gz", "verify_T0.8_top-p_0.95.json.gz"]
        assert record["prefill_profile"]["phase"] == "prefill 6" and record["prefill_profile"]["gpu_busy_ms"] is None
        assert record["prefill_profile"]["top_kernels"] == []  # the device's kernels: none on the CPU
        assert "profile: 2 x plain step of 1 row x 1 tokens" in stdout
        assert "profile: 1 x prefill of 1 row x 6 tokens (a new length)" in stdout


def test_a_slot_too_small_for_the_phases_is_refused_before_any_work():
    done = run_script("executor_step_bench.py", "--preset", "tiny", "--layers", 1, "--device", "cpu", "--cached", 16,
                      "--chunk", 8, "--blocks", "1,4", "--capacity", 20, timeout=120)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1].endswith("--capacity 20 is below the 36 tokens the phases need")


def test_a_profiled_phase_names_its_kernels_with_the_most_device_time_per_call(monkeypatch):
    monkeypatch.syspath_prepend(str(SCRIPTS))  # the script imports its neighbours as its users run it
    bench = importlib.import_module("executor_step_bench")

    def average(key, count, us, field="self_device_time_total"):
        return SimpleNamespace(key=key, count=count, **{field: us})

    events = [average("aten::mm", 40, 100.0), average("cpu only", 4, 0.0),
              average("gemv_kernel", 20, 300.0, field="self_cuda_time_total"),  # an older PyTorch's name
              *(average(f"k{i}", 2, float(i)) for i in range(1, 20))]
    top = bench.top_device_events(events, repeat=4)
    assert top[:2] == [{"name": "gemv_kernel", "calls": 5.0, "us": 75.0}, {"name": "aten::mm", "calls": 10.0, "us": 25.0}]
    assert len(top) == bench.TOP_KERNELS and "cpu only" not in [t["name"] for t in top]
    assert [t["us"] for t in top] == sorted((t["us"] for t in top), reverse=True)


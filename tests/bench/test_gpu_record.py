"""scripts/gpu_record.py, the GPU check's record writer, on hand-written inputs in the formats the real
tools print (nvidia-smi's csv, kernel_parity's lines, kernel_bench's JSON, pytest's JUnit XML)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from bench_scripts import SCRIPTS, run_script

spec = importlib.util.spec_from_file_location("gpu_record", SCRIPTS / "gpu_record.py")
gpu_record = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gpu_record)

PARITY = """\
ok   InjectKV b=2 n=3 hidden=40 kv=2 d=8                                      float32  max scaled error 3.10e-07 (tolerance 1.0e-04)
FAIL BlockAttention b=2 heads=4 kv=2 block=4 context=7                          bfloat16 max scaled error 4.00e-02 (tolerance 1.6e-02)
FAIL GatedDeltaRule b=1 s=5                                                     float16  max scaled error nan, non-finite values (tolerance 2.0e-03)
FAILED
"""

JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest" errors="0" failures="1"
 skipped="1" tests="3"><testcase classname="tests.plugins.test_trt_plugins" name="test_parity"/>
<testcase classname="tests.runtime.test_trt_backend" name="test_engine"><skipped message="needs TensorRT"/></testcase>
<testcase classname="tests.runtime.test_x" name="test_y"><failure message="boom"/></testcase></testsuite></testsuites>
"""


def write_inputs(work: Path, steps: str) -> None:
    work.mkdir()
    (work / "smi.csv").write_text("NVIDIA H100 80GB HBM3, 580.159.04, 81559 MiB, 9.0\n")
    (work / "steps.tsv").write_text(steps)
    (work / "kernel_parity.log").write_text(PARITY)
    (work / "kernel_bench.json").write_text(json.dumps({"device": "NVIDIA H100 80GB HBM3", "peak_tbps": 2.0,
                                                        "launch_us": 0.5, "rows": [
        {"op": "InjectKV", "shape": "b=1 n=16", "bytes": 4e6, "flops": 1e6, "time_us": 3.0, "launches": 2},
        {"op": "InjectKV", "shape": "b=1 n=4096", "bytes": 4e6, "flops": 1e9, "time_us": 20.0, "launches": 8}]}))
    (work / "pytest.xml").write_text(JUNIT)


def test_the_record_gathers_every_input_and_names_what_failed(tmp_path):
    write_inputs(tmp_path / "work", "build_plugins\t0\t61.2\nkernel_parity\t1\t2.0\nstep_bench\t125\t0.0\n")
    record = gpu_record.build_record(tmp_path / "work", "abc123", peak_tflops=100.0)
    assert record["device"] == {"name": "NVIDIA H100 80GB HBM3", "driver": "580.159.04", "memory": "81559 MiB",
                                "compute_capability": "9.0"}
    assert record["steps"] == [{"step": "build_plugins", "exit": 0, "seconds": 61.2},
                               {"step": "kernel_parity", "exit": 1, "seconds": 2.0},
                               {"step": "step_bench", "exit": 125, "seconds": 0.0}]
    assert [(p["case"].split()[0], p["dtype"], p["ok"]) for p in record["kernel_parity"]] == [
        ("InjectKV", "float32", True), ("BlockAttention", "bfloat16", False), ("GatedDeltaRule", "float16", False)]
    assert record["kernel_parity"][1]["max_scaled_error"] == 0.04
    # 4 MB at 2 TB/s is 2 us: 3 us is 1.5x the floor; 1 MFLOP at 100 TFLOP/s (0.01 us) bounds nothing
    small, large = record["kernel_bench"]["rows"]
    assert (small["floor_us"], small["compute_floor_us"], small["x_bandwidth_floor"], small["x_floor"]) == (
        2.0, 0.01, 1.5, 1.5)
    # 1 GFLOP at 100 TFLOP/s is 10 us, more than the 2 us of bytes: 20 us is 2x the roofline
    assert (large["compute_floor_us"], large["x_bandwidth_floor"], large["x_floor"]) == (10.0, 10.0, 2.0)
    # an empty kernel's 0.5 us a launch: 2 us + 2 launches is 3 us (1x); 10 us + 8 launches 14 us
    assert (small["launch_floor_us"], small["x_floor_with_launches"]) == (1.0, 1.0)
    assert (large["launch_floor_us"], large["x_floor_with_launches"]) == (4.0, round(20 / 14, 2))
    outcomes = record["pytest_gpu"]["outcomes"]
    assert outcomes == {"tests.plugins.test_trt_plugins::test_parity": "passed",
                        "tests.runtime.test_trt_backend::test_engine": "skipped: needs TensorRT",
                        "tests.runtime.test_x::test_y": "failed"}
    assert "step_bench" not in record  # a step that did not run leaves its part out
    found = gpu_record.problems(record)
    assert found[:2] == ["step kernel_parity exited 1", "step step_bench skipped: past the check's time budget"]
    assert len(found) == 5 and found[-1] == "pytest -m gpu: tests.runtime.test_x::test_y failed"


def test_the_command_writes_gpu_device_json_and_fails_on_a_problem(tmp_path):
    write_inputs(tmp_path / "work", "build_plugins\t0\t61.2\n")
    done = run_script("gpu_record.py", tmp_path / "work", "--commit", "abc123", "-o", tmp_path / "out")
    written = tmp_path / "out" / "gpu-nvidia-h100-80gb-hbm3.json"
    assert json.loads(written.read_text())["commit"] == "abc123"
    assert done.returncode == 1 and "problem: kernel parity: BlockAttention" in done.stdout


def test_the_command_passes_when_everything_did(tmp_path):
    work = tmp_path / "work"
    write_inputs(work, "build_plugins\t0\t61.2\n")
    (work / "kernel_parity.log").write_text(PARITY.splitlines()[0] + "\n")
    (work / "pytest.xml").write_text(JUNIT.replace('failures="1"', 'failures="0"').replace('<failure message="boom"/>', ""))
    done = run_script("gpu_record.py", work, "--commit", "abc", "-o", tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "problem" not in done.stdout


def test_the_projected_speedup_is_tau_plain_steps_per_draft_and_verify():
    record = {"executor_bench": {"layers": 4, "shape": {"full_layers": 36}, "results": [
        {"phase": "verify", "rows": 1, "block": 1, "ms": 2.0}, {"phase": "verify", "rows": 1, "block": 16, "ms": 2.5},
        {"phase": "draft", "rows": 1, "block": 16, "ms": 0.5}, {"phase": "verify", "rows": 8, "block": 1, "ms": 3.0}]},
        "step_bench": {"steps": [{"rows": 1, "new": 1, "projected_full_ms": 6.0},
                                 {"rows": 1, "new": 16, "projected_full_ms": 7.5}]}}
    measured, full = gpu_record.projected_speedups(record)  # 8 rows: no verify of 16 or draft measured
    # HumanEval's tau 6.55: 6.55 tokens per (2.5 + 0.5) ms against one per 2.0 ms
    assert (measured["rows"], measured["step_ms"], measured["speedup"]["HumanEval"]) == (1, 3.0, round(6.55 * 2 / 3, 2))
    assert (full["plain_ms"], full["step_ms"], full["speedup"]["Alpaca"]) == (6.0, 8.0, round(3.16 * 6 / 8, 2))


def test_the_attention_spans_line_up_each_verify_across_the_capacity_runs():
    def bench(capacity, kernels, *rows):
        return {"capacity": capacity, "target_kernels": kernels,
                "results": [{"phase": phase, "rows": r, "block": b, "ms": ms} for phase, r, b, ms in rows]}

    kernel = ["BlockAttention"]
    record = {
        "executor_bench": bench(1560, kernel, ("verify", 1, 16, 1.8), ("draft", 1, 16, 0.7), ("verify", 8, 4, 2.0)),
        "executor_bench_standard": bench(1560, [], ("verify", 1, 16, 2.0), ("verify", 8, 16, 2.5)),
        "executor_bench_capacity": bench(4096, [], ("verify", 1, 16, 3.0), ("verify", 32, 16, 9.0)),
        "executor_bench_capacity_kernels": bench(4096, kernel, ("verify", 1, 16, 1.9), ("verify", 32, 16, 5.0))}
    # (8, 4) and (8, 16): one run each, nothing to compare
    assert gpu_record.attention_spans(record) == [
        {"rows": 1, "block": 16, "ms": {"SDPA, 1560 slots": 2.0, "BlockAttention, 1560 slots": 1.8,
                                        "SDPA, 4096 slots": 3.0, "BlockAttention, 4096 slots": 1.9}},
        {"rows": 32, "block": 16, "ms": {"SDPA, 4096 slots": 9.0, "BlockAttention, 4096 slots": 5.0}}]
    assert gpu_record.attention_spans({"executor_bench": record["executor_bench"]}) == []


# What `ncu --csv --page details ... kernel_bench --once` prints: the bench's shapes in launch order (its
# stdout), Nsight Compute's own lines, then one row per (launch, section, metric).
NCU = '''InjectKV b=1 n=16
BlockAttention b=1 context=1024
==PROF== Disconnected from process 4242
"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"
"0","4242","kernel_bench","127.0.0.1","void dflash::(anonymous namespace)::mma_project_kernel<__nv_bfloat16, 1>(dflash::(anonymous namespace)::Launch, const T1 *, const T1 *, const T1 *, float *)","1","7","(128, 1, 1)","(32, 1, 16)","0","9.0","GPU Speed Of Light Throughput","DRAM Throughput","%","21.37"
"0","4242","kernel_bench","127.0.0.1","void dflash::(anonymous namespace)::mma_project_kernel<__nv_bfloat16, 1>(dflash::(anonymous namespace)::Launch, const T1 *, const T1 *, const T1 *, float *)","1","7","(128, 1, 1)","(32, 1, 16)","0","9.0","Launch Statistics","Registers Per Thread","register/thread","96"
"1","4242","kernel_bench","127.0.0.1","void dflash::(anonymous namespace)::combine_kernel<__nv_bfloat16>(dflash::(anonymous namespace)::Args, const float *, T1 *)","1","7","(128, 1, 1)","(128, 1, 1)","0","9.0","GPU Speed Of Light Throughput","Duration","us","1,204.16"
'''


def test_the_kernel_profile_is_read_per_launch(tmp_path):
    write_inputs(tmp_path / "work", "kernel_profile\t0\t40.0\n")
    (tmp_path / "work" / "kernel_profile.csv").write_text(NCU)
    profile = gpu_record.build_record(tmp_path / "work", "abc123", peak_tflops=100.0)["kernel_profile"]
    assert profile["shapes_in_launch_order"] == ["InjectKV b=1 n=16", "BlockAttention b=1 context=1024"]
    first, second = profile["launches"]
    assert (first["id"], first["kernel"], first["grid"], first["block"]) == (
        0, "mma_project_kernel<__nv_bfloat16, 1>", "(32, 1, 16)", "(128, 1, 1)")
    assert first["metrics"] == {"GPU Speed Of Light Throughput: DRAM Throughput (%)": 21.37,
                                "Launch Statistics: Registers Per Thread (register/thread)": 96.0}
    assert second["kernel"] == "combine_kernel<__nv_bfloat16>"
    assert second["metrics"] == {"GPU Speed Of Light Throughput: Duration (us)": 1204.16}

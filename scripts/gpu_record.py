"""Gathers what scripts/gpu_check.sh measured into one record, docs/bench/gpu-<device>.json: the device
and driver (nvidia-smi), the commit, each step's exit status and seconds, the kernel parity lines, the
kernel bench against its bandwidth floor, the `pytest -m gpu` outcomes and the target step costs.
Prints the record's summary; exits 1 when a step failed or a parity line or gpu test did not pass.

    python3 scripts/gpu_record.py WORK_DIR --commit SHA [-o OUT_DIR] [--peak-tflops 989]

WORK_DIR holds what gpu_check.sh wrote: smi.csv, steps.tsv, kernel_parity.log, kernel_bench.json,
kernel_profile.csv (where Nsight Compute ran), pytest.xml, step_bench.json and the executor_bench*.json
of each run (a step that did not run leaves its file out and says so in steps.tsv).
"""

from __future__ import annotations

import argparse
import csv
import json
import re
import sys
import xml.etree.ElementTree as ET
from datetime import datetime, timezone
from pathlib import Path

PARITY_LINE = re.compile(r"^(ok  |FAIL) (.+?)\s+(float32|float16|bfloat16)\s+max scaled error (\S+?)[ ,(]")

SKIPPED = 125  # gpu_check.sh's status for a step it left out (its time budget)


def device_slug(name: str) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'nvidia-h100-80gb-hbm3': the record's file name."""
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def read_smi(path: Path) -> dict:
    """nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv,noheader."""
    name, driver, memory, capability = (field.strip() for field in path.read_text().splitlines()[0].split(","))
    return {"name": name, "driver": driver, "memory": memory, "compute_capability": capability}


def read_steps(path: Path) -> list[dict]:
    """steps.tsv: one 'name<TAB>exit status<TAB>seconds' line per step, in the order they ran (SKIPPED: not
    run, past the check's time budget)."""
    steps = []
    for line in path.read_text().splitlines():
        name, status, seconds = line.split("\t")
        steps.append({"step": name, "exit": int(status), "seconds": float(seconds)})
    return steps


def read_parity(path: Path) -> list[dict]:
    lines = []
    for line in path.read_text().splitlines():
        match = PARITY_LINE.match(line)
        if match:
            ok, what, dtype, error = match.groups()
            lines.append({"case": what.strip(), "dtype": dtype, "max_scaled_error": float(error),
                          "ok": ok.strip() == "ok"})
    return lines


def read_kernel_bench(path: Path, peak_tflops: float) -> dict:
    """Each row's floors: its bytes at the peak bandwidth, its FLOPs at the dense 16-bit tensor-core
    peak; x_floor is the time over the larger (the roofline), x_bandwidth_floor over the first. Where the
    bench timed an empty kernel (launch_us), x_floor_with_launches is the time over the roofline plus the
    call's launches at that cost: what no kernel of that many launches gets under."""
    bench = json.loads(path.read_text())
    bench["peak_tflops"] = peak_tflops
    for row in bench["rows"]:
        floor_us = row["bytes"] / (bench["peak_tbps"] * 1e12) * 1e6
        compute_us = row.get("flops", 0) / (peak_tflops * 1e12) * 1e6
        row["floor_us"] = round(floor_us, 3)
        row["compute_floor_us"] = round(compute_us, 3)
        row["x_bandwidth_floor"] = round(row["time_us"] / floor_us, 2)  # the target: at most 1.5
        row["x_floor"] = round(row["time_us"] / max(floor_us, compute_us), 2)
        if "launch_us" in bench and "launches" in row:
            row["launch_floor_us"] = round(row["launches"] * bench["launch_us"], 3)
            row["x_floor_with_launches"] = round(row["time_us"] / (max(floor_us, compute_us) + row["launch_floor_us"]), 2)
    return bench


def read_kernel_profile(path: Path) -> dict:
    """kernel_profile.csv: what `kernel_bench --once` printed (its shapes in launch order), then Nsight
    Compute's `--csv --page details` table, one row per (launch, section, metric) -> the launches in
    order, each with its kernel's short name, grid, block and metrics ("Section: Metric (unit)")."""
    lines = path.read_text().splitlines()
    header = next((i for i, line in enumerate(lines) if line.startswith('"ID"')), len(lines))
    shapes = [line for line in lines[:header] if line.strip() and not line.startswith("==")]
    launches: dict[str, dict] = {}
    for row in csv.DictReader(lines[header:]):
        launch = launches.setdefault(row["ID"], {
            "id": int(row["ID"]), "kernel": short_kernel_name(row["Kernel Name"]),
            "grid": row.get("Grid Size"), "block": row.get("Block Size"), "metrics": {}})
        unit = row.get("Metric Unit") or ""
        name = f"{row['Section Name']}: {row['Metric Name']}" + (f" ({unit})" if unit else "")
        launch["metrics"][name] = number(row["Metric Value"])
    return {"tool": "Nsight Compute", "shapes_in_launch_order": shapes, "launches": list(launches.values())}


def short_kernel_name(name: str) -> str:
    """'void dflash::(anonymous namespace)::mma_project_kernel<__nv_bfloat16, 1>(...)'
    -> 'mma_project_kernel<__nv_bfloat16, 1>'."""
    name = re.sub(r"^void ", "", name)
    name = re.sub(r"^dflash::(\(anonymous namespace\)::)?", "", name)
    return name.split("(", 1)[0]


def number(text: str) -> float | str:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return text


def read_pytest(path: Path) -> dict:
    """JUnit XML -> counts and each test's outcome (passed, failed, error, skipped: reason)."""
    root = ET.parse(path).getroot()
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    tests = {}
    for case in suite.iter("testcase"):
        name = f"{case.get('classname')}::{case.get('name')}"
        outcome = "passed"
        for child in case:
            if child.tag in ("failure", "error"):
                outcome = child.tag if child.tag == "error" else "failed"
            elif child.tag == "skipped":
                outcome = "skipped: " + (child.get("message") or "")
        tests[name] = outcome
    counts = {key: int(suite.get(key, 0)) for key in ("tests", "failures", "errors", "skipped")}
    return {**counts, "outcomes": tests}


# The benches' own records, each written by gpu_check.sh as <key>.json and kept as it is.
BENCH_RECORDS = ("step_bench", "decide_bench", "decide_bench_512", "host_step_bench", "executor_bench",
                 "executor_bench_eager", "executor_bench_drafter", "executor_bench_moe",
                 "executor_bench_moe_kernels", "executor_bench_standard", "executor_bench_capacity",
                 "executor_bench_capacity_kernels")


def read_json(path: Path) -> dict:
    return json.loads(path.read_text())


def build_record(work: Path, commit: str, peak_tflops: float) -> dict:
    record = {"device": read_smi(work / "smi.csv"), "commit": commit,
              "date": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
              "steps": read_steps(work / "steps.tsv")}
    readers = {"kernel_parity": ("kernel_parity.log", read_parity),
               "kernel_bench": ("kernel_bench.json", lambda p: read_kernel_bench(p, peak_tflops)),
               "kernel_profile": ("kernel_profile.csv", read_kernel_profile),
               "pytest_gpu": ("pytest.xml", read_pytest),
               **{key: (f"{key}.json", read_json) for key in BENCH_RECORDS}}
    for key, (name, read) in readers.items():
        if (work / name).is_file():
            record[key] = read(work / name)
    projected = projected_speedups(record)
    if projected:
        record["projected_speedup"] = projected
    spans = attention_spans(record)
    if spans:
        record["attention_spans"] = spans
    return record


# The DFlash authors' published figures for Qwen3-8B-DFlash-b16 (B=16, T=0, HF backend on a B200, concurrency
# 1): (dataset, acceptance length tau, their measured speedup). tau counts the bonus token: tokens per step.
PUBLISHED = (("Alpaca", 3.16, 2.27), ("HumanEval", 6.55, 5.20), ("MATH500", 7.87, 6.17))


def projected_speedups(record: dict, block: int = 16) -> list[dict]:
    """DFlash's speedup over plain decoding from the measured step costs and the published tau: a step
    (draft + verify of `block`) yields tau tokens where a plain step yields one. Two depths: our executor
    as measured (a few of the model's layers), and the full model (the PyTorch floor's projected target
    steps, step_bench, plus our executor's draft, whose one-layer drafter does not grow with the target)."""
    bench = record.get("executor_bench")
    if not bench:
        return []
    cost = {(r["phase"], r["rows"], r["block"]): r["ms"] for r in bench["results"]}
    floor = {(s["rows"], s["new"]): s["projected_full_ms"] for s in record.get("step_bench", {}).get("steps", [])}
    found = []
    for rows in sorted({r for (_, r, _) in cost}):
        draft = cost.get(("draft", rows, block))
        depths = [(f"{bench['layers']} of {bench['shape']['full_layers']} layers, our executor",
                   cost.get(("verify", rows, 1)), cost.get(("verify", rows, block))),
                  ("full depth: PyTorch floor's target + our draft", floor.get((rows, 1)), floor.get((rows, block)))]
        for depth, plain, verify in depths:
            if None in (plain, verify, draft):
                continue
            step = verify + draft
            found.append({"rows": rows, "block": block, "depth": depth, "plain_ms": plain, "step_ms": round(step, 3),
                          "speedup": {name: round(tau * plain / step, 2) for name, tau, _ in PUBLISHED}})
    return found


# The runs that compare what a verify's attention reads, at the bench's default slots and at a server's
# 4,096-token ones: PyTorch's attention (a captured run spans the whole slot, masked) or our BlockAttention
# kernel (each row's length read on the device), whichever the run's target took.
ATTENTION_RUNS = ("executor_bench_standard", "executor_bench", "executor_bench_capacity",
                  "executor_bench_capacity_kernels")


def attention_spans(record: dict) -> list[dict]:
    """Per (rows, block) of the verifies that two or more of those runs timed: each run's ms, labelled with
    its attention (from the run's own target_kernels) and slot size."""
    def attention(bench: dict) -> str:
        return "BlockAttention" if "BlockAttention" in bench.get("target_kernels", ()) else "SDPA"

    runs = [(record[key], attention(record[key])) for key in ATTENTION_RUNS if key in record]
    cost = [{(r["rows"], r["block"]): r["ms"] for r in bench["results"] if r["phase"] == "verify"}
            for bench, _ in runs]
    found = []
    for rows, block in sorted(set().union(*cost)):
        ms = {f"{label}, {bench.get('capacity', 'default')} slots": c[(rows, block)]
              for (bench, label), c in zip(runs, cost, strict=True) if (rows, block) in c}
        if len(ms) >= 2:
            found.append({"rows": rows, "block": block, "ms": ms})
    return found


def problems(record: dict) -> list[str]:
    """One line per thing that did not pass: a failed step, a parity case, a gpu test."""
    found = [f"step {s['step']} skipped: past the check's time budget" if s["exit"] == SKIPPED else
             f"step {s['step']} exited {s['exit']}" for s in record["steps"] if s["exit"] != 0]
    found += [f"kernel parity: {p['case']} {p['dtype']} {p['max_scaled_error']:.2e}"
              for p in record.get("kernel_parity", []) if not p["ok"]]
    found += [f"pytest -m gpu: {name} {outcome}" for name, outcome in
              record.get("pytest_gpu", {}).get("outcomes", {}).items() if outcome in ("failed", "error")]
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("work", type=Path)
    parser.add_argument("--commit", required=True)
    parser.add_argument("-o", "--out-dir", type=Path, default=Path("docs/bench"))
    parser.add_argument("--peak-tflops", type=float, default=989.0,
                        help="dense 16-bit tensor-core peak (H100 and H200 SXM: 989)")
    args = parser.parse_args()
    record = build_record(args.work, args.commit, args.peak_tflops)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    path = args.out_dir / f"gpu-{device_slug(record['device']['name'])}.json"
    path.write_text(json.dumps(record, indent=1) + "\n")
    print(f"{record['device']['name']} (driver {record['device']['driver']}), commit {args.commit[:12]}")
    for step in record["steps"]:
        print(f"  {step['step']:<14} exit {step['exit']:<4} {step['seconds']:8.1f} s")
    for row in record.get("kernel_bench", {}).get("rows", []):
        with_launches = (f"  {row['x_floor_with_launches']:7.2f}x with {row['launches']} launches"
                         if "x_floor_with_launches" in row else "")
        print(f"  {row['op']:<15} {row['shape']:<24} {row['time_us']:9.2f} us  {row['x_bandwidth_floor']:7.2f}x "
              f"bandwidth floor  {row['x_floor']:7.2f}x roofline{with_launches}")
    if record.get("projected_speedup"):
        published = ", ".join(f"{name} {x}x (tau {tau})" for name, tau, x in PUBLISHED)
        print(f"  projected DFlash speedup at B=16 from the published tau; the authors measured {published} at "
              "concurrency 1 on a B200:")
    for p in record.get("projected_speedup", []):
        gains = ", ".join(f"{name} {x}x" for name, x in p["speedup"].items())
        print(f"    {p['rows']:>2} rows, {p['depth']}: plain {p['plain_ms']} ms, step {p['step_ms']} ms -> {gains}")
    for h in record.get("host_step_bench", {}).get("results", []):
        print(f"  host time of a replayed verify of {h['block']}, {h['layers']} layers x {h['rows']} rows: {h['us']} us")
    for a in record.get("attention_spans", []):
        print(f"  verify {a['rows']} row x {a['block']}: " + ", ".join(f"{k} {ms} ms" for k, ms in a["ms"].items()))
    for p in record.get("executor_bench", {}).get("profile", []):
        print(f"  {p['phase']}, {p['rows']} row x {p['block']}: GPU busy {p['gpu_busy_ms']} of {p['ms']} ms, "
              f"idle {p['gpu_idle_share']:.0%} (the host's share; target 5 %)")
        for k in p.get("top_kernels", [])[:5]:
            print(f"      {k['us']:9.1f} us  {k['calls']:6g} calls  {k['name'][:90]}")
    found = problems(record)
    for line in found:
        print(f"problem: {line}")
    print(f"wrote {path}")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())

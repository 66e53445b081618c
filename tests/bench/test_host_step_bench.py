"""scripts/host_step_bench.py (the host's share of a replayed verify) on the CPU: every depth and row count
runs through the executor and the torch backend's graph call to a stand-in replay, and is recorded; the
timings are not checked (benchmarks print them)."""

from __future__ import annotations

from bench_scripts import run_bench


def test_the_bench_times_every_depth_and_row_count_and_records_them(tmp_path):
    stdout, record = run_bench("host_step_bench.py", tmp_path / "host_step_bench.json", "--device", "cpu",
                               "--layers", "1,3", "--rows", "1,2", "--block", 4, "--repeat", 3)
    assert [(r["layers"], r["rows"], r["block"]) for r in record["results"]] == [
        (1, 1, 4), (1, 2, 4), (3, 1, 4), (3, 2, 4)]
    assert all(r["us"] > 0 for r in record["results"])
    assert "| 3 | 2 |" in stdout

"""scripts/decide_bench.py (the GPU check's decision costs) at a small vocabulary on the CPU: every row kind,
row count and sampling case runs through the executor's decisions and is recorded; the timings are not
checked (benchmarks print them)."""

from __future__ import annotations

from bench_scripts import run_bench


def test_the_bench_decides_every_case_and_records_it(tmp_path):
    stdout, record = run_bench("decide_bench.py", tmp_path / "decide_bench.json", "--device", "cpu", "--vocab", 3000,
                               "--rows", "1,3", "--block", 4, "--repeat", 2)
    assert not record["decides_on_device"]
    cases = {(r["rows_kind"], r["rows"], r["case"]) for r in record["results"]}
    assert cases == {(kind, rows, case) for kind in ("flat", "peaked") for rows in (1, 3)
                     for case in ("greedy", "T=0.8", "T=0.8 top-k 50", "T=0.8 top-p 0.95")}
    assert all(r["ms"] > 0 for r in record["results"])
    assert "| 3 | peaked |" in stdout


def test_the_bench_records_each_limit_on_the_pairs_a_cluster_decides(tmp_path):
    """--wide-pairs 0,16: every setting once per limit (set for the core through DFLASH_DECIDE_WIDE_PAIRS,
    which only a GPU's device reads), each result naming its limit."""
    stdout, record = run_bench("decide_bench.py", tmp_path / "decide_bench.json", "--device", "cpu", "--vocab", 500,
                               "--rows", 1, "--block", 4, "--repeat", 1, "--wide-pairs", "0,16")
    results = record["results"]
    assert sorted({r["wide_pairs"] for r in results}) == [0, 16]
    assert len(results) == 2 * 2 * 4  # limits x row kinds x cases
    assert "| 0 | 1 | flat |" in stdout and "| 16 | 1 | peaked |" in stdout

"""scripts/priority_bench.py as its users run it, at a tiny size: both policies over the same requests,
the interactive ones preempting batch ones by priority only, the replies the same under both."""

from bench_scripts import run_bench


def test_the_priority_bench_measures_both_policies_on_the_same_replies(tiny_pairs, tmp_path):
    target, draft = tiny_pairs["qwen3"]
    stdout, record = run_bench("priority_bench.py", tmp_path / "priority.json", "--target", target, "--draft", draft,
                               "--backend", "torch", "--slots", 2, "--interactive", 2, "--gap", 2,
                               "--batch-tokens", 24, "--interactive-tokens", 4)
    assert "greedy replies the same under both policies: yes" in stdout and record["same_tokens"] is True
    fcfs, priority = record["runs"]
    assert (fcfs["policy"], priority["policy"]) == ("fcfs", "priority")
    assert fcfs["preemptions"] == 0 and priority["preemptions"] == priority["batch"]["preempted"] >= 1
    for run in (fcfs, priority):
        assert (run["interactive"]["requests"], run["batch"]["requests"]) == (2, 4)
        assert run["batch"]["tokens"] == 4 * 24 and run["interactive"]["preempted"] == 0

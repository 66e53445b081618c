"""Benchmark prompt sets: counts, formats, determinism, user files and their errors."""

import json

import pytest

from dflash_trt.bench import datasets
from dflash_trt.errors import DFlashError

COUNTS = {"humaneval": 164, "mt-bench": 80, "gsm": 200, "math": 270}


@pytest.mark.parametrize("name", sorted(COUNTS))
def test_each_set_has_its_count_and_wrapper(name):
    prompts = datasets.load_prompts(name)
    assert len(prompts) == COUNTS[name] and all(p.strip() for p in prompts)
    assert len(set(prompts)) == len(prompts)  # no duplicated problem
    assert name in datasets.SOURCES
    if name == "humaneval":
        assert all(p.startswith("Write a solution to the following problem") and p.endswith("```") for p in prompts)
    if name in ("gsm", "math"):
        assert all(p.endswith("put your final answer within \\boxed{}.") for p in prompts)


def test_humaneval_and_mt_bench_keep_their_source_order_and_fields():
    rows = [json.loads(line) for line in (datasets.DATA / "humaneval.jsonl").read_text().splitlines()]
    assert [r["id"] for r in rows] == [f"HumanEval/{i}" for i in range(164)]
    assert all("def " in r["prompt"] and ('"""' in r["prompt"] or "'''" in r["prompt"]) for r in rows)
    rows = [json.loads(line) for line in (datasets.DATA / "mt_bench.jsonl").read_text().splitlines()]
    assert [r["id"] for r in rows] == list(range(81, 161))
    assert all(len(r["turns"]) == 2 for r in rows)  # both turns shipped; the benchmark asks the first
    assert len({r["category"] for r in rows}) == 8 and all(sum(r["category"] == c for r in rows) == 10
                                                           for c in {r["category"] for r in rows})
    assert datasets.load_prompts("mt-bench") == [r["turns"][0] for r in rows]


def test_gsm_file_is_what_its_generator_makes():
    pytest.importorskip("reasoning_gym", reason="regenerating gsm needs the train extra (reasoning-gym)")
    from importlib import util
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "scripts" / "extract_bench_data.py"
    spec = util.spec_from_file_location("extract", script)
    extract = util.module_from_spec(spec)
    spec.loader.exec_module(extract)
    shipped = [json.loads(line) for line in (datasets.DATA / "gsm.jsonl").read_text().splitlines()[:5]]
    assert extract.gsm_rows(count=5) == shipped


def test_unknown_dataset_is_one_line():
    with pytest.raises(DFlashError, match="dataset 'alpaca' is unknown; choose one of humaneval, mt-bench, gsm, math"):
        datasets.load_prompts("alpaca")


def test_a_user_file_with_prompts_and_turns(tmp_path):
    path = tmp_path / "mine.jsonl"
    path.write_text('{"prompt": "a"}\n\n{"turns": ["b", "c"]}\n')
    assert datasets.load_prompt_file(path) == ["a", "b"]


@pytest.mark.parametrize("content, message", [
    (None, "does not exist"),
    ('{"prompt": "a"}\nnot json\n', r"mine.jsonl:2: not JSON"),
    ('{"prompt": "a"}\n{"text": "b"}\n', r"mine.jsonl:2: needs a non-empty \"prompt\""),
    ('{"prompt": "  "}\n', r"mine.jsonl:1: needs a non-empty"),
    ("\n\n", "no prompts in the file"),
])
def test_bad_user_files_are_one_line(tmp_path, content, message):
    path = tmp_path / "mine.jsonl"
    if content is not None:
        path.write_text(content)
    with pytest.raises(DFlashError, match=message):
        datasets.load_prompt_file(path)

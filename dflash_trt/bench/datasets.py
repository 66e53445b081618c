"""Held-out prompt sets shipped with the package (see bench/README.md for provenance)."""

from __future__ import annotations

import json
from pathlib import Path

from dflash_trt.errors import DFlashError

DATA = Path(__file__).resolve().parent / "data"
HUMANEVAL_WRAPPER = "Write a solution to the following problem and make sure that it passes the tests:\n```python\n{prompt}\n```"


def _rows(name: str) -> list[dict]:
    return [json.loads(line) for line in (DATA / name).read_text().splitlines() if line.strip()]


def humaneval() -> list[str]:
    return [HUMANEVAL_WRAPPER.format(prompt=row["prompt"]) for row in _rows("humaneval.jsonl")]


def mt_bench() -> list[str]:
    return [row["turns"][0] for row in _rows("mt_bench.jsonl")]


DATASETS = {"humaneval": humaneval, "mt-bench": mt_bench}


def load_prompts(name: str, limit: int | None = None) -> list[str]:
    if name not in DATASETS:
        raise DFlashError(f"dataset '{name}' is unknown; choose one of {', '.join(DATASETS)}")
    prompts = DATASETS[name]()
    return prompts[:limit] if limit else prompts

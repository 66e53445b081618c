"""Regenerate the shipped benchmark prompt files that come from generators or wheels (deterministic).

    .venv/bin/python scripts/extract_bench_data.py          # needs reasoning-gym and network for PyPI

gsm:  reasoning-gym 0.1.25 gsm_symbolic, seed GSM_SEED (training uses the corpus seed, 0 by default,
      with its own sizes; the benchmark seed is far from any training seed on purpose).
math: the 270 CHAMP problems from the champ-dataset 1.0.0 wheel (MIT), read from the wheel file.
"""

from __future__ import annotations

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


def math_rows() -> list[dict]:
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "champ-dataset==1.0.0", "-d", tmp],
                       check=True)
        (wheel,) = Path(tmp).glob("champ_dataset-1.0.0-*.whl")
        with zipfile.ZipFile(wheel) as archive:
            problems = json.loads(archive.read("champ_dataset/dataset_files/v0.json"))["problems"]
    return [{"id": key, "category": p["category"], "question": p["_text"], "answer": p["_answer"]}
            for key, p in problems.items()]


def write(name: str, rows: list[dict]) -> None:
    (DATA / name).write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))
    print(f"{name}: {len(rows)} rows")


if __name__ == "__main__":
    write("gsm.jsonl", gsm_rows())
    write("math.jsonl", math_rows())

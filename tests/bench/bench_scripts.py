"""Running a script of scripts/ as its users do (a subprocess), for the tests of the benchmarks and the
GPU check's record: its exit, output and, where it writes one, its JSON record."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPTS = Path(__file__).parents[2] / "scripts"


def run_script(name: str, *args, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPTS / name), *map(str, args)], capture_output=True, text=True,
                          timeout=timeout)


def run_bench(name: str, out: Path, *args) -> tuple[str, dict]:
    """The bench `name` with `args` and --json `out`, which must succeed -> (its stdout, its record)."""
    done = run_script(name, *args, "--json", out)
    assert done.returncode == 0, done.stderr
    return done.stdout, json.loads(out.read_text())

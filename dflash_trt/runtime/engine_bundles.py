"""Open what `export` or `build` wrote: the runtime's view of either bundle, checked before loading.

An engine bundle carries its source bundle's sections (graphs, pair settings) in engine.json, so
the sessions read the same fields from both. Nothing heavier than ctypes is imported here.
"""

from __future__ import annotations

import json
from pathlib import Path

from dflash_trt.engines.machine import runtime_env
from dflash_trt.engines.manifest import ENGINE_MANIFEST, check_runtime, is_engine_bundle, read_engine_bundle
from dflash_trt.export.manifest import MANIFEST, read_bundle


def bundle_kind(root: str | Path) -> str:
    """"onnx" (an exported bundle) or the engine kind engine.json names; unchecked, for dispatch."""
    root = Path(root)
    if not is_engine_bundle(root):
        return "onnx"
    try:
        return json.loads((root / ENGINE_MANIFEST).read_text())["engine"]["kind"]
    except (json.JSONDecodeError, KeyError, TypeError):
        return "unknown"  # open_bundle then says what is wrong with it


def bundle_contract(root: str | Path) -> int:
    """The graph contract a bundle's graphs follow (1 where none is recorded); unchecked, for dispatch:
    whichever backend it picks opens the bundle with every check."""
    root = Path(root)
    engine = is_engine_bundle(root)
    try:
        manifest = json.loads((root / (ENGINE_MANIFEST if engine else MANIFEST)).read_text())
        return int((manifest["source"] if engine else manifest).get("contract", 1))
    except (OSError, json.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError):
        return 1  # the backend's checked open then says what is wrong with it


def bundle_capacity(root: str | Path) -> int | None:
    """The KV slot capacity a bundle's graphs fix (slots-trt), else None; unchecked, like
    bundle_contract: opening the bundle checks it."""
    root = Path(root)
    engine = is_engine_bundle(root)
    try:
        manifest = json.loads((root / (ENGINE_MANIFEST if engine else MANIFEST)).read_text())
        capacity = (manifest["source"] if engine else manifest).get("capacity")
        return capacity if isinstance(capacity, int) and not isinstance(capacity, bool) else None
    except (OSError, json.JSONDecodeError, KeyError, TypeError, AttributeError):
        return None


def open_bundle(root: str | Path) -> tuple[str, dict]:
    """-> (engine kind, manifest view with graphs/target/draft/flavour/custom_ops/dtype).

    The kind is "onnx" for an exported bundle (run by onnxruntime as it is)."""
    root = Path(root)
    if not is_engine_bundle(root):
        return "onnx", read_bundle(root)
    manifest = read_engine_bundle(root)
    kind = manifest["engine"]["kind"]
    plugin = manifest.get("plugin_library")
    check_runtime(manifest, runtime_env(kind, None if plugin is None else root / plugin["file"]), str(root))
    # The engines carry their source bundle's sections; file names are the engine bundle's.
    graphs = {name: {**spec, "file": manifest["engines"][name]["file"]} for name, spec in manifest["source"]["graphs"].items()}
    view = {**manifest["source"], "graphs": graphs, "dtype": manifest["dtype"], "engine": manifest["engine"],
            "max_seq_len": manifest["max_seq_len"], "max_batch": manifest["max_batch"], "profiles": manifest["profiles"],
            "block_size": manifest["block_size"]}
    return kind, view

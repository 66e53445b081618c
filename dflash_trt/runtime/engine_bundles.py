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


def _graph_manifest(root: Path) -> dict:
    """The manifest section that describes the graphs: bundle.json, or engine.json's `source`; unchecked,
    for dispatch (whichever backend is picked opens the bundle with every check). {} if unreadable."""
    engine = is_engine_bundle(root)
    try:
        manifest = json.loads((root / (ENGINE_MANIFEST if engine else MANIFEST)).read_text())
        section = manifest["source"] if engine else manifest
        return section if isinstance(section, dict) else {}
    except (OSError, json.JSONDecodeError, KeyError, TypeError):
        return {}


def bundle_contract(root: str | Path) -> int:
    """The graph contract a bundle's graphs follow (1 where none is recorded or it is unreadable)."""
    try:
        return int(_graph_manifest(Path(root)).get("contract", 1))
    except (TypeError, ValueError):
        return 1  # the backend's checked open then says what is wrong with it


def bundle_capacity(root: str | Path) -> int | None:
    """The KV slot capacity a bundle's graphs fix (slots-trt), else None."""
    capacity = _graph_manifest(Path(root)).get("capacity")
    return capacity if isinstance(capacity, int) and not isinstance(capacity, bool) else None


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

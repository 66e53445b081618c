"""`dflash-trt build`: an ONNX bundle -> an engine bundle (one engine per graph + engine.json).

Like export, the bundle is written into a hidden sibling directory and renamed into place after
engine.json (with every file's hash) is written last: an interrupted or failed build never leaves
a directory that looks complete, and an existing bundle is only replaced by a finished one.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

from dflash_trt.engines import machine, ort_engine, trt_engine
from dflash_trt.engines.config import BuildConfig
from dflash_trt.engines.manifest import ENGINE_FORMAT_VERSION, ENGINE_MANIFEST
from dflash_trt.engines.profiles import profile_dims
from dflash_trt.errors import DFlashError
from dflash_trt.export.manifest import GRAPHS, MANIFEST, bundle_quants, file_hashes, read_bundle, sha256
from dflash_trt.export.op_library import onnxruntime_refusal
from dflash_trt.export.quantize import quant_build_refusal
from dflash_trt.export.staging import staged_directory

PLUGIN_LIBRARY = Path(__file__).resolve().parent.parent / "_ops" / "libdflash_trt_plugins.so"


def check_graphs(flavour: str, dtype: str, config: BuildConfig, where: str, quants: tuple = ()) -> None:
    """Refusals that depend on the graphs' flavour, dtype and weight formats (the target's and the
    drafter's; known before an export too)."""
    refusal = quant_build_refusal(quants, config.engine, config.compute_capabilities)
    if refusal:
        raise DFlashError(f"{where}: {refusal}")
    if config.dtype is not None and config.dtype != dtype:
        raise DFlashError(f"{where} holds {dtype} graphs but --dtype asks for {config.dtype}: re-export with "
                          f"dflash-trt export --dtype, or build from --target/--draft")
    if config.engine == "onnxruntime":
        refusal = onnxruntime_refusal(flavour, dtype)
        if refusal:
            raise DFlashError(f"{where}: --engine onnxruntime cannot run {dtype} {flavour}-flavour graphs "
                              f"({refusal}): build TensorRT engines, or use fp32")
    if flavour == "slots" and config.engine != "onnxruntime":
        raise DFlashError(f"{where}: slots-flavour graphs use com.microsoft::GroupQueryAttention, which TensorRT "
                          f"cannot parse: export with --flavour slots-trt --capacity N (the same contract in "
                          f"standard ops) or --flavour portable, or build --engine onnxruntime")
    if flavour == "plugin" and config.engine == "tensorrt-rtx":
        raise DFlashError(f"{where}: plugin-flavour graphs; TensorRT-RTX cannot parse dflash:: custom ops: use "
                          f"--flavour portable, or --engine tensorrt")


def check_source(manifest: dict, config: BuildConfig, where: str) -> None:
    """Refusals that depend on the source bundle, before any engine is built."""
    check_graphs(manifest["flavour"], manifest.get("dtype", "float32"), config, where, bundle_quants(manifest))
    block = config.block_size or manifest["draft"]["block_size"]
    if block > manifest["draft"]["block_size"]:
        raise DFlashError(f"--block-size {block} is larger than the drafter's block size {manifest['draft']['block_size']}")


def _plugin_library(manifest: dict, config: BuildConfig) -> Path | None:
    if manifest["flavour"] != "plugin" or config.engine != "tensorrt":
        return None
    if not PLUGIN_LIBRARY.is_file():
        raise DFlashError("a plugin-flavour TensorRT build needs the dflash TensorRT plugin library: "
                          "bash scripts/build_plugins.sh (needs nvcc)")
    return PLUGIN_LIBRARY


def build_engines(source: Path, out: Path, config: BuildConfig, command: str | None = None,
                  progress: Callable[[str], None] = lambda step: None) -> dict:
    """Build every graph of the ONNX bundle `source` into `out`; returns the engine manifest."""
    source, out = Path(source), Path(out)
    manifest = read_bundle(source)
    check_source(manifest, config, str(source))
    if out.exists() and not config.force:
        raise DFlashError(f"{out} already exists; pass --force to replace it")
    plugin_library = _plugin_library(manifest, config)
    library_version = machine.installed_version(config.engine)
    if library_version is None:
        machine.library_module(config.engine)  # raises the install hint
    compute_capabilities = config.compute_capabilities
    if config.engine == "tensorrt":
        compute_capabilities = (_current_gpu(config),)
        refusal = quant_build_refusal(bundle_quants(manifest), config.engine, compute_capabilities)
        if refusal:
            raise DFlashError(f"{source}: {refusal}")
    block_size = config.block_size or manifest["draft"]["block_size"]
    with staged_directory(out) as tmp:
        profiles, engines = {}, {}
        for graph in GRAPHS:
            spec = manifest["graphs"][graph]
            profiles[graph] = profile_dims(graph, config.max_batch, config.max_seq_len, block_size,
                                           manifest["contract"], manifest.get("capacity"))
            src = source / spec["file"]
            if config.engine == "onnxruntime":
                engines[graph] = ort_engine.build_ort_graph(src, tmp / spec["file"], manifest["flavour"] == "plugin")
            else:
                engines[graph] = trt_engine.build_trt_graph(
                    config.engine, src, tmp / f"{graph}.engine", spec, profiles[graph], compute_capabilities,
                    plugin_library)  # every graph: a hybrid or MoE target holds dflash ops too
            progress(graph)
        _copy_tokenizer(source, manifest, tmp)
        plugin = None
        if plugin_library is not None:
            shutil.copy2(plugin_library, tmp / plugin_library.name)
            plugin = {"file": plugin_library.name, "version": machine.plugin_library_version(plugin_library),
                      "sha256": sha256(plugin_library)}
        engine_manifest = {
            "format_version": ENGINE_FORMAT_VERSION,
            "engine": {"kind": config.engine, "version": library_version,
                       **({"session_options": ort_engine.SESSION_OPTIONS} if config.engine == "onnxruntime" else {})},
            "compute_capabilities": list(compute_capabilities),
            "dtype": manifest.get("dtype", "float32"),
            "max_batch": config.max_batch,
            "max_seq_len": config.max_seq_len,
            "block_size": block_size,
            "profiles": {g: {phase: {k: list(v) for k, v in dims.items()} for phase, dims in p.items()}
                         for g, p in profiles.items()},
            "engines": engines,
            "plugin_library": plugin,
            "source": {"bundle_sha256": sha256(source / MANIFEST),
                       **{k: manifest[k] for k in ("contract", "flavour", "opset", "target_opset", "capacity", "quant",
                                                   "draft_quant", "min_query_tokens", "custom_ops", "graphs", "target", "draft",
                                                   "versions")
                          if k in manifest}},
            "command": command,
            "files": file_hashes(tmp),
        }
        (tmp / ENGINE_MANIFEST).write_text(json.dumps(engine_manifest, indent=2) + "\n")  # last: marks it complete
        progress(ENGINE_MANIFEST)
    return engine_manifest


def _copy_tokenizer(source: Path, manifest: dict, dest: Path) -> None:
    """Everything of the bundle that is not a graph: tokenizer files and chat template."""
    graph_files = {spec["file"] for spec in manifest["graphs"].values()}
    for name in manifest["files"]:
        if name in graph_files or name.removesuffix(".data") in graph_files:
            continue
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source / name, target)


def _current_gpu(config: BuildConfig) -> str:
    """Full TensorRT tunes for the GPU it runs on: the bundle is for that GPU's compute capability."""
    gpu = machine.gpu_compute_capability()
    if gpu is None:
        raise DFlashError("--engine tensorrt builds on the GPU it targets and no CUDA GPU is visible here; "
                          "for an ahead-of-time build without a GPU use --engine tensorrt-rtx")
    if config.compute_capabilities and config.compute_capabilities != (gpu,):
        raise DFlashError(f"--engine tensorrt builds for this GPU (SM {gpu}), not SM {', '.join(config.compute_capabilities)}: "
                          f"build on that GPU, or use --engine tensorrt-rtx for consumer GPUs")
    return gpu

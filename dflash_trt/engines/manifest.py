"""engine.json: what an engine bundle holds, and the checks a runtime makes before loading one.

The checks are pure functions of the manifest and of what this machine has (library version, GPU
compute capability, plugin library version), so each refusal is tested without a GPU. Each says in
one line what to rebuild or install. Torch-free, like export/manifest.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from dflash_trt.errors import DFlashError
from dflash_trt.export.manifest import load_manifest, verify_files

ENGINE_MANIFEST = "engine.json"
ENGINE_FORMAT_VERSION = 1
# engine kind -> (Python module that runs it, the name users know, pip package that installs it)
LIBRARIES = {
    "tensorrt-rtx": ("tensorrt_rtx", "TensorRT-RTX", "tensorrt-rtx-cu13"),
    "tensorrt": ("tensorrt", "TensorRT", "tensorrt-cu13"),
    "onnxruntime": ("onnxruntime", "ONNX Runtime", "onnxruntime"),
}


@dataclass(frozen=True)
class RuntimeEnv:
    """What this machine offers an engine bundle; None where it has nothing."""

    library_version: str | None  # of the bundle's engine library
    compute_capability: str | None = None  # "9.0"; None: no CUDA GPU
    plugin_version: int | None = None  # of the dflash TensorRT plugin library we would load


def is_engine_bundle(root: str | Path) -> bool:
    return (Path(root) / ENGINE_MANIFEST).is_file()


def read_engine_bundle(root: str | Path, verify_hashes: bool = True) -> dict:
    """The manifest of a complete, intact engine bundle; one clear line for anything else."""
    root = Path(root)
    path = root / ENGINE_MANIFEST
    manifest = load_manifest(root, ENGINE_MANIFEST, "engine bundle", "build")
    if manifest.get("format_version") != ENGINE_FORMAT_VERSION:
        raise DFlashError(f"{root}: engine bundle format {manifest.get('format_version')}; this dflash-trt reads format "
                          f"{ENGINE_FORMAT_VERSION}: rebuild it with dflash-trt build")
    for key in ("engine", "engines", "source", "files", "profiles"):
        if key not in manifest:
            raise DFlashError(f"{path}: the manifest has no '{key}' section (not written by dflash-trt build?)")
    if manifest["engine"].get("kind") not in LIBRARIES:
        raise DFlashError(f"{root}: unknown engine kind {manifest['engine'].get('kind')!r}")
    verify_files(root, manifest["files"], ENGINE_MANIFEST, "engine bundle", "rebuild", verify_hashes)
    return manifest


def _rebuild(manifest: dict, root: str) -> str:
    return manifest.get("command") or f"dflash-trt build --bundle SOURCE -o {root} --force"


def check_library(manifest: dict, installed: str | None, root: str = "the engine bundle") -> None:
    kind = manifest["engine"]["kind"]
    _, product, package = LIBRARIES[kind]
    built = manifest["engine"]["version"]
    if installed is None:
        raise DFlashError(f"{root} was built by {product} {built}, which is not installed here: "
                          f"pip install {package}=={built}")
    if kind == "onnxruntime":
        # ORT reads graphs an older ORT optimized (their contrib ops are kept stable), not newer ones.
        if _version_tuple(installed) < _version_tuple(built):
            raise DFlashError(f"{root} was optimized by ONNX Runtime {built}; this machine has {installed}: "
                              f"upgrade onnxruntime or rebuild with: {_rebuild(manifest, root)}")
        return
    if installed != built:  # TensorRT engines deserialize only in the exact version that built them
        raise DFlashError(f"{root} was built by {product} {built}; this machine has {installed}: "
                          f"rebuild with: {_rebuild(manifest, root)} (or pip install {package}=={built})")


def check_compute_capability(manifest: dict, gpu: str | None, root: str = "the engine bundle") -> None:
    if manifest["engine"]["kind"] == "onnxruntime":
        return
    built = manifest.get("compute_capabilities") or []
    if gpu is None:
        raise DFlashError(f"{root} holds TensorRT engines for SM {', '.join(built)} and no CUDA GPU is visible here: "
                          f"run it on such a GPU, or build a CPU bundle with --engine onnxruntime")
    if gpu not in built:
        hint = "--engine tensorrt on this GPU" if gpu == "9.0" else f"--compute-capability {gpu}"
        raise DFlashError(f"{root} was built for SM {', '.join(built)}; this GPU is SM {gpu}: rebuild with {hint}")


def check_plugin(manifest: dict, installed: int | None, root: str = "the engine bundle") -> None:
    plugin = manifest.get("plugin_library")
    if plugin is None:
        return
    if installed is None:
        raise DFlashError(f"{root} needs the dflash TensorRT plugin library (v{plugin['version']}), and "
                          f"{plugin['file']} could not be loaded: rebuild the bundle")
    if installed != plugin["version"]:
        raise DFlashError(f"{root} was built with dflash plugin ops v{plugin['version']}; the library here implements "
                          f"v{installed}: rebuild with: {_rebuild(manifest, root)}")


def check_runtime(manifest: dict, env: RuntimeEnv, root: str = "the engine bundle") -> None:
    """Every refusal, in the order a user fixes them: library, GPU, plugin."""
    check_library(manifest, env.library_version, root)
    check_compute_capability(manifest, env.compute_capability, root)
    check_plugin(manifest, env.plugin_version, root)


def _version_tuple(version: str) -> tuple[int, ...]:
    parts = []
    for part in version.split("."):
        digits = "".join(ch for ch in part if ch.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts)

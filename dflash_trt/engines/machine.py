"""What this machine offers engines: the engine libraries and their versions, the GPU's compute
capability, the dflash plugin library's op version. The probes `build` and the runtime both use;
the checks that compare them with a manifest are in manifest.py."""

from __future__ import annotations

from pathlib import Path

from dflash_trt.engines.manifest import LIBRARIES, RuntimeEnv
from dflash_trt.errors import DFlashError


def library_module(kind: str):
    """The library that builds and runs an engine kind, or one line saying how to install it."""
    module, product, package = LIBRARIES[kind]
    try:
        return __import__(module)
    except ImportError as err:
        raise DFlashError(f"--engine {kind} needs {product}, which does not import here ({err}): pip install {package}"
                          + (" (full TensorRT's libraries are not on PyPI: use it where NVIDIA's installers put it)"
                             if kind == "tensorrt" else "")) from None


def installed_version(kind: str) -> str | None:
    try:
        return library_module(kind).__version__
    except DFlashError:
        return None


def gpu_compute_capability() -> str | None:
    """"9.0" for an H100; None without a CUDA GPU (or without torch)."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    major, minor = torch.cuda.get_device_capability()
    return f"{major}.{minor}"


def plugin_library_version(path: Path) -> int | None:
    """The op contract version a built plugin library implements; None if it does not load."""
    import ctypes

    try:
        return int(ctypes.CDLL(str(path)).DflashOpsVersion())
    except (OSError, AttributeError):
        return None


def runtime_env(kind: str, plugin: Path | None) -> RuntimeEnv:
    """What this machine offers an engine bundle of `kind` (library, GPU, plugin library)."""
    version = installed_version(kind)
    if kind == "onnxruntime":
        return RuntimeEnv(version)
    loaded = plugin_library_version(plugin) if plugin is not None and plugin.is_file() else None
    return RuntimeEnv(version, gpu_compute_capability(), loaded)

"""Where the `dflash` onnxruntime op library lives, sessions that load it, and which bundles
onnxruntime can run (torch-free)."""

from __future__ import annotations

from pathlib import Path

from dflash_trt.errors import DFlashError

LIBRARY = Path(__file__).resolve().parent.parent / "_ops" / "libdflash_ort_ops.so"


def op_library() -> Path:
    if not LIBRARY.is_file():
        raise DFlashError("plugin flavour needs the dflash onnxruntime op library: build it with bash scripts/build_plugins.sh")
    return LIBRARY


def library_version() -> int | None:
    """The op contract version the built library implements (None: built before versions were exported)."""
    import ctypes

    library = ctypes.CDLL(str(op_library()))
    return library.DflashOpsVersion() if hasattr(library, "DflashOpsVersion") else None


def check_library_version(bundle_version: int, where: str) -> None:
    built = library_version()
    if built != bundle_version:
        raise DFlashError(
            f"{where}: exported for dflash ops version {bundle_version}, but the op library implements version "
            f"{built}: rebuild it (bash scripts/build_plugins.sh) or re-export the bundle")


def onnxruntime_refusal(flavour: str, dtype: str) -> str | None:
    """Why onnxruntime's CPU provider cannot run graphs of this flavour and dtype; None when it can.

    Measured with onnxruntime 1.32: float16 graphs run (ops without a float16 CPU kernel are computed
    in float32 between casts); bfloat16 ones fail to load ("Could not find an implementation for
    MatMul(13)"); the dflash op library implements float32 only.
    """
    if dtype == "bfloat16":
        return "onnxruntime's CPU provider has no bfloat16 kernels (MatMul, Mul)"
    if flavour == "plugin" and dtype != "float32":
        return "the dflash onnxruntime op library runs float32 only"
    return None


def session_options(plugin: bool, threads: int | None = None):
    import onnxruntime as ort

    options = ort.SessionOptions()
    # A bundle's three sessions take turns, each with its own thread pool. Left spinning after a
    # Run, one session's idle workers steal the cores the next session needs: measured on our 2-core
    # CPU, stopping them doubled DFlash throughput (B=16: 15.5 -> 31.6 tok/s) and left AR unchanged.
    options.add_session_config_entry("session.force_spinning_stop", "1")
    if threads:
        options.intra_op_num_threads = threads
    if plugin:
        options.register_custom_ops_library(str(op_library()))
    return options

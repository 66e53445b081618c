"""The checks a runtime makes before loading an engine bundle: pure functions, one line per refusal."""

import pytest

from dflash_trt.engines.manifest import RuntimeEnv, check_runtime
from dflash_trt.errors import DFlashError


def manifest(kind="tensorrt-rtx", version="1.7.1.116", ccs=("12.0",), plugin=None):
    return {"engine": {"kind": kind, "version": version}, "compute_capabilities": list(ccs),
            "plugin_library": plugin, "command": "dflash-trt build --bundle export/x -o engines/x"}


PLUGIN = {"file": "libdflash_trt_plugins.so", "version": 1, "sha256": "0" * 64}


@pytest.mark.parametrize(("built", "env", "message"), [
    (manifest(), RuntimeEnv(None, "12.0"), "TensorRT-RTX 1.7.1.116, which is not installed here: pip install tensorrt-rtx-cu13==1.7.1.116"),
    (manifest(), RuntimeEnv("1.8.0.1", "12.0"), "built by TensorRT-RTX 1.7.1.116; this machine has 1.8.0.1: rebuild with: dflash-trt build"),
    (manifest(), RuntimeEnv("1.7.1.116", None), "no CUDA GPU is visible here"),
    (manifest(), RuntimeEnv("1.7.1.116", "8.9"), "built for SM 12.0; this GPU is SM 8.9: rebuild with --compute-capability 8.9"),
    (manifest("tensorrt", "10.14.1", ("9.0",)), RuntimeEnv("10.14.1", "10.0"), "this GPU is SM 10.0: rebuild with --compute-capability 10.0"),
    (manifest("tensorrt", "10.14.1", ("12.0",)), RuntimeEnv("10.14.1", "9.0"), "rebuild with --engine tensorrt on this GPU"),
    (manifest("tensorrt", "10.14.1", ("9.0",), PLUGIN), RuntimeEnv("10.14.1", "9.0", None), "plugin library (v1)"),
    (manifest("tensorrt", "10.14.1", ("9.0",), PLUGIN), RuntimeEnv("10.14.1", "9.0", 2), "dflash plugin ops v1; the library here implements v2"),
    (manifest("onnxruntime", "1.32.0", ()), RuntimeEnv("1.20.1"), "optimized by ONNX Runtime 1.32.0; this machine has 1.20.1"),
])
def test_each_mismatch_is_refused_in_one_line_saying_what_to_do(built, env, message):
    with pytest.raises(DFlashError) as err:
        check_runtime(built, env, "engines/x")
    assert message in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize(("built", "env"), [
    (manifest(ccs=("12.0", "8.9")), RuntimeEnv("1.7.1.116", "8.9")),
    (manifest("tensorrt", "10.14.1", ("9.0",), PLUGIN), RuntimeEnv("10.14.1", "9.0", 1)),
    (manifest("onnxruntime", "1.20.1", ()), RuntimeEnv("1.32.0")),  # a newer ORT reads older optimized graphs
])
def test_a_matching_machine_passes(built, env):
    check_runtime(built, env)

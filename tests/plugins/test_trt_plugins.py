"""The TensorRT plugin library (libdflash_trt_plugins.so): its C++ tests and what TensorRT needs of the file.

The host-side suite (attributes, serialization, shapes, formats, refusals) runs here through ctest;
the kernels' parity with their CPU references needs a GPU. Building an engine with the plugins needs
TensorRT itself, which no machine of this project has (plugins/README.md).
"""

import shutil
import subprocess

import pytest

from dflash_trt.engines.build import PLUGIN_LIBRARY
from dflash_trt.engines.machine import plugin_library_version
from dflash_trt.export.plugin_ops import OP_VERSION

BUILD = PLUGIN_LIBRARY.parents[2] / "build" / "plugins" / "cmake"  # where scripts/build_plugins.sh builds it

if not PLUGIN_LIBRARY.is_file():
    pytest.skip("TensorRT plugin library not built (bash scripts/build_plugins.sh; needs nvcc)",
                allow_module_level=True)


def run(*command: str) -> subprocess.CompletedProcess:
    return subprocess.run(command, capture_output=True, text=True, timeout=300)


def need_tool(name: str) -> None:
    if shutil.which(name) is None:
        pytest.skip(f"{name} not found")


def need_build_dir() -> None:
    if not (BUILD / "CTestTestfile.cmake").is_file():
        pytest.skip(f"no CMake build directory at {BUILD} (bash scripts/build_plugins.sh makes it)")


def test_the_host_side_cpp_suite_passes():
    need_tool("ctest")
    need_build_dir()
    done = run("ctest", "--test-dir", str(BUILD), "--label-exclude", "gpu", "--output-on-failure")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "100% tests passed" in done.stdout, done.stdout


def test_only_the_entry_points_are_exported():
    need_tool("nm")
    done = run("nm", "-D", "--defined-only", str(PLUGIN_LIBRARY))
    functions = {line.split()[-1] for line in done.stdout.splitlines() if line.split()[1:2] == ["T"]}
    # TensorRT's, and the kernels' C entry points for the torch backend's custom ops (common/kernel_api.cpp)
    assert functions == {"getCreators", "setLoggerFinder", "DflashOpsVersion", "dflash_block_attention",
                         "dflash_block_attention_workspace", "dflash_inject_kv", "dflash_inject_kv_workspace",
                         "dflash_gated_delta_rule", "dflash_moe", "dflash_moe_workspace"}


def test_the_library_needs_no_tensorrt_library_to_load():
    # Header-only against TensorRT: a registry that loads the library supplies everything it calls.
    need_tool("nm")
    need_tool("readelf")
    undefined = run("nm", "-D", "--undefined-only", str(PLUGIN_LIBRARY)).stdout
    needed = run("readelf", "-d", str(PLUGIN_LIBRARY)).stdout
    assert "nvinfer" not in undefined.lower() and "nvonnxparser" not in undefined.lower()
    assert "libnvinfer" not in needed and "libcudart" not in needed  # the CUDA runtime is linked statically


def test_the_library_implements_the_op_contract_the_exporter_writes():
    assert plugin_library_version(PLUGIN_LIBRARY) == OP_VERSION


@pytest.mark.gpu
def test_the_cuda_kernels_match_their_cpu_references():
    need_build_dir()
    parity = BUILD / "kernel_parity"
    if not parity.is_file():
        pytest.skip(f"{parity} not built")
    done = run(str(parity))
    if done.returncode == 77:
        pytest.skip(done.stdout.strip())
    print(done.stdout)
    assert done.returncode == 0, done.stdout + done.stderr

"""The C++ core's tests. They skip (with the reason) only when dflash_trt._core was never built;
a module that is built but fails to import is a failure, not a skip. Test modules share one
namespace (no __init__.py), hence test_core_acceptance/test_core_sampling beside tests/spec's."""

import importlib
import importlib.util
import os
import shutil
import subprocess
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def core():
    if importlib.util.find_spec("dflash_trt._core") is None:
        pytest.skip("dflash_trt._core is not built: run `bash scripts/setup.sh` (needs a C++17 compiler)")
    return importlib.import_module("dflash_trt._core")


@pytest.fixture(scope="session")
def ort(core):
    """dflash_trt.runtime.ort_executor, where the core has its onnxruntime executor."""
    if not core.HAS_ORT_EXECUTOR:
        pytest.skip("dflash_trt._core was built without the onnxruntime executor (see csrc/README.md, Build)")
    from dflash_trt.runtime import ort_executor

    return ort_executor


@pytest.fixture(scope="session")
def runner_module(core):
    from dflash_trt.runtime import batch_runner

    return batch_runner


@pytest.fixture(scope="session")
def llms(tiny_pairs, small_vocab_pair):
    from dflash_trt import LLM

    made = {family: LLM(*map(str, tiny_pairs[family]), backend="torch") for family in ("llama", "qwen3")}
    made["small_vocab"] = LLM(*map(str, small_vocab_pair), backend="torch")  # drafts often accepted
    return made


@pytest.fixture(scope="session")
def fake_cuda(core, tmp_path_factory):
    """A fake CUDA driver (fake_trt/fake_cuda.cpp, compiled here in a few seconds): "device" memory is host
    memory, the stream runs its copies and launches at the next synchronisation, and a kernel launch runs
    the kernel's rules compiled for the host, so an executor on a CUDA device runs its device code paths
    (uploads, waits, kernel arguments, offsets) on a CPU."""
    cuda = Path(os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or "/usr/local/cuda")  # as setup.py
    if not core.HAS_CUDA_DEVICE or shutil.which("g++") is None or not (cuda / "include" / "cuda.h").is_file():
        pytest.skip("the fake CUDA driver needs g++, the CUDA headers and a core built with its CUDA device")
    csrc = Path(__file__).resolve().parents[2] / "csrc"
    out = tmp_path_factory.mktemp("fake-cuda") / "libfake_cuda.so"
    subprocess.run(["g++", "-std=c++17", "-O1", "-shared", "-fPIC", "-fvisibility=hidden", f"-I{csrc}",
                    f"-I{cuda / 'include'}", str(Path(__file__).parent / "fake_trt" / "fake_cuda.cpp"), "-o", str(out)],
                   check=True)
    return out

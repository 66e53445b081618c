"""Builds the C++ runtime core, dflash_trt._core; everything else about the package is in pyproject.toml.

A C++17 compiler is required: `pip install -e .` (scripts/setup.sh) compiles csrc/*.cpp. -O2 and no
-march=native, so the module runs on any x86-64/aarch64 machine the wheel is copied to.
"""

import os
from glob import glob
from pathlib import Path

from pybind11.setup_helpers import ParallelCompile, Pybind11Extension
from setuptools import setup

# Compile the translation units in parallel (the binding file dominates; the others are small).
ParallelCompile(default=0).install()

# The onnxruntime executor (csrc/ort_*.cpp) compiles against the ONNX Runtime C API headers that
# scripts/fetch_headers.sh extracts; it loads libonnxruntime at run time (dlopen), so nothing links
# to onnxruntime. Without the headers the core builds without it (_core.HAS_ORT_EXECUTOR is False).
ORT_HEADERS = Path("build/plugins/ort/usr/include/onnxruntime")
WITH_ORT = (ORT_HEADERS / "onnxruntime_c_api.h").is_file()
ORT_ONLY = {"csrc/ort_api.cpp", "csrc/ort_executor.cpp"}

# GPU memory (csrc/cuda_device.cpp) compiles against the CUDA toolkit's headers (cuda.h: the driver
# API) and loads libcuda at run time, so nothing links to CUDA. Without them the core builds without
# it (_core.HAS_CUDA_DEVICE is False). The TensorRT executor (csrc/trt_*.cpp) also needs the TensorRT
# headers (fetch_headers.sh trt); it loads libnvinfer at run time (else _core.HAS_TRT_EXECUTOR is False).
TRT_HEADERS = Path("build/plugins/trt/kernel_lens/include/tensorrt")
CUDA_HEADERS = Path(os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or "/usr/local/cuda") / "include"
WITH_CUDA = (CUDA_HEADERS / "cuda.h").is_file()
WITH_TRT = WITH_CUDA and (TRT_HEADERS / "NvInferRuntime.h").is_file()
CUDA_ONLY = {"csrc/cuda_device.cpp"}
TRT_ONLY = {"csrc/trt_api.cpp", "csrc/trt_executor.cpp"}


def compiled(source: str) -> bool:
    return ((WITH_ORT or source not in ORT_ONLY) and (WITH_CUDA or source not in CUDA_ONLY)
            and (WITH_TRT or source not in TRT_ONLY))


setup(
    ext_modules=[
        Pybind11Extension(
            "dflash_trt._core",
            sorted(f for f in glob("csrc/*.cpp") if compiled(f)),
            include_dirs=["csrc"] + ([str(ORT_HEADERS)] if WITH_ORT else []) + ([str(CUDA_HEADERS)] if WITH_CUDA else [])
            + ([str(TRT_HEADERS)] if WITH_TRT else []),
            define_macros=[("DFLASH_WITH_ORT", "1")] * WITH_ORT + [("DFLASH_WITH_CUDA", "1")] * WITH_CUDA
            + [("DFLASH_WITH_TRT", "1")] * WITH_TRT,
            libraries=["dl"] if WITH_ORT or WITH_CUDA else [],
            cxx_std=17,
            # the TensorRT headers mark their legacy plugin enums deprecated; we use none of them
            extra_compile_args=["-O2"] + ["-Wno-deprecated-declarations"] * WITH_TRT,
        )
    ]
)

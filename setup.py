"""Builds the C++ runtime core, dflash_trt._core; everything else about the package is in pyproject.toml.

A C++17 compiler is required: `pip install -e .` (scripts/setup.sh) compiles csrc/*.cpp. -O2 and no
-march=native, so the module runs on any x86-64/aarch64 machine the wheel is copied to.
"""

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

setup(
    ext_modules=[
        Pybind11Extension(
            "dflash_trt._core",
            sorted(f for f in glob("csrc/*.cpp") if WITH_ORT or f not in ORT_ONLY),
            include_dirs=["csrc"] + ([str(ORT_HEADERS)] if WITH_ORT else []),
            define_macros=[("DFLASH_WITH_ORT", "1")] if WITH_ORT else [],
            libraries=["dl"] if WITH_ORT else [],
            cxx_std=17,
            extra_compile_args=["-O2"],
        )
    ]
)

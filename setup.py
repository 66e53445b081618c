"""Builds the C++ runtime core, dflash_trt._core; everything else about the package is in pyproject.toml.

A C++17 compiler is required: `pip install -e .` (scripts/setup.sh) compiles csrc/*.cpp. -O2 and no
-march=native, so the module runs on any x86-64/aarch64 machine the wheel is copied to.
"""

from glob import glob

from pybind11.setup_helpers import ParallelCompile, Pybind11Extension
from setuptools import setup

# Compile the translation units in parallel (the binding file dominates; the others are small).
ParallelCompile(default=0).install()

setup(
    ext_modules=[
        Pybind11Extension(
            "dflash_trt._core",
            sorted(glob("csrc/*.cpp")),
            include_dirs=["csrc"],
            cxx_std=17,
            extra_compile_args=["-O2"],
        )
    ]
)

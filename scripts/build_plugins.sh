#!/usr/bin/env bash
# Build the dflash op libraries into dflash_trt/_ops/:
#   libdflash_ort_ops.so      onnxruntime custom ops, CPU (plugin-flavour bundles); needs a C++ compiler and CMake
#   libdflash_trt_plugins.so  TensorRT plugins with CUDA kernels; needs nvcc too: without it, a warning
# The headers (ONNX Runtime C/C++ API, TensorRT 10.14) come from packages, extracted under build/plugins/
# by scripts/fetch_headers.sh (nothing is installed). The TensorRT library's tests: ctest --test-dir
# build/plugins/cmake (tests/plugins/test_trt_plugins.py runs them).
set -euo pipefail
cd "$(dirname "$0")/.."

BUILD=build/plugins
ORT_HEADERS="$BUILD/ort/usr/include/onnxruntime"
TRT_HEADERS="$BUILD/trt/kernel_lens/include/tensorrt"

mkdir -p "$BUILD" dflash_trt/_ops
bash scripts/fetch_headers.sh ort

trt_options=(-DTRT_INCLUDE_DIR=)  # empty: the onnxruntime library only, even if an earlier run set it
nvcc=$(command -v nvcc || true)
if [ -z "$nvcc" ] && [ -x /usr/local/cuda/bin/nvcc ]; then nvcc=/usr/local/cuda/bin/nvcc; fi
if [ -z "$nvcc" ]; then
  echo "warning: no nvcc: building the onnxruntime op library only (TensorRT plugins need the CUDA toolkit)" >&2
elif bash scripts/fetch_headers.sh trt; then
  trt_options=(-DTRT_INCLUDE_DIR="$PWD/$TRT_HEADERS" -DCMAKE_CUDA_COMPILER="$nvcc")
else
  echo "warning: TensorRT headers not fetched (kernel-lens from PyPI): building the onnxruntime op library only" >&2
fi

log="$BUILD/build.log"
# -U: the GPUs plugins/CMakeLists.txt names, even if scripts/gpu_check.sh built here for one GPU.
if ! { cmake -S plugins -B "$BUILD/cmake" -DORT_INCLUDE_DIR="$PWD/$ORT_HEADERS" "${trt_options[@]}" \
         -UCMAKE_CUDA_ARCHITECTURES -DCMAKE_BUILD_TYPE=Release && cmake --build "$BUILD/cmake" -j "$(nproc)"; } >"$log" 2>&1; then
  tail -n 40 "$log" >&2
  echo "error: plugin build failed (full log: $log)" >&2
  exit 1
fi
grep -i "warning" "$log" >&2 || true

cp "$BUILD/cmake/libdflash_ort_ops.so" dflash_trt/_ops/
echo "built dflash_trt/_ops/libdflash_ort_ops.so"
if [ -f "$BUILD/cmake/libdflash_trt_plugins.so" ] && [ ${#trt_options[@]} -gt 1 ]; then
  cp "$BUILD/cmake/libdflash_trt_plugins.so" dflash_trt/_ops/
  echo "built dflash_trt/_ops/libdflash_trt_plugins.so (tests: ctest --test-dir $BUILD/cmake)"
else
  rm -f dflash_trt/_ops/libdflash_trt_plugins.so  # never leave one built from older sources
fi

#!/usr/bin/env bash
# Build the dflash onnxruntime op library (plugin-flavour bundles need it) into dflash_trt/_ops/.
# The ONNX Runtime C/C++ API headers are in no wheel; Debian ships them (MIT) in libonnxruntime-dev.
# We fetch that package by a pinned URL and checksum and extract only its headers: nothing is installed.
set -euo pipefail
cd "$(dirname "$0")/.."

DEB_URL="http://deb.debian.org/debian/pool/main/o/onnxruntime/libonnxruntime-dev_1.21.0+dfsg-1_amd64.deb"
DEB_SHA256="14f7d959d5deacbcf1504830d4189f91fc67382b399ed9ae9d3aa9c4050ced08"
BUILD=build/plugins
HEADERS="$BUILD/ort/usr/include/onnxruntime"

mkdir -p "$BUILD"
if [ ! -f "$HEADERS/onnxruntime_cxx_api.h" ]; then
  curl -sSfL -o "$BUILD/libonnxruntime-dev.deb" "$DEB_URL"
  echo "$DEB_SHA256  $BUILD/libonnxruntime-dev.deb" | sha256sum --check --quiet -
  dpkg-deb -x "$BUILD/libonnxruntime-dev.deb" "$BUILD/ort"
fi
cmake -S plugins -B "$BUILD/cmake" -DORT_INCLUDE_DIR="$PWD/$HEADERS" -DCMAKE_BUILD_TYPE=Release > /dev/null
cmake --build "$BUILD/cmake" > /dev/null
mkdir -p dflash_trt/_ops
cp "$BUILD/cmake/libdflash_ort_ops.so" dflash_trt/_ops/
echo "built dflash_trt/_ops/libdflash_ort_ops.so"

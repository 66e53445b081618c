#!/usr/bin/env bash
# Fetch the C/C++ API headers our native code compiles against, extracted under build/plugins/
# (nothing is installed); headers already there are kept. Usage: bash scripts/fetch_headers.sh ort|trt...
#   ort  ONNX Runtime 1.21 C/C++ API (MIT): Debian trixie's libonnxruntime-dev, fetched with apt-get from
#        the Debian archive this machine's apt sources name, through a private apt configuration.
#        Used by the core's onnxruntime executor (setup.py) and the onnxruntime op library.
#   trt  TensorRT 10.14 (Apache-2.0): vendored in the kernel-lens wheel on PyPI (pip download, no install).
#        Used by the TensorRT plugins (scripts/build_plugins.sh) and the core's TensorRT executor (setup.py).
# Both downloads are pinned by SHA-256.
set -euo pipefail
cd "$(dirname "$0")/.."

BUILD=build/plugins
ORT_PACKAGE=libonnxruntime-dev
ORT_VERSION=1.21.0+dfsg-1
ORT_SHA256=14f7d959d5deacbcf1504830d4189f91fc67382b399ed9ae9d3aa9c4050ced08
ORT_HEADERS="$BUILD/ort/usr/include/onnxruntime"
TRT_WHEEL=kernel_lens-2.0.1-py3-none-any.whl
TRT_SHA256=07cc714e8b5e7f34b672f7c7fad93febe7c747be5837ba276b1527370134ffe0
TRT_HEADERS="$BUILD/trt/kernel_lens/include/tensorrt"

# "URI KEYRING" of the first Debian archive in this machine's apt sources: an entry for this
# release's own suite (VERSION_CODENAME, so not -security or -updates). KEYRING may be empty.
debian_archive() {
  local codename found
  codename=$(. /etc/os-release && echo "${VERSION_CODENAME:-}")
  [ -n "$codename" ] || return 1
  found=$(
    for file in /etc/apt/sources.list.d/*.sources; do
      [ -f "$file" ] || continue
      # deb822: one paragraph per entry; Signed-By counts only when it is a keyring path.
      awk -v want="$codename" 'BEGIN { RS = ""; FS = "\n" }
        { types = uris = suites = key = ""; enabled = "yes"
          for (i = 1; i <= NF; i++) {
            field = $i; value = $i; sub(/^[^:]*:[ \t]*/, "", value)
            if (field ~ /^Types:/) types = value
            else if (field ~ /^URIs:/) uris = value
            else if (field ~ /^Suites:/) suites = value
            else if (field ~ /^Signed-By:[ \t]*\//) key = value
            else if (field ~ /^Enabled:/) enabled = value
          }
          if (enabled != "no" && (" " types " ") ~ / deb / && (" " suites " ") ~ (" " want " ")) {
            split(uris, first, " "); print first[1], key
          } }' "$file"
    done
    for file in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
      [ -f "$file" ] || continue
      # One-line format: deb [options] URI suite components...
      awk -v want="$codename" '$1 == "deb" {
          i = 2; key = ""
          if ($2 ~ /^\[/) {
            for (; i <= NF; i++) {
              if ($i ~ /signed-by=\//) { key = $i; sub(/.*signed-by=/, "", key); sub(/\]$/, "", key) }
              if ($i ~ /\]$/) { i++; break }
            }
          }
          if ($(i + 1) == want) print $i, key
        }' "$file"
    done
  )
  [ -n "$found" ] && echo "${found%%$'\n'*}"
}

fetch_ort_headers() {
  local archive uri key apt
  if ! archive=$(debian_archive); then
    echo "error: this machine's apt sources name no Debian archive for its release; cannot fetch $ORT_PACKAGE" >&2
    return 1
  fi
  read -r uri key <<<"$archive"
  # A private apt configuration: the machine's archive with suite trixie, its own lists and cache
  # under build/; the system's sources, lists and packages are left alone.
  apt="$PWD/$BUILD/apt"
  mkdir -p "$apt/lists/partial" "$apt/cache/archives/partial" "$apt/sources.list.d"
  echo "deb [signed-by=${key:-/usr/share/keyrings/debian-archive-keyring.gpg}] $uri trixie main" >"$apt/sources.list"
  local options=(-o "Dir::Etc::sourcelist=$apt/sources.list" -o "Dir::Etc::sourceparts=$apt/sources.list.d"
                 -o "Dir::State::Lists=$apt/lists" -o "Dir::Cache=$apt/cache" -o Acquire::Languages=none
                 -o "APT::Sandbox::User=$(id -un)" -o Debug::NoLocking=1)
  apt-get "${options[@]}" -qq update
  rm -f "$BUILD"/"$ORT_PACKAGE"_*.deb
  if ! (cd "$BUILD" && apt-get "${options[@]}" -qq download "$ORT_PACKAGE=$ORT_VERSION"); then
    echo "error: $ORT_PACKAGE $ORT_VERSION is not in trixie any more: update ORT_VERSION and ORT_SHA256 in $0" >&2
    return 1
  fi
  local deb=("$BUILD"/"$ORT_PACKAGE"_*.deb)
  # Chained: this runs in a condition, where set -e does not stop at a failed check.
  echo "$ORT_SHA256  ${deb[0]}" | sha256sum --check --quiet - && dpkg-deb -x "${deb[0]}" "$BUILD/ort"
}

fetch_trt_headers() {
  local python=python3
  [ -x .venv/bin/python ] && python=.venv/bin/python
  # Download only: installing kernel-lens would pull torch and triton, and we need its headers alone.
  # Called in a condition, where set -e does not apply: each step must succeed for the next.
  "$python" -m pip download --quiet --no-deps --only-binary=:all: "kernel-lens==2.0.1" -d "$BUILD/wheels" &&
    echo "$TRT_SHA256  $BUILD/wheels/$TRT_WHEEL" | sha256sum --check --quiet - &&
    "$python" -m zipfile -e "$BUILD/wheels/$TRT_WHEEL" "$BUILD/trt"
}

mkdir -p "$BUILD"
[ $# -gt 0 ] || { echo "usage: $0 ort|trt..." >&2; exit 2; }
for which in "$@"; do
  case "$which" in
    # Each fetch runs in a condition, where set -e does not apply: the functions chain their steps.
    ort) [ -f "$ORT_HEADERS/onnxruntime_c_api.h" ] || fetch_ort_headers || exit 1 ;;
    trt) [ -f "$TRT_HEADERS/NvInferRuntime.h" ] || fetch_trt_headers || exit 1 ;;
    *) echo "error: unknown headers '$which' (ort or trt)" >&2; exit 2 ;;
  esac
done

#!/usr/bin/env bash
# The GPU check: one command on a bare GPU machine (CUDA driver, nvcc, CMake, Python with PyTorch; no
# TensorRT, no network). It builds the plugin kernels and the C++ core for this GPU's SM, runs the
# kernels' parity with their CPU references and their bandwidth bench (and, where Nsight Compute is
# installed, a profile of one launch of each), `pytest -m gpu`, the target
# step-cost floor at Qwen3-8B widths, the decisions' own cost (scripts/decide_bench.py) and our executor's
# phases at those widths (scripts/executor_step_bench.py), then writes the record gpu-<device>.json (scripts/gpu_record.py)
# into OUT_DIR. A failed step is recorded and the next one still runs; the exit status is 1 if any
# step, parity case or gpu test failed. Steps start within GPU_CHECK_BUDGET_S seconds (default 430) of the
# start, most wanted first, so the record is written inside a call's limit; the rest are recorded as skipped.
#
#   bash scripts/gpu_check.sh --prepare           # first, where PyPI is reachable (after scripts/setup.sh)
#   bash scripts/gpu_check.sh OUT_DIR [COMMIT]    # then on the GPU machine, carrying build/plugins/ort,
#                                                 # build/plugins/trt and build/gpu-carry with the tree
#
# GPU_CHECK_PLUGINS_ONLY=1 runs the plugin kernels' steps alone (build, parity, bench, profile: about a
# minute), for iterating on a kernel; its record holds those figures only, so keep it beside the full one.
#
# --prepare extracts the headers (scripts/fetch_headers.sh) and downloads, for CPython 3.12 on x86-64,
# the pure-Python packages the test suite imports that the GPU machine's image lacks, at the versions
# .venv holds. COMMIT (default: git rev-parse HEAD, where .git exists) names the source in the record.
set -uo pipefail
cd "$(dirname "$0")/.."

CARRY=build/gpu-carry
# Imported when pytest collects the suite (the serving front, export's graph inspection) and absent from
# the GPU image, which has PyTorch, transformers, onnx, onnxruntime and pytest.
CARRIED_PACKAGES=(polygraphy fastapi starlette pydantic pydantic_core annotated-types typing-inspection opentelemetry-api
  sse-starlette httpx-sse)

if [ "${1:-}" = "--prepare" ]; then
  set -e
  bash scripts/fetch_headers.sh ort trt
  rm -rf "$CARRY" && mkdir -p "$CARRY/wheels"
  for package in "${CARRIED_PACKAGES[@]}"; do
    version=$(.venv/bin/python -c "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))" "$package")
    .venv/bin/python -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
      --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
      --platform manylinux2014_x86_64 -d "$CARRY/wheels" "$package==$version"
  done
  # The core's decision kernels for the H100/H200's SM 9.0, built here (nvcc takes ~40 s on them):
  # setup.py reuses them there when its nvcc and the sources give the same digest, else rebuilds.
  DFLASH_CUDA_SMS=90 DFLASH_KERNELS_ONLY=1 DFLASH_GENERATED="$CARRY/generated" .venv/bin/python setup.py
  du -sh build/plugins/ort/usr/include build/plugins/trt/kernel_lens/include "$CARRY"
  exit 0
fi

out=${1:?usage: $0 OUT_DIR [COMMIT]}
commit=${2:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}
# Steps start only within this many seconds of the check's start (each cut to what is left), so the
# record is still written inside the device call's limit; a step left out is recorded as skipped.
budget=${GPU_CHECK_BUDGET_S:-430}
started=$(date +%s)
SKIPPED=125  # a skipped step's status in steps.tsv (scripts/gpu_record.py reads it)
ORT_HEADERS=build/plugins/ort/usr/include/onnxruntime
TRT_HEADERS=build/plugins/trt/kernel_lens/include/tensorrt
work=build/gpu-check
python=${PYTHON:-python3}
for header in "$ORT_HEADERS/onnxruntime_cxx_api.h" "$TRT_HEADERS/NvInferRuntime.h"; do
  [ -f "$header" ] || { echo "error: $header missing: run 'bash scripts/gpu_check.sh --prepare' where PyPI is reachable, and carry build/plugins/ort and build/plugins/trt" >&2; exit 2; }
done
command -v nvidia-smi >/dev/null || { echo "error: no nvidia-smi: this is not a GPU machine" >&2; exit 2; }
nvcc=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
[ -x "$nvcc" ] || { echo "error: no nvcc on PATH or at /usr/local/cuda/bin" >&2; exit 2; }

rm -rf "$work" && mkdir -p "$work" "$out"
log="$out/check.log"
: >"$log"
nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv,noheader | head -n 1 >"$work/smi.csv"
name=$(cut -d, -f1 "$work/smi.csv")
arch=$(cut -d, -f4 "$work/smi.csv" | tr -d ' .')
# The kernel bench's floors: the card's peak HBM bandwidth and dense 16-bit tensor-core throughput
# (the datasheets' figures).
case "$name" in
  *H200*) peak_tbps=4.8 peak_tflops=989 ;;
  *H100*PCIe*) peak_tbps=2.0 peak_tflops=756 ;;
  *H100*) peak_tbps=3.35 peak_tflops=989 ;;
  *B200*) peak_tbps=8.0 peak_tflops=2250 ;;
  *) peak_tbps=3.35 peak_tflops=989
     echo "note: no datasheet figures for '$name': the floors assume an H100 SXM's" | tee -a "$log" ;;
esac
echo "$name, sm_$arch, peak $peak_tbps TB/s, commit $commit, $("$nvcc" --version | tail -n 2 | head -n 1)" | tee -a "$log"

# step NAME TIMEOUT COMMAND...: runs it with its output in the log, records exit status and seconds.
step() {
  local name=$1 limit=$2 began status left
  shift 2
  left=$((budget - ($(date +%s) - started)))
  if [ "$left" -le 0 ]; then
    echo "=== $name: skipped (past the check's $budget s budget)" | tee -a "$log"
    printf '%s\t%s\t0.0\n' "$name" "$SKIPPED" >>"$work/steps.tsv"
    return $SKIPPED
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  echo "=== $name: $*" | tee -a "$log"
  began=$(date +%s%N)
  timeout "$limit" "$@" >>"$log" 2>&1
  status=$?
  local tenths=$((($(date +%s%N) - began) / 100000000))
  printf '%s\t%s\t%d.%d\n' "$name" "$status" $((tenths / 10)) $((tenths % 10)) >>"$work/steps.tsv"
  echo "=== $name: exit $status" | tee -a "$log"
  return $status
}

# the scripts import dflash_trt from the tree (pytest finds it from its rootdir)
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
if compgen -G "$CARRY/wheels/*.whl" >/dev/null; then
  step carried_wheels 120 "$python" -m pip install --quiet --no-index --no-deps --no-compile --upgrade \
    --target "$work/site" "$CARRY"/wheels/*.whl
  export PYTHONPATH="$PWD/$work/site${PYTHONPATH:+:$PYTHONPATH}"
else
  echo "note: no $CARRY/wheels (scripts/gpu_check.sh --prepare): test modules importing them will not collect" | tee -a "$log"
fi

plugins_built=1
# Built where scripts/build_plugins.sh builds (tests/plugins looks there), for this GPU alone.
plugins=build/plugins/cmake
rm -rf "$plugins"
step build_plugins 300 bash -c "cmake -S plugins -B $plugins -DCMAKE_BUILD_TYPE=Release \
    -DORT_INCLUDE_DIR=$PWD/$ORT_HEADERS -DTRT_INCLUDE_DIR=$PWD/$TRT_HEADERS -DCMAKE_CUDA_COMPILER=$nvcc \
    -DCMAKE_CUDA_ARCHITECTURES=$arch && cmake --build $plugins -j $(nproc)" || plugins_built=0
if [ $plugins_built = 1 ]; then
  mkdir -p dflash_trt/_ops
  cp "$plugins/libdflash_trt_plugins.so" "$plugins/libdflash_ort_ops.so" dflash_trt/_ops/
  step kernel_parity 120 bash -c "set -o pipefail; $plugins/kernel_parity | tee $work/kernel_parity.log"
  step ctest 120 ctest --test-dir "$plugins" --label-exclude gpu --output-on-failure
  step kernel_bench 120 "$plugins/kernel_bench" --json "$work/kernel_bench.json" --peak-tbps "$peak_tbps"
fi
if [ "${GPU_CHECK_PLUGINS_ONLY:-0}" = 1 ]; then
  echo "GPU_CHECK_PLUGINS_ONLY=1: the plugin kernels' steps only" | tee -a "$log"
else
  if compgen -G "$CARRY/generated/*.fatbin" >/dev/null; then
    mkdir -p build/generated && cp "$CARRY"/generated/*.fatbin* build/generated/
  fi
  step build_core 300 env DFLASH_CUDA_SMS="$arch" "$python" setup.py -q build_ext --inplace -j "$(nproc)"
  step pytest_gpu 300 "$python" -m pytest -m gpu tests -q -p no:cacheprovider --continue-on-collection-errors \
    --junitxml "$work/pytest.xml"
  # Most wanted first: a step past the budget is skipped.
  # the default path (our kernels where the plugin library is built): the projected speedup's step costs
  step executor_bench 240 "$python" scripts/executor_step_bench.py --profile --trace "$out/traces" \
    --json "$work/executor_bench.json"
  # where a 1-row verify's GPU waits on the host (the profiled timelines above; target: 5 % of the verify)
  for trace in "$out"/traces/*.json.gz; do
    step trace_gaps 30 "$python" scripts/trace_gaps.py "$trace" --top 8
  done
  # the same phases in standard ops alone (PyTorch's attention, the standard draft graphs): what the kernels save
  step executor_bench_standard 120 "$python" scripts/executor_step_bench.py --kernels off --rows 1,8 --blocks 1,4,16 \
    --repeat 5 --json "$work/executor_bench_standard.json"
  # a server's default slot (4,096 tokens, runtime/engine.py) under the same 1,024 cached: a captured run's
  # attention over the whole slot (PyTorch's), then through our BlockAttention kernel (each row's length)
  step executor_bench_capacity 120 "$python" scripts/executor_step_bench.py --kernels off --rows 1,32 \
    --blocks 1,16 --repeat 5 --capacity 4096 --json "$work/executor_bench_capacity.json"
  step executor_bench_capacity_kernels 120 "$python" scripts/executor_step_bench.py --rows 1,32 \
    --blocks 1,16 --repeat 5 --capacity 4096 --json "$work/executor_bench_capacity_kernels.json"
  step decide_bench 120 "$python" scripts/decide_bench.py --rows 1,2,8,32 --wide-pairs 0,16 --json "$work/decide_bench.json"
  # 32 rows of 16 are 512 blocks: the core runs them at 256 threads, two an SM; at 512, one an SM
  step decide_bench_512 60 "$python" scripts/decide_bench.py --rows 32 --threads 512 --json "$work/decide_bench_512.json"
  # the host's share of a step at Qwen3-8B's depth: a verify whose replayed graph does nothing (target: 5 %)
  step host_step_bench 60 "$python" scripts/host_step_bench.py --device cuda --layers 1,36 --rows 1,8 \
    --json "$work/host_step_bench.json"
  step step_bench 240 "$python" scripts/gpu_step_bench.py --json "$work/step_bench.json"
  step executor_bench_moe_kernels 180 "$python" scripts/executor_step_bench.py --preset qwen3.5-35b-a3b \
    --rows 1,8 --blocks 1,16 --chunk 256 --cached 512 --repeat 5 --json "$work/executor_bench_moe_kernels.json"
  step executor_bench_moe 180 "$python" scripts/executor_step_bench.py --preset qwen3.5-35b-a3b --kernels off \
    --rows 1,8 --blocks 1,16 --chunk 256 --cached 512 --repeat 5 --json "$work/executor_bench_moe.json"
  step executor_bench_drafter 120 "$python" scripts/executor_step_bench.py --draft-rule drafter --rows 1,8 \
    --blocks 16 --repeat 5 --json "$work/executor_bench_drafter.json"
  step executor_bench_eager 120 "$python" scripts/executor_step_bench.py --eager --rows 1,8 \
    --json "$work/executor_bench_eager.json"
fi
# Where each kernel's time goes (Nsight Compute: one launch of each kernel at each bench shape): last, as
# what the budget leaves room for.
ncu=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null)
if [ $plugins_built = 1 ] && [ -n "$ncu" ]; then
  step kernel_profile 300 bash -c "$ncu --csv --page details --section SpeedOfLight --section Occupancy \
    --section LaunchStats --section WarpStateStats --section MemoryWorkloadAnalysis $plugins/kernel_bench --once \
    >$work/kernel_profile.csv"
elif [ -z "$ncu" ]; then
  echo "note: no ncu (Nsight Compute): no kernel profile" | tee -a "$log"
fi

"$python" scripts/gpu_record.py "$work" --commit "$commit" -o "$out" --peak-tflops "$peak_tflops" 2>&1 |
  tee -a "$log"

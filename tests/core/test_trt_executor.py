"""The C++ TensorRT executor (csrc/trt_api.cpp, trt_executor.cpp) on a CPU, through fakes of the two
libraries it loads at run time: a fake CUDA driver whose "device" memory is host memory and whose stream
runs its work at the next synchronisation (fake_trt/fake_cuda.cpp) and a fake libnvinfer, built against the real TensorRT 10 headers, whose
"engines" run their ONNX graph with onnxruntime over the addresses the executor bound
(fake_trt/fake_nvinfer.cpp). Everything of the executor's own is real: device buffers, uploads and
downloads, shapes and addresses per run, scratch for unbound outputs, in-place slot caches.

Greedy output equals each request's autoregressive output and the onnxruntime executor's, alone and
batched, float32 and float16, attention-only and hybrid targets; every buffer is freed with the
executor; a missing driver and a wrongly typed engine are refused in one line. What no fake can show
(TensorRT's own kernels, speed on a GPU) needs a GPU and real TensorRT."""

import ctypes
import ctypes.util
import gc
import json
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from factories import make_dflash2_drafter, make_drafter, make_target
from no_recent import NoRecent
from scheduler_checks import decode_on, decode_preempted, python_loop, set_up_per_step

from dflash_trt.engines.profiles import input_ranges, profile_dims
from dflash_trt.errors import DFlashError
from dflash_trt.export.bundle import export_bundle
from dflash_trt.models.checkpoints import load_drafter, load_target

ROOT = Path(__file__).resolve().parents[2]
FAKES = Path(__file__).resolve().parent / "fake_trt"
CUDA = Path(os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or "/usr/local/cuda")  # as setup.py
HEADERS = [ROOT / "csrc", ROOT / "build/plugins/ort/usr/include/onnxruntime",
           ROOT / "build/plugins/trt/kernel_lens/include/tensorrt", CUDA / "include"]
PROMPTS = [[1, 2, 3], [4, 0, 2, 2, 1, 3, 0], [2], [3, 3, 1, 0, 4]]


@pytest.fixture(scope="module")
def ort(core):
    if not (core.HAS_ORT_EXECUTOR and core.HAS_TRT_EXECUTOR):
        pytest.skip("dflash_trt._core was built without its onnxruntime or TensorRT executor (csrc/README.md, Build)")
    from dflash_trt.runtime import ort_executor

    return ort_executor


@pytest.fixture(scope="module")
def fakes(ort, fake_cuda, tmp_path_factory):
    """(fake libnvinfer.so, fake libcuda.so), compiled here (about 10 s)."""
    if shutil.which("g++") is None or not all(h.is_dir() for h in HEADERS):
        pytest.skip("building the fake TensorRT needs g++ and the onnxruntime, TensorRT and CUDA headers")
    nvinfer = tmp_path_factory.mktemp("fake-trt") / "libfake_nvinfer.so"
    flags = ["g++", "-std=c++17", "-O1", "-shared", "-fPIC", "-fvisibility=hidden", "-Wno-deprecated-declarations",
             *(f"-I{h}" for h in HEADERS)]
    # the slot executor decides tokens itself (csrc/executor.h), so the acceptance rules come along
    sources = [FAKES / "fake_nvinfer.cpp", *(ROOT / "csrc" / f for f in ("ort_executor.cpp", "ort_api.cpp",
                                                                         "slot_executor.cpp", "acceptance.cpp",
                                                                         "sampling.cpp", "penalties.cpp"))]
    subprocess.run([*flags, *map(str, sources), "-ldl", "-o", str(nvinfer)], check=True)
    return nvinfer, fake_cuda  # its kernel launch runs the decision rules' source (csrc/decide.h) for the host


def engine_text(onnx: Path, library: str, spec: dict, boxes, retype: dict | None = None) -> str:
    """A fake engine (fake_trt/fake_nvinfer.cpp's format): the graph, its I/O from bundle.json's `spec`
    (`retype` {tensor: dtype} misdeclares some, as an engine built from another export would) and one
    profile per box of `boxes` (phase dims, as profile_dims gives them)."""
    lines = [f"onnx {Path(onnx).resolve()}", f"onnxruntime {library}"]
    for mode in ("inputs", "outputs"):
        for t in spec[mode]:
            dtype = (retype or {}).get(t["name"], t["dtype"])
            lines.append(" ".join(["tensor", t["name"], mode[:-1], dtype, *map(str, t["shape"])]))
    for index, dims in enumerate(boxes):
        for tensor, (low, _, high) in input_ranges(spec, dims).items():
            lines.append(" ".join(["profile", str(index), tensor, "min", *map(str, low), "max", *map(str, high)]))
    return "\n".join(lines) + "\n"


def fake_engines(bundle: Path, out: Path, library: str, retype: dict | None = None, max_batch: int = 3) -> dict:
    """One fake engine per graph of `bundle`, with the profiles `build` would give it -> graph -> path."""
    out.mkdir(parents=True, exist_ok=True)
    manifest = json.loads((bundle / "bundle.json").read_text())
    paths = {}
    for name, spec in manifest["graphs"].items():
        boxes = profile_dims(name, max_batch, manifest["capacity"], manifest["draft"]["block_size"], 2,
                             manifest["capacity"])
        # narrowest first (build writes prefill first): a prefill longer than a block needs profile 1
        paths[name] = out / f"{name}.engine"
        paths[name].write_text(engine_text(bundle / spec["file"], library, spec, reversed(boxes.values()), retype))
    return paths


def trt_config(ort, fakes, bundle, engines, max_batch=3, capacity=64):
    config = ort.executor_config(bundle, max_batch=max_batch, capacity=capacity)
    config.target_path, config.draft_context_path, config.draft_block_path = (
        str(engines[g]) for g in ("target", "draft_context", "draft_block"))
    config.library_path, config.driver_path = map(str, fakes)
    return config


@pytest.fixture(scope="module", params=[("qwen3", "float32"), ("qwen3", "float16"), ("qwen3_5_text", "float32")],
                ids=lambda p: "-".join(p))
def pair(ort, fakes, request, tmp_path_factory):
    """(slots bundle, fake engines, TargetModel, DFlashDrafter) over 6 tokens (MASK is 5), so greedy
    drafts are often accepted and commits keep every length."""
    family, dtype = request.param
    root = tmp_path_factory.mktemp(f"{family}-{dtype}")
    target_dir = make_target(root / "target", family, seed=5, tokenizer=False, vocab_size=6)
    draft_dir = make_drafter(root / "draft", seed=5, block_size=4, target_layer_ids=[1, 2], mask_token_id=5)
    target, drafter = load_target(str(target_dir))[0], load_drafter(draft_dir)
    # slots-trt: what TensorRT engines are built from (static capacity); onnxruntime runs it too
    bundle = export_bundle(target, drafter, None, root / "bundle", flavour="slots-trt", capacity=64, dtype=dtype,
                           check=False)
    engines = fake_engines(bundle, root / "engines", ort.onnxruntime_library())
    return bundle, engines, target, drafter, dtype


@pytest.mark.parametrize("block", [1, 4])
def test_greedy_on_the_tensorrt_executor_equals_autoregressive_and_the_onnxruntime_executor(core, ort, fakes, pair,
                                                                                           block):
    bundle, engines, target, drafter, dtype = pair
    ours = decode_on(core, core.TrtExecutor(trt_config(ort, fakes, bundle, engines)), PROMPTS[:3], block)
    theirs = decode_on(core, ort.ort_executor(bundle, max_batch=3, capacity=64), PROMPTS[:3], block)
    assert ours == theirs  # tokens and accepted drafts per step
    if dtype == "float32":  # float16 graphs are their own reference: the onnxruntime executor's
        for prompt, tokens, accepted in zip(PROMPTS, *ours, strict=False):
            ref_tokens, ref_accepted = python_loop(target, drafter, prompt, 12, block)
            assert tokens == ref_tokens and accepted == ref_accepted[: len(accepted)]
    if block > 1:
        steps = [a for row in ours[1] for a in row]
        assert max(steps) >= 1 and min(steps) == 0  # accepted and rejected drafts: commit kept every kind


def adjusted_on_both_executors(core, ort, fakes, pair, constrained: bool, **params):
    """Three prompts' tokens on the TensorRT executor (its device path: the fake driver's dflash_penalize
    runs penalties.h's code before the decision kernels) and on the onnxruntime executor (the host
    path); `constrained`: the second and third requests follow tests/no_recent.py's constraint."""
    bundle, engines, *_ = pair
    launches = fake_counter(fakes, "fake_cuda_penalty_launches")
    before = launches()

    def run(executor):
        sched = core.Scheduler(executor, core.SchedulerConfig(max_batch=3, capacity=64, block_size=4, engine_seed=0))
        ids = [sched.add_request(p, core.RequestParams(max_tokens=12, ignore_eos=True, **params,
                                                       constraint=NoRecent(6, p) if constrained and i else None))
               for i, p in enumerate(PROMPTS[:3])]
        tokens = {i: [] for i in ids}
        while sched.has_work:
            for out in sched.step():
                tokens[out["request"]] += out["new_tokens"]
        return [tokens[i] for i in ids]

    device = run(core.TrtExecutor(trt_config(ort, fakes, bundle, engines)))
    host = run(ort.ort_executor(bundle, max_batch=3, capacity=64))
    assert (launches() > before) == core.HAS_DEVICE_DECIDE
    gc.collect()  # the executors go now: a later test counts the driver's live buffers
    return device, host


@pytest.mark.parametrize("params", [dict(presence_penalty=1.5, repetition_penalty=1.3, logit_bias=[(2, 1.5)]),
                                    dict(frequency_penalty=0.6, min_tokens=8, stop_token_ids=[1]),
                                    dict(temperature=0.9, seed=4, min_p=0.2, presence_penalty=0.5)],
                         ids=["penalties", "min_tokens", "min_p"])
def test_penalties_on_the_tensorrt_executor_run_on_the_device_and_give_the_onnxruntime_executors_tokens(
        core, ort, fakes, pair, params):
    """Penalties, logit_bias, min_tokens (greedy) and min_p (seeded T>0) through the device path give the
    tokens the onnxruntime executor's host path gives."""
    device, host = adjusted_on_both_executors(core, ort, fakes, pair, False, **params)
    assert device == host


@pytest.mark.parametrize("params", [dict(), dict(temperature=0.9, seed=4, top_p=0.9)], ids=["greedy", "sampled"])
def test_constrained_requests_on_the_tensorrt_executor_are_masked_on_the_device_as_on_the_host(core, ort, fakes,
                                                                                              pair, params):
    """Output constraints through the device path (dflash_penalize masks each verify position) give the
    tokens the onnxruntime executor's host path gives, beside a free request."""
    device, host = adjusted_on_both_executors(core, ort, fakes, pair, True, **params)
    assert device == host
    assert all(t not in reply[i - 2:i] for reply in device[1:] for i, t in enumerate(reply) if i >= 2)


@pytest.mark.parametrize("family", ["qwen3", "qwen3_5_text"])
def test_a_dflash2_drafter_on_the_tensorrt_executor_drafts_and_decodes_as_the_python_loop(core, ort, fakes, family,
                                                                                         tmp_path):
    """The slots-trt draft_block of a DFlash2 drafter (convolutions, the selector walk unrolled over its
    block) on the TensorRT executor: the Python reference loop's tokens and acceptance, at B=3 and 4."""
    target_dir = make_target(tmp_path / "target", family, seed=5, tokenizer=False, vocab_size=6)
    draft_dir = make_dflash2_drafter(tmp_path / "draft", seed=5, vocab_size=6, block_size=4, target_layer_ids=[1, 2],
                                     mask_token_id=5)
    target, drafter = load_target(str(target_dir))[0], load_drafter(draft_dir)
    assert drafter.config.method == "dflash2"
    bundle = export_bundle(target, drafter, None, tmp_path / "bundle", flavour="slots-trt", capacity=64, check=False)
    engines = fake_engines(bundle, tmp_path / "engines", ort.onnxruntime_library())
    for block in (3, 4):
        ours = decode_on(core, core.TrtExecutor(trt_config(ort, fakes, bundle, engines)), PROMPTS[:3], block)
        for prompt, tokens, accepted in zip(PROMPTS, *ours, strict=False):
            ref_tokens, ref_accepted = python_loop(target, drafter, prompt, 12, block)
            assert tokens == ref_tokens and accepted == ref_accepted[: len(accepted)]


def test_prompt_logprobs_on_the_tensorrt_executor_are_scored_on_the_device_as_on_the_host(core, ort, fakes, pair):
    """A prefill whose row asks for prompt logprobs has every position's logits scored on the device by the
    decided-logprobs kernel (chunked: each chunk's last position by the next chunk's first token) and
    decides from the last: the onnxruntime executor's tokens and entries, beside rows that do not ask."""
    bundle, engines, *_ = pair

    def run(executor):
        sched = core.Scheduler(executor, core.SchedulerConfig(max_batch=3, capacity=64, block_size=4, engine_seed=0,
                                                              prefill_chunk=2))
        ids = [sched.add_request(p, core.RequestParams(max_tokens=6, ignore_eos=True, repetition_penalty=1.5,
                                                       prompt_logprobs=2 if i == 1 else -1))
               for i, p in enumerate(PROMPTS[:3])]
        tokens, scored = {i: [] for i in ids}, {}
        while sched.has_work:
            for out in sched.step():
                tokens[out["request"]] += out["new_tokens"]
                if "prompt_logprobs" in out:
                    scored[out["request"]] = out["prompt_logprobs"]
        return [tokens[i] for i in ids], [scored.get(i) for i in ids]

    launches = fake_counter(fakes, "fake_cuda_logprobs_launches")
    before = launches()
    device, device_scored = run(core.TrtExecutor(trt_config(ort, fakes, bundle, engines)))
    # scored by the decided-logprobs kernel where the logits are (no other row asks for logprobs)
    assert (launches() > before) == core.HAS_DEVICE_DECIDE
    host, host_scored = run(ort.ort_executor(bundle, max_batch=3, capacity=64))
    assert device == host
    assert device_scored[0] is None and device_scored[2] is None and len(device_scored[1]) == len(PROMPTS[1]) - 1
    for mine, theirs in zip(device_scored[1], host_scored[1], strict=True):
        assert [t for t, _ in mine] == [t for t, _ in theirs]
        assert np.allclose([lp for _, lp in mine], [lp for _, lp in theirs], atol=1e-5)
    gc.collect()


def test_chunked_prefill_on_the_tensorrt_executor_equals_whole_prompts(core, ort, fakes, pair):
    """Chunks of 2 extend a held row (the prefill profile with rows 1, after cached tokens)."""
    bundle, engines, *_ = pair
    prompts = [PROMPTS[1], PROMPTS[3], PROMPTS[0]]
    chunked = decode_on(core, core.TrtExecutor(trt_config(ort, fakes, bundle, engines)), prompts, 4, prefill_chunk=2)
    assert chunked == decode_on(core, ort.ort_executor(bundle, max_batch=3, capacity=64), prompts, 4)


def test_a_request_preempted_on_the_tensorrt_executor_resumes_as_on_the_onnxruntime_executor(core, ort, fakes, pair):
    """Preemption (priority scheduling) releases a device row mid-decode and prefills its prompt and
    committed tokens again into the slot later: the tokens of both requests are each one's alone."""
    bundle, engines, *_ = pair
    ours = decode_preempted(core, core.TrtExecutor(trt_config(ort, fakes, bundle, engines)), PROMPTS[0], PROMPTS[1], 4)
    theirs = decode_preempted(core, ort.ort_executor(bundle, max_batch=3, capacity=64), PROMPTS[0], PROMPTS[1], 4)
    alone = decode_on(core, ort.ort_executor(bundle, max_batch=3, capacity=64), PROMPTS[:2], 4)[0]
    assert ours == theirs == (alone[0], alone[1], 1)


def test_phase_logits_and_drafts_equal_the_onnxruntime_executor_s(core, ort, fakes, pair):
    bundle, engines, *_ = pair
    ours = core.TrtExecutor(trt_config(ort, fakes, bundle, engines))
    theirs = ort.ort_executor(bundle, max_batch=3, capacity=64)
    for executor in (ours, theirs):
        executor.prefill_logits([0, 2], [PROMPTS[1], PROMPTS[0]])
    for a, b in zip(ours.prefill_logits([1], [PROMPTS[3]]), theirs.prefill_logits([1], [PROMPTS[3]]), strict=True):
        np.testing.assert_array_equal(a, b)
    blocks = [[1, 4, 0, 2], [3, 3]]
    for a, b in zip(ours.verify_logits([0, 2], blocks), theirs.verify_logits([0, 2], blocks), strict=True):
        np.testing.assert_array_equal(a, b)
    for executor in (ours, theirs):
        executor.commit([0, 2], [3, 1])
    assert ours.draft([0, 1, 2], [1, 2, 3], 4) == theirs.draft([0, 1, 2], [1, 2, 3], 4)
    assert [ours.committed(r) for r in range(3)] == [theirs.committed(r) for r in range(3)]


def test_steps_may_run_on_another_thread_than_the_one_that_made_the_executor(core, ort, fakes, pair):
    """A server steps the core on its own thread: the executor makes its CUDA context current there
    (the fake driver, like the real one, refuses memory calls on a thread without one)."""
    import threading

    bundle, engines, *_ = pair
    executor = core.TrtExecutor(trt_config(ort, fakes, bundle, engines))
    result = {}
    worker = threading.Thread(target=lambda: result.update(out=decode_on(core, executor, PROMPTS[:2], 4)))
    worker.start()
    worker.join()
    assert result["out"] == decode_on(core, ort.ort_executor(bundle, max_batch=3, capacity=64), PROMPTS[:2], 4)


def fake_counter(fakes, name: str):
    counter = getattr(ctypes.CDLL(str(fakes[1])), name)
    counter.restype = ctypes.c_long
    return counter


def test_the_executor_frees_every_device_buffer_and_copies_through_page_locked_memory(core, ort, fakes, pair):
    """Every buffer it made (device and pinned host) is freed with it; every array that crosses the
    host boundary is in cuMemHostAlloc memory (a copy from pageable memory would be staged by the
    driver and block the host; the fake driver counts those)."""
    bundle, engines, *_ = pair
    live, unpinned = fake_counter(fakes, "fake_cuda_live"), fake_counter(fakes, "fake_cuda_unpinned_copies")
    before, copies_before = live(), unpinned()
    executor = core.TrtExecutor(trt_config(ort, fakes, bundle, engines))
    decode_on(core, executor, PROMPTS[:2], 4)
    assert live() > before
    assert executor.host_bytes > 0 and unpinned() == copies_before
    del executor
    gc.collect()
    assert live() == before


def test_decode_sized_runs_replay_cuda_graphs_captured_around_enqueue_with_the_eager_tokens(
        core, ort, fakes, tiny_pairs, tmp_path, monkeypatch):
    """Each run of at most 16 new tokens per row (a plain step, a verify, a draft; not a prefill chunk) is
    captured as a CUDA graph around enqueueV3 the second time its bindings (shapes, addresses) recur, then
    replayed: greedy and seeded rows, in one batch and joining as others end (rows and slots change from
    step to step), give the tokens of eager runs (enforce_eager), where the fake driver replayed none.
    The fake records the engine's run with its bindings at capture and reruns it on their memory at each
    launch, as a GPU replays kernels; that every graph is freed with the executor is the test above's."""
    from seeded_batches import mixed_batch

    from dflash_trt import LLM

    target, drafter = load_target(str(tiny_pairs["llama"][0]))[0], load_drafter(tiny_pairs["llama"][1])
    bundle = export_bundle(target, drafter, None, tmp_path / "bundle", flavour="slots-trt", capacity=64, check=False)
    engines = tensorrt_engines(bundle, tmp_path / "engines", ort, fakes, monkeypatch)
    launches = fake_counter(fakes, "fake_cuda_graph_launches")
    before = launches()
    eager = [mixed_batch(LLM.from_bundle(engines, block_size=4, enforce_eager=True), max_batch=rows, capacity=64)
             for rows in (3, 2)]
    assert launches() == before
    graphed = [mixed_batch(LLM.from_bundle(engines, block_size=4), max_batch=rows, capacity=64) for rows in (3, 2)]
    assert launches() > before
    assert graphed == eager


@pytest.mark.parametrize("graphs", [True, False], ids=["cuda-graphs", "eager"])
def test_the_runs_that_pay_set_up_are_a_bindings_first_enqueue_and_its_capture(core, ort, fakes, pair, graphs):
    """executor.set_up_runs, what the scheduler leaves out of its cost model: a decode-sized binding's
    first (eager) run, then its capture; the replays after them, and eager runs of a binding seen
    before, pay none."""
    bundle, engines, *_ = pair
    config = trt_config(ort, fakes, bundle, engines)
    config.cuda_graphs = graphs
    executor = core.TrtExecutor(config)
    executor.prefill_logits([0, 2], [PROMPTS[1], PROMPTS[0]])
    # every graph's first run (draft block, target, draft context), then (graphed) their captures
    assert set_up_per_step(executor, [0, 2], [1, 2], 4) == ([3, 3, 0, 0] if graphs else [3, 0, 0, 0])


def test_shapes_outside_every_optimization_profile_are_refused_in_one_line(core, ort, fakes, pair, tmp_path):
    bundle, *_ = pair
    engines = fake_engines(bundle, tmp_path, ort.onnxruntime_library(), max_batch=2)  # engines for 2 rows
    executor = core.TrtExecutor(trt_config(ort, fakes, bundle, engines, max_batch=3))
    executor.prefill_logits([0, 1], [PROMPTS[0], PROMPTS[1]])
    with pytest.raises(DFlashError, match=r"are outside every optimization profile of .*target.engine: rebuild with a "
                                          r"larger --max-batch") as err:
        executor.prefill_logits([0, 1, 2], [[1], [2], PROMPTS[3]])  # places 0..2: a batch of 3
    assert "\n" not in str(err.value)


def test_without_a_cuda_driver_the_executor_says_so_in_one_line(core, ort, fakes, pair):
    if ctypes.util.find_library("cuda"):
        pytest.skip("this machine has a CUDA driver")
    bundle, engines, *_ = pair
    config = trt_config(ort, fakes, bundle, engines)
    config.driver_path = "libcuda.so.1"
    with pytest.raises(DFlashError, match=r"needs an NVIDIA GPU and its driver: cannot load libcuda.so.1") as err:
        core.TrtExecutor(config)
    assert "\n" not in str(err.value)


def test_an_engine_typed_unlike_the_bundle_is_refused_in_one_line(core, ort, fakes, pair, tmp_path):
    bundle, _, _, _, dtype = pair
    other = "float16" if dtype == "float32" else "float32"
    engines = fake_engines(bundle, tmp_path, ort.onnxruntime_library(), retype={"features": other})
    executor = core.TrtExecutor(trt_config(ort, fakes, bundle, engines))
    with pytest.raises(DFlashError, match="features has another element type than the bundle's dtype says"):
        executor.prefill_logits([0], [PROMPTS[0]])


def fake_build(library: str):
    """Stands in for engines.trt_engine.build_trt_graph: writes a fake engine of the graph with the
    profiles `build` chose."""
    def build(kind, source, out, spec, profiles, compute_capabilities, plugin_library=None):
        Path(out).write_text(engine_text(source, library, spec, profiles.values()))
        return {"file": Path(out).name, "build_s": 0.0, "bytes": Path(out).stat().st_size}

    return build


def fake_tensorrt(ort, fakes, monkeypatch) -> None:
    """From here on, as on an SM 9.0 GPU with TensorRT: engines are built by the fake builder and opened on
    the fake libnvinfer and CUDA driver."""
    import types

    from dflash_trt.engines import machine, trt_engine

    fake = types.ModuleType("tensorrt")  # the builder is faked below; build_engines reads the version
    fake.__version__ = "10.99.0-fake"  # 10.x, as the headers
    monkeypatch.setitem(__import__("sys").modules, "tensorrt", fake)
    monkeypatch.setattr(machine, "gpu_compute_capability", lambda: "9.0")
    monkeypatch.setattr(trt_engine, "build_trt_graph", fake_build(str(ort.onnxruntime_library())))
    monkeypatch.setattr(ort.SlotBundle, "cuda_driver", str(fakes[1]))
    monkeypatch.setattr(ort, "tensorrt_library", lambda major: str(fakes[0]))


def tensorrt_engines(bundle: Path, out: Path, ort, fakes, monkeypatch) -> Path:
    """`build --engine tensorrt` of `bundle` (3 rows, 64 tokens) with the fake builder, opened from then
    on by LLM on the fake libnvinfer and CUDA driver -> the engine bundle."""
    from dflash_trt.engines import build as build_module
    from dflash_trt.engines.config import BuildConfig

    fake_tensorrt(ort, fakes, monkeypatch)
    build_module.build_engines(bundle, out, BuildConfig(engine="tensorrt", max_batch=3, max_seq_len=64))
    return out


def test_dflash_trt_build_then_llm_from_bundle_runs_on_the_tensorrt_executor(ort, fakes, pair, tmp_path, monkeypatch):
    """`build --engine tensorrt` of a slots-trt bundle, then `LLM.from_bundle` on it: the engine bundle
    is checked (library, GPU), opened by SlotBundle for the C++ TensorRT executor, and generates what
    the onnxruntime executor generates from the exported bundle."""
    from dflash_trt import LLM, SamplingParams

    bundle, *_ = pair
    tensorrt_engines(bundle, tmp_path / "engines", ort, fakes, monkeypatch)
    with pytest.raises(DFlashError, match="its engines take at most 3 rows per step; run it with max_batch <= 3"):
        LLM.from_bundle(tmp_path / "engines", max_batch=4)
    with pytest.raises(DFlashError, match="its engines prefill at most 64 tokens per step"):
        LLM.from_bundle(tmp_path / "engines", prefill_chunk=65)
    ours = LLM.from_bundle(tmp_path / "engines", block_size=4)
    theirs = LLM.from_bundle(bundle, block_size=4, max_batch=3)
    # the engines' own limits: C from the export, rows and prefill chunk from the profiles
    assert (ours.backend, theirs.backend) == ("tensorrt", "onnxruntime")
    assert (ours.capacity, ours.max_batch, ours.prefill_chunk) == (64, 3, 64)
    params = SamplingParams(max_tokens=10, ignore_eos=True)
    got, want = ours.generate(PROMPTS, params), theirs.generate(PROMPTS, params)
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
    assert [o.token_ids for o in got] == [o.token_ids for o in ours.generate(PROMPTS, params, speculative=False)]
    # logprobs come from the device decision's buffer (the fake driver runs the kernel's rules on the host)
    params = SamplingParams(max_tokens=10, ignore_eos=True, logprobs=2, temperature=0.8, seed=4)
    got, want = ours.generate(PROMPTS, params), theirs.generate(PROMPTS, params)
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
    for g, w in zip(got, want, strict=True):
        assert [list(e) for e in g.logprobs] == [list(e) for e in w.logprobs]
        assert np.allclose([v for e in g.logprobs for v in e.values()], [v for e in w.logprobs for v in e.values()],
                           atol=1e-5)


def test_each_executor_counts_the_bytes_it_moves_across_the_host_boundary(core, ort, fakes, pair):
    """Its own accounting (what `bench` reports per step): none on onnxruntime's CPU provider, whose
    graphs read the staging arrays in place; on the TensorRT executor the tokens are decided where the
    logits are (the decision kernel's launch; the fake driver runs the kernel's rules compiled for the
    host) and the tapped features stay there for the drafter: ids, lengths, positions and verdicts only."""
    bundle, engines, *_ = pair
    trt = core.TrtExecutor(trt_config(ort, fakes, bundle, engines))
    cpu = ort.ort_executor(bundle, max_batch=3, capacity=64)
    before = trt.host_bytes
    assert decode_on(core, trt, PROMPTS[:2], 4, max_tokens=6) == decode_on(core, cpu, PROMPTS[:2], 4, max_tokens=6)
    assert cpu.host_bytes == 0 and trt.host_bytes > before

    # One verify of 2 rows x 4 tokens, byte for byte: the target's inputs and the drafter's positions
    # up, then the decision's rows and drafts up and verdicts down. Downloading the logits would add
    # 2*4*V*4 bytes, the tapped features 2*4*F*element (they stay on the device for the drafter).
    trt.prefill([0, 1], [PROMPTS[0], PROMPTS[1]], [core.RowSampling(), core.RowSampling()])
    blocks = [[1, *trt.draft([0, 1], [1, 2], 4)[0]], [2, *trt.draft([0, 1], [1, 2], 4)[1]]]
    before = trt.host_bytes
    trt.verify([0, 1], blocks, [core.RowSampling(), core.RowSampling()])
    n, s = 2, 4
    target = 8 * (n * s + n + n + n * s + n * s)  # ids, lengths, logits_index; the drafter's positions
    decision = n * 120 + (1 + n * (s - 1)) * 8 + n * 16  # DecideRow (15 words), drafts (+1 pad), Verdict (2 words)
    assert trt.host_bytes - before == target + decision



@pytest.mark.parametrize("kind", ["draft-vocabulary", "dflash2"])
def test_the_drafter_rule_on_tensorrt_engines_gives_the_onnxruntime_executors_seeded_tokens(
        core, ort, fakes, tiny_pairs, tmp_path, monkeypatch, kind):
    """A slots-trt bundle exported with --draft-distribution, built into (fake) TensorRT engines: the
    drafter rule runs on the TensorRT executor's device path (drafts drawn and verified by the decision
    kernels' rules where the block pass wrote its outputs) and gives the seeded tokens the onnxruntime
    executor's host path gives over the same graphs, greedy rows beside sampled ones, in one batch and
    as rows join; without --draft-distribution (slots-trt's default) the rule is refused in one line."""
    from seeded_batches import PARAMS, PROMPTS, counted, mixed_batch

    from dflash_trt import LLM

    if kind == "dflash2":
        target_dir = make_target(tmp_path / "t", "qwen3", vocab_size=8, tokenizer=False, seed=3)
        draft_dir = make_dflash2_drafter(tmp_path / "d", seed=4, vocab_size=8, mask_token_id=7)
    else:  # the llama pair: its drafter proposes 90 of 264 ids
        target_dir, draft_dir = tiny_pairs["llama"]
    target, drafter = load_target(str(target_dir))[0], load_drafter(draft_dir)
    bundle = export_bundle(target, drafter, None, tmp_path / "bundle", flavour="slots-trt", capacity=64,
                           check=False, draft_distribution=True)
    host = LLM.from_bundle(bundle, block_size=4, max_batch=3, capacity=64, draft_rule="drafter")
    want = mixed_batch(host, max_batch=3, capacity=64)
    assert want == [host.generate([p], params)[0].token_ids for p, params in zip(PROMPTS, PARAMS, strict=True)]

    engines = tensorrt_engines(bundle, tmp_path / "engines", ort, fakes, monkeypatch)
    draws = counted(fakes[1], "fake_cuda_draft_draws")
    device = LLM.from_bundle(engines, block_size=4, draft_rule="drafter")
    assert device.backend == "tensorrt"
    assert mixed_batch(device, max_batch=3, capacity=64) == want
    assert mixed_batch(device, max_batch=2, capacity=64) == want
    assert (counted(fakes[1], "fake_cuda_draft_draws") > draws) == core.HAS_DEVICE_DECIDE
    assert mixed_batch(LLM.from_bundle(engines, block_size=4), max_batch=3, capacity=64) != want  # the rule was in effect

    plain = export_bundle(target, drafter, None, tmp_path / "plain", flavour="slots-trt", capacity=64, check=False)
    engines = tensorrt_engines(plain, tmp_path / "plain-engines", ort, fakes, monkeypatch)
    need = "selector_scores" if kind == "dflash2" else "draft_logits"
    with pytest.raises(DFlashError, match=f"needs the draft block graph's {need}.*--draft-distribution"):
        LLM.from_bundle(engines, block_size=4, draft_rule="drafter")


def test_llm_on_tensorrt_from_checkpoints_exports_what_the_drafter_rule_draws_from(core, ort, fakes, tiny_pairs,
                                                                                  tmp_path, monkeypatch):
    """LLM(target, draft, backend="tensorrt", draft_rule="drafter"): the cached slots-trt export returns the
    draft block's distribution (an export of its own in the cache: point mass keeps the default without it),
    built into (fake) engines; it gives the seeded tokens of that bundle on the onnxruntime executor. A
    drafter rule with adaptive blocks is refused before anything is exported."""
    from seeded_batches import mixed_batch

    from dflash_trt import LLM
    from dflash_trt.runtime.bundles import bundle_key

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    fake_tensorrt(ort, fakes, monkeypatch)
    target, draft = map(str, tiny_pairs["llama"])
    with pytest.raises(DFlashError, match="draft_rule 'drafter' needs a fixed block_size"):
        LLM(target, draft, backend="tensorrt", draft_rule="drafter", capacity=64, max_batch=3)
    assert not (tmp_path / "cache").exists()

    device = LLM(target, draft, block_size=4, backend="tensorrt", draft_rule="drafter", capacity=64, max_batch=3)
    assert device.backend == "tensorrt"
    bundle = tmp_path / "cache" / "dflash-trt" / "bundles" / bundle_key(target, draft, "slots-trt", 64,
                                                                        draft_distribution=True)
    host = LLM.from_bundle(bundle, block_size=4, max_batch=3, capacity=64, draft_rule="drafter")
    assert mixed_batch(device, max_batch=3, capacity=64) == mixed_batch(host, max_batch=3, capacity=64)

    LLM(target, draft, block_size=4, backend="tensorrt", capacity=64, max_batch=3)  # point mass: the default export
    assert len(list((tmp_path / "cache" / "dflash-trt" / "bundles").iterdir())) == 2

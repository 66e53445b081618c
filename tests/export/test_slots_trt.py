"""The slots-trt flavour: graph contract 2 in standard ONNX ops (TensorScatter + Attention, opset 24)
with a static capacity, for TensorRT. Every check holds it against the `slots` (GroupQueryAttention)
form of the same target, run as the batched runtime runs both: each cache output bound to its input's
buffer, ragged rows, garbage past each length."""


import numpy as np
import onnx
import onnxruntime as ort
import pytest
from factories import make_drafter, make_target
from slot_checks import CAPACITY, Slots, assert_row_equals_reference, prefilled_slots

from dflash_trt.engines.build import build_engines
from dflash_trt.engines.config import BuildConfig
from dflash_trt.errors import DFlashError
from dflash_trt.export.bundle import export_bundle
from dflash_trt.export.manifest import read_bundle
from dflash_trt.models.checkpoints import load_drafter, load_target

ATOL = 1e-4  # float32 on one CPU: reduction-order round-off
# qwen3-window: layers 2 and 3 keep the last 3 positions only, which the rows below cross
FAMILIES = {"llama": ("llama", {}),
            "qwen3-window": ("qwen3", {"use_sliding_window": True, "sliding_window": 3, "max_window_layers": 2})}


def _pair(root, name, family, seed=0, **config):
    target_dir = make_target(root / name, family, seed=seed, **config)
    drafter = load_drafter(make_drafter(root / f"{name}-draft", seed=seed, block_size=4, target_layer_ids=[1, 2]))
    target, tokenizer = load_target(str(target_dir))
    return target, drafter, tokenizer


@pytest.fixture(scope="module")
def both_forms(tmp_path_factory):
    """name -> (slots-trt bundle (checked at export), slots bundle, TargetModel, taps)."""
    root = tmp_path_factory.mktemp("slots-trt")
    made = {}
    for seed, (name, (family, config)) in enumerate(FAMILIES.items()):
        target, drafter, tokenizer = _pair(root, name, family, seed, **config)
        trt = export_bundle(target, drafter, tokenizer, root / f"{name}-trt", flavour="slots-trt", capacity=CAPACITY)
        gqa = export_bundle(target, drafter, tokenizer, root / f"{name}-gqa", flavour="slots", check=False)
        made[name] = (trt, gqa, target, tuple(drafter.config.target_layer_ids))
    return made


def test_the_bundle_records_contract_2_its_capacity_and_standard_ops_at_opset_24(both_forms):
    bundle = both_forms["llama"][0]
    manifest = read_bundle(bundle)
    assert (manifest["flavour"], manifest["contract"], manifest["capacity"]) == ("slots-trt", 2, CAPACITY)
    assert manifest["checks"]["polygraphy_vs_pytorch"]["target"] == "passed"
    cache = manifest["graphs"]["target"]["inputs"][4]
    assert cache["name"] == "cache_key_0" and cache["shape"] == ["batch", 2, CAPACITY, 16]
    model = onnx.load(str(bundle / "target.onnx"), load_external_data=False)
    assert {(o.domain, o.version) for o in model.opset_import} == {("", 24)}
    ops = {n.op_type for n in model.graph.node}
    assert {"TensorScatter", "Attention"} <= ops and "GroupQueryAttention" not in ops
    static = [d.dim_value for d in model.graph.input[4].type.tensor_type.shape.dim]
    assert static[1:] == [2, CAPACITY, 16]
    onnx.checker.check_model(str(bundle / "target.onnx"), full_check=True)


@pytest.mark.parametrize("name", list(FAMILIES))
def test_a_ragged_step_equals_the_gqa_form_in_place_and_leaves_idle_rows_alone(both_forms, name):
    """Five rows: committed 5, 0, 11, 7, 0 tokens; 4, 2, 1, 0 (idle) and 0 (idle, empty slot) of 4 new
    tokens valid; finite garbage past every length (the runtime zero-fills fresh slots; masked slots
    still meet a zero weight in P @ V). Slots.step asserts every cache output is its input's buffer."""
    trt, gqa, target, taps = both_forms[name]
    committed, valid, new = [5, 0, 11, 7, 0], [4, 2, 1, 0, 0], 4
    ours, prefixes, ids = prefilled_slots(trt, target, taps, committed, new, 1e4, seed=3)
    theirs, _, _ = prefilled_slots(gqa, target, taps, committed, new, 1e4, seed=3)
    before = [c.copy() for c in ours.caches]
    index = np.tile(np.arange(new), (len(committed), 1))
    logits, features = ours.step(ids, committed, valid, index)
    ref_logits, ref_features = theirs.step(ids, committed, valid, index)
    np.testing.assert_allclose(features, ref_features, atol=ATOL, rtol=0)
    for row, q in enumerate(valid):  # logits of padding rows mean nothing in either form
        np.testing.assert_allclose(logits[row, :q], ref_logits[row, :q], atol=ATOL, rtol=0)
    for cache, ref, old in zip(ours.caches, theirs.caches, before, strict=True):
        np.testing.assert_allclose(cache, ref, atol=ATOL, rtol=0)
        for row, (p, q) in enumerate(zip(committed, valid, strict=True)):
            # the committed prefix and everything past the valid new rows: bit-identical
            assert np.array_equal(cache[row, :, :p], old[row, :, :p])
            assert np.array_equal(cache[row, :, p + q :], old[row, :, p + q :])
    assert np.isfinite(features).all() and not features[3:].any()
    for row, (p, q) in enumerate(zip(committed, valid, strict=True)):
        if q:
            sequence = prefixes[row] + ids[row, :q].tolist()
            assert_row_equals_reference(target, taps, ours, logits, features, row, sequence, p, ATOL)


def test_a_rollback_is_a_length_and_the_next_step_overwrites_the_rejected_rows(both_forms):
    """Row k verifies 4 tokens and keeps k of them; the next step, at cache_lengths + k, equals the GQA form."""
    trt, gqa, target, taps = both_forms["qwen3-window"]
    committed = [6, 6, 6, 6, 6]
    runs = []
    for bundle in (trt, gqa):
        slots, prefixes, ids = prefilled_slots(bundle, target, taps, committed, 4, 1e4, seed=5)
        slots.step(ids, committed, [4] * 5, np.tile(np.arange(4), (5, 1)))
        kept = np.array(committed) + np.arange(5)
        runs.append((slots, slots.step(ids[:, :1] + 1, kept, [1] * 5, np.zeros((5, 1), np.int64))))
    (ours, (logits, features)), (theirs, (ref_logits, ref_features)) = runs
    np.testing.assert_allclose(logits, ref_logits, atol=ATOL, rtol=0)
    np.testing.assert_allclose(features, ref_features, atol=ATOL, rtol=0)
    for row, p in enumerate(np.array(committed) + np.arange(5)):
        for cache, ref in zip(ours.caches, theirs.caches, strict=True):
            np.testing.assert_allclose(cache[row, :, : p + 1], ref[row, :, : p + 1], atol=ATOL, rtol=0)


def _run_in_place(bundle, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """One target run of any contract-2 bundle, cache_* outputs bound to their inputs' buffers."""
    spec = read_bundle(bundle)["graphs"]["target"]
    session = ort.InferenceSession(str(bundle / "target.onnx"), providers=["CPUExecutionProvider"])
    binding, shared = session.io_binding(), {}
    for name, value in feeds.items():
        if name.startswith("cache_"):
            shared[name] = ort.OrtValue.ortvalue_from_numpy(value)
            binding.bind_ortvalue_input(name, shared[name])
        else:
            binding.bind_cpu_input(name, value)
    names = [o["name"] for o in spec["outputs"]]
    for name in names:
        if name.startswith("cache_"):
            binding.bind_ortvalue_output(name, shared[name.replace("_out_", "_")])
        else:
            binding.bind_output(name)
    session.run_with_iobinding(binding)
    outputs = binding.get_outputs()
    for name, value in zip(names, outputs, strict=True):
        if name.startswith("cache_"):
            assert value.data_ptr() == feeds[name.replace("_out_", "_")].ctypes.data  # in place
    # copies: a cache output's memory is the caller's feed, which may not outlive this call
    return {name: np.array(value.numpy(), copy=True) for name, value in zip(names, outputs, strict=True)}


def test_a_hybrid_target_exports_as_slots_trt_and_equals_its_slots_form(tmp_path):
    """qwen3_5_text (layers linear, full, linear, full): its ragged export inputs (committed by its own
    prefill, garbage past each length, states from the same prefill) give the same outputs in both forms."""
    from dflash_trt.export.hybrid_slot_graphs import HybridSlotTargetGraph

    target, drafter, tokenizer = _pair(tmp_path, "hybrid", "qwen3_5_text", seed=20)
    trt = export_bundle(target, drafter, tokenizer, tmp_path / "trt", flavour="slots-trt", capacity=CAPACITY)
    gqa = export_bundle(target, drafter, tokenizer, tmp_path / "gqa", flavour="slots", check=False)
    manifest = read_bundle(trt)
    assert manifest["checks"]["polygraphy_vs_pytorch"]["target"] == "passed" and manifest["capacity"] == CAPACITY
    spec = manifest["graphs"]["target"]
    inputs = HybridSlotTargetGraph(target, tuple(drafter.config.target_layer_ids)).example_inputs(spec, target.vocab_size)
    feeds = {io["name"]: t.numpy() for io, t in zip(spec["inputs"], inputs, strict=True)}
    ours = _run_in_place(trt, {k: v.copy() for k, v in feeds.items()})
    theirs = _run_in_place(gqa, {k: v.copy() for k, v in feeds.items()})
    assert list(ours) == list(theirs)
    for name, value in ours.items():  # every logits_index there names a valid row
        np.testing.assert_allclose(value, theirs[name], atol=ATOL, rtol=0, err_msg=name)
    ops = {n.op_type for n in onnx.load(str(trt / "target.onnx"), load_external_data=False).graph.node}
    assert "TensorScatter" in ops and "Loop" in ops and "Attention" not in ops  # the decomposed form (slot_trt_ops)


@pytest.fixture(scope="module")
def half_bundle(tmp_path_factory):
    root = tmp_path_factory.mktemp("slots-trt-fp16")
    target, drafter, tokenizer = _pair(root, "qwen3", "qwen3", seed=1)
    return export_bundle(target, drafter, tokenizer, root / "bundle", flavour="slots-trt", capacity=CAPACITY,
                         dtype="float16")


def test_a_float16_export_passes_its_onnxruntime_check(half_bundle):
    manifest = read_bundle(half_bundle)
    assert manifest["dtype"] == "float16" and manifest["graphs"]["target"]["inputs"][4]["dtype"] == "float16"
    assert all(manifest["checks"]["polygraphy_vs_pytorch"][g] == "passed"
               for g in ("target", "draft_context", "draft_block"))


@pytest.mark.parametrize("capacity, flavour, message", [
    (None, "slots-trt", "--flavour slots-trt needs --capacity N"),
    (8, "slots-trt", "--capacity must be a whole number of tokens >= 16"),
    (0, "slots-trt", "--capacity must be a whole number of tokens >= 16"),
    (64, "slots", "--capacity is for --flavour slots-trt only"),
    (64, "portable", "--capacity is for --flavour slots-trt only"),
])
def test_export_refuses_a_missing_or_misplaced_capacity_in_one_line(tiny_pairs, tmp_path, capacity, flavour, message):
    from click.testing import CliRunner

    from dflash_trt.cli import main

    target_dir, draft_dir = tiny_pairs["qwen3"]
    args = ["export", "--target", str(target_dir), "--draft", str(draft_dir), "-o", str(tmp_path / "b"),
            "--flavour", flavour, "--no-check"] + ([] if capacity is None else ["--capacity", str(capacity)])
    result = CliRunner().invoke(main, args)
    assert result.exit_code != 0 and message in result.output
    assert len(result.output.strip().splitlines()) == 1, result.output
    assert not (tmp_path / "b").exists()


def test_the_cli_exports_slots_trt_and_builds_it_for_onnxruntime(tiny_pairs, tmp_path):
    from click.testing import CliRunner

    from dflash_trt.cli import main

    target_dir, draft_dir = tiny_pairs["qwen3"]
    out = tmp_path / "b"
    result = CliRunner().invoke(main, ["export", "--target", str(target_dir), "--draft", str(draft_dir), "-o", str(out),
                                       "--flavour", "slots-trt", "--capacity", "32", "--no-check"])
    assert result.exit_code == 0, result.output
    manifest = read_bundle(out)
    assert (manifest["flavour"], manifest["contract"], manifest["capacity"]) == ("slots-trt", 2, 32)
    result = CliRunner().invoke(main, ["inspect", str(out)])
    assert "graph contract 2" in result.output
    engines = build_engines(out, tmp_path / "e", BuildConfig(engine="onnxruntime", max_seq_len=64, max_batch=2))
    assert engines["source"]["capacity"] == 32 and engines["profiles"]["target"]["verify"]["rows"] == [1, 4, 4]
    # the optimized graph still writes in place and equals the exported one
    target, _ = load_target(str(target_dir))
    steps = []
    for bundle in (out, tmp_path / "e"):
        slots = Slots(bundle, target, 2, capacity=32)
        steps.append((slots.step([[5, 6, 7], [8, 0, 0]], [0, 3], [3, 1], [[2], [0]]), slots.caches))
    (logits, features), caches = steps[0]
    (ref_logits, ref_features), ref_caches = steps[1]
    np.testing.assert_allclose(logits, ref_logits, atol=ATOL, rtol=0)
    np.testing.assert_allclose(features, ref_features, atol=ATOL, rtol=0)
    for cache, ref in zip(caches, ref_caches, strict=True):
        np.testing.assert_allclose(cache, ref, atol=ATOL, rtol=0)


# TensorRT-RTX builds ahead of time on a CPU (tests/engines/test_tensorrt_rtx.py); kept small: tiny
# models, capacity 40, max_seq_len 64.
RTX = dict(engine="tensorrt-rtx", compute_capabilities=("12.0",), max_seq_len=64, max_batch=2)


def test_a_float16_slots_trt_bundle_builds_for_sm120_with_contract_2_and_its_capacity(half_bundle, tmp_path):
    pytest.importorskip("tensorrt_rtx", reason="TensorRT-RTX is not installed (pip install tensorrt-rtx-cu13)")
    manifest = build_engines(half_bundle, tmp_path / "e", BuildConfig(**RTX))
    assert manifest["source"]["contract"] == 2 and manifest["source"]["capacity"] == CAPACITY
    assert manifest["source"]["flavour"] == "slots-trt"
    io = manifest["engines"]["target"]["io"]
    assert io["cache_key_0"] == io["cache_key_out_0"] == io["features"] == "HALF" and io["logits"] == "FLOAT"
    assert manifest["profiles"]["target"]["prefill"] == {"batch": [1, 1, 2], "new": [1, CAPACITY, CAPACITY],
                                                         "rows": [1, 1, CAPACITY]}


@pytest.mark.parametrize("name", ["dense", "hybrid"])
def test_float32_slots_trt_targets_build_for_sm120(both_forms, tmp_path, name):
    """float32 has no fused attention kernel on TensorRT-RTX 1.7: the build marks attention
    decomposable. The hybrid's attention is decomposed at export (its Loops crash the builder beside
    an ONNX Attention)."""
    pytest.importorskip("tensorrt_rtx", reason="TensorRT-RTX is not installed (pip install tensorrt-rtx-cu13)")
    if name == "dense":
        bundle = both_forms["qwen3-window"][0]
    else:
        target, drafter, tokenizer = _pair(tmp_path, "hybrid", "qwen3_5_text", seed=21)
        bundle = export_bundle(target, drafter, tokenizer, tmp_path / "b", flavour="slots-trt", capacity=CAPACITY,
                               check=False)
    manifest = build_engines(bundle, tmp_path / "e", BuildConfig(**RTX))
    assert manifest["engines"]["target"]["io"]["cache_value_out_1"] == "FLOAT"


def test_a_slots_bundle_is_refused_for_tensorrt_with_the_way_to_slots_trt(both_forms, tmp_path):
    for engine, capabilities in (("tensorrt-rtx", ("12.0",)), ("tensorrt", ())):
        with pytest.raises(DFlashError, match="export with --flavour slots-trt --capacity N"):
            build_engines(both_forms["llama"][1], tmp_path / "e",
                          BuildConfig(engine=engine, compute_capabilities=capabilities))
        assert not (tmp_path / "e").exists()


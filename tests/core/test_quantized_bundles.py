"""int4 bundles (export --quant int4, export/quantize.py). slots: every weight matmul of the target
graph is onnxruntime's 4-bit MatMulNBits; a verified block's logits are bit-identical to decoding its
tokens one step at a time with two query rows (what the runtime's min_query_tokens feeds), so greedy
DFlash on the C++ executor equals the quantized target's own greedy decoding, request for request.
slots-trt: blocked int4 DequantizeLinear into each matmul (TensorRT's weight-only INT4), which
onnxruntime runs too."""

import json

import numpy as np
import onnx
import pytest
from factories import export_tiny_slots_bundle, make_drafter, make_target
from scheduler_checks import bundle_scheduler, drive_scheduler
from slot_checks import Slots

from dflash_trt.errors import DFlashError
from dflash_trt.export.bundle import export_bundle
from dflash_trt.models.checkpoints import load_drafter, load_target

KINDS = {"dense": {}, "sliding-window": dict(use_sliding_window=True, sliding_window=3, max_window_layers=2)}


@pytest.fixture(scope="module")
def int4(tmp_path_factory):
    """kind -> (int4 slots bundle, its float twin, the target dir)."""
    made = {}
    for kind, config in KINDS.items():
        root = tmp_path_factory.mktemp(kind)
        made[kind] = (export_tiny_slots_bundle(root / "q", quant="int4", **config),
                      export_tiny_slots_bundle(root / "f", **config), root / "q" / "qwen3")
    # 6 tokens (MASK is 5): greedy drafts are often accepted, so acceptance is exercised
    root = tmp_path_factory.mktemp("small-vocab")
    target_dir = make_target(root / "target", "qwen3", seed=5, tokenizer=False, vocab_size=6)
    drafter = load_drafter(make_drafter(root / "draft", seed=5, block_size=4, target_layer_ids=[1, 2], mask_token_id=5))
    target, _ = load_target(str(target_dir))
    bundle = export_bundle(target, drafter, None, root / "q", flavour="slots", check=False, quant="int4")
    made["small-vocab"] = (bundle, None, target_dir)
    return made


def _weights(graph: onnx.ModelProto) -> set[str]:
    return {init.name for init in graph.graph.initializer}


def test_every_weight_matmul_of_the_target_is_4_bit_and_the_drafter_is_untouched(int4):
    bundle, float_bundle, _ = int4["dense"]
    target = onnx.load(str(bundle / "target.onnx"), load_external_data=False)
    weights = _weights(target)
    ops = [node.op_type for node in target.graph.node]
    layers = 4  # q, k, v, o, gate, up, down per layer, and the LM head
    assert ops.count("MatMulNBits") == 7 * layers + 1
    assert not [n for n in target.graph.node if n.op_type == "MatMul" and set(n.input) & weights]
    for node in target.graph.node:
        if node.op_type == "MatMulNBits":
            attributes = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
            assert (attributes["bits"], attributes["block_size"], attributes["accuracy_level"]) == (4, 32, 4)
    for name in ("draft_context", "draft_block"):
        graph = onnx.load(str(bundle / f"{name}.onnx"), load_external_data=False)
        assert "MatMulNBits" not in {node.op_type for node in graph.graph.node}
        assert (bundle / f"{name}.onnx.data").read_bytes() == (float_bundle / f"{name}.onnx.data").read_bytes()
    record = json.loads((bundle / "bundle.json").read_text())["quant"]
    assert record["weights"] == "int4" and record["quantized_matmuls"] == 7 * layers + 1 and record["float_matmuls"] == 0
    assert "quant" not in json.loads((float_bundle / "bundle.json").read_text())
    assert (bundle / "target.onnx.data").stat().st_size < 0.4 * (float_bundle / "target.onnx.data").stat().st_size


def _one_by_one(bundle, target, prefix, block, rows_fed):
    """Logits of `block` after `prefix`, one token per Run, each fed as `rows_fed` query rows."""
    slots = Slots(bundle, target, 1, garbage=0.0)
    slots.step([prefix], [0], [len(prefix)], [[len(prefix) - 1]])
    out = []
    for k, token in enumerate(block):
        logits, _ = slots.step([[token] * rows_fed], [len(prefix) + k], [rows_fed], [[0]])
        out.append(logits[0, 0])
    return np.stack(out)


@pytest.mark.parametrize("kind", ["dense", "sliding-window"])
def test_a_verified_block_equals_two_row_steps_bit_for_bit(int4, kind):
    """Straight on onnxruntime, no executor: the rows of one B-token Run are the very logits of B
    steps that feed two query rows each (the second a repeat, past what the row keeps)."""
    bundle, _, target_dir = int4[kind]
    target, _ = load_target(str(target_dir))
    rng = np.random.default_rng(0)
    for _ in range(4):
        prefix = rng.integers(0, 264, int(rng.integers(3, 12))).tolist()
        block = rng.integers(0, 264, int(rng.integers(2, 7))).tolist()
        slots = Slots(bundle, target, 1, garbage=0.0)
        slots.step([prefix], [0], [len(prefix)], [[len(prefix) - 1]])
        verified, _ = slots.step([block], [len(prefix)], [len(block)], [list(range(len(block)))])
        np.testing.assert_array_equal(verified[0], _one_by_one(bundle, target, prefix, block, 2))


def test_the_runtime_feeds_two_query_rows_for_int4_bundles_only(ort, int4):
    bundle, float_bundle, _ = int4["dense"]
    assert ort.executor_config(bundle, 2, 64).min_query_tokens == 2
    assert ort.executor_config(float_bundle, 2, 64).min_query_tokens == 1


@pytest.mark.parametrize("concurrency", [1, 3, 8])
@pytest.mark.parametrize("kind", ["dense", "sliding-window", "small-vocab"])
def test_greedy_dflash_equals_the_quantized_targets_own_greedy_decoding(core, ort, int4, kind, concurrency):
    bundle = int4[kind][0]
    vocab = 6 if kind == "small-vocab" else 264
    rng = np.random.default_rng(concurrency)
    work, step = [], 0
    for _ in range(8 if concurrency > 1 else 3):
        work.append((step, rng.integers(0, vocab - 1, int(rng.integers(1, 20))).tolist(), int(rng.integers(3, 20))))
        step += int(rng.integers(0, 3))
    plain, _ = drive_scheduler(core, bundle_scheduler(core, ort, bundle, 1, 1)[0], [(0, p, m) for _, p, m in work])
    sched, executor = bundle_scheduler(core, ort, bundle, concurrency, 4)
    tokens, _ = drive_scheduler(core, sched, work)
    assert tokens == plain
    assert sched.slots.num_free == concurrency and executor.live_rows == []


def test_drafts_are_accepted_on_an_int4_target(core, ort, int4):
    """Speculation really happens on the quantized target (6 tokens: some drafts are right), losslessly."""
    work = [(0, prompt, 40) for prompt in ([1, 2, 3], [4, 0, 4, 0, 1], [3], [2, 2])]
    plain, _ = drive_scheduler(core, bundle_scheduler(core, ort, int4["small-vocab"][0], 1, 1)[0], work)
    tokens, metrics = drive_scheduler(core, bundle_scheduler(core, ort, int4["small-vocab"][0], 4, 4)[0], work)
    assert tokens == plain
    assert sum(m["num_accepted_tokens"] for m in metrics.values()) > 0


def test_a_full_slot_decodes_its_last_token_within_the_slot(core, ort, int4):
    """The padding row of a slot's last step lands in the executor's spare position, not the next slot."""
    bundle = int4["dense"][0]
    capacity, prompt = 16, [3, 1, 4, 1, 5]
    alone, _ = drive_scheduler(core, bundle_scheduler(core, ort, bundle, 1, 1, capacity)[0], [(0, prompt, capacity - len(prompt))])
    together, _ = drive_scheduler(core, bundle_scheduler(core, ort, bundle, 2, 1, capacity)[0],
                         [(0, prompt, capacity - len(prompt)), (0, [9, 2, 6], capacity - 3)])
    assert len(alone[0]) == capacity - len(prompt) and together[0] == alone[0]


@pytest.mark.parametrize(("kwargs", "says"), [
    (dict(flavour="portable"), "--flavour portable has no quantized form yet"),
    (dict(flavour="plugin"), "--flavour plugin has no quantized form yet"),
    (dict(flavour="slots", dtype="float16"), "quantizes a float32 export"),
    (dict(flavour="slots", quant="int8"), "unknown --quant"),
    (dict(flavour="portable", quant=None, draft_quant="int4"), "--draft-quant int4 is written for float32 --flavour slots"),
])
def test_a_quantization_the_export_cannot_write_is_one_line_before_any_graph(tmp_path, kwargs, says):
    target, tokenizer = load_target(str(make_target(tmp_path / "t", "qwen3")))
    drafter = load_drafter(make_drafter(tmp_path / "d", block_size=4, target_layer_ids=[1, 2]))
    kwargs = {"quant": "int4", **kwargs}
    with pytest.raises(DFlashError, match=says):
        export_bundle(target, drafter, tokenizer, tmp_path / "out", check=False, **kwargs)
    assert not (tmp_path / "out").exists()


def test_a_moe_target_is_refused_for_int4(tmp_path):
    target, tokenizer = load_target(str(make_target(tmp_path / "t", "qwen3_moe")))
    drafter = load_drafter(make_drafter(tmp_path / "d", block_size=4, target_layer_ids=[1, 2]))
    with pytest.raises(DFlashError, match="experts in float: not supported yet"):
        export_bundle(target, drafter, tokenizer, tmp_path / "out", flavour="slots", check=False, quant="int4")


def test_the_dry_run_estimates_the_int4_targets_weights(int4):
    """build --dry-run's int4 figure against the bytes the export wrote (every initializer, packed
    weights and scales included); RoPE tables and other small constants are not estimated."""
    from dflash_trt.engines.config import BuildConfig
    from dflash_trt.engines.plan import plan_pair

    bundle, _, target_dir = int4["dense"]
    graph = onnx.load(str(bundle / "target.onnx"))
    written = sum(onnx.numpy_helper.to_array(init).nbytes for init in graph.graph.initializer)
    draft_dir = target_dir.parent / "qwen3-draft"
    estimate, _ = plan_pair(str(target_dir), str(draft_dir), BuildConfig(engine="onnxruntime"), "slots",
                            None).quantized_target_bytes("int4")
    assert abs(estimate - written) / written < 0.02, (estimate, written)


@pytest.fixture(scope="module")
def trt_int4(tmp_path_factory):
    root = tmp_path_factory.mktemp("slots-trt")
    target, tokenizer = load_target(str(make_target(root / "t", "qwen3")))
    drafter = load_drafter(make_drafter(root / "d", block_size=4, target_layer_ids=[1, 2]))
    return export_bundle(target, drafter, tokenizer, root / "b", flavour="slots-trt", capacity=64, check=False,
                         quant="int4")


def test_slots_trt_weights_are_blocked_int4_dequantize_linear(trt_int4):
    graph = onnx.load(str(trt_int4 / "target.onnx"), load_external_data=False)
    weights = {init.name: init for init in graph.graph.initializer}
    dequantized = [n for n in graph.graph.node if n.op_type == "DequantizeLinear"]
    assert len(dequantized) == 7 * 4 + 1
    consumers = {i: n.op_type for n in graph.graph.node for i in n.input}
    for node in dequantized:
        attributes = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        assert attributes == {"axis": 0, "block_size": 32}
        assert weights[node.input[0]].data_type == onnx.TensorProto.INT4
        assert len(node.input) == 2  # no zero point: symmetric, as TensorRT's dequantize layer requires
        assert consumers[node.output[0]] == "MatMul"
    assert "MatMulNBits" not in {n.op_type for n in graph.graph.node}
    record = json.loads((trt_int4 / "bundle.json").read_text())["quant"]
    assert record["form"] == "DequantizeLinear (int4, blocked) into MatMul" and record["float_matmuls"] == 0
    assert record["activations"] == "float (weight-only)"


def test_slots_trt_int4_decodes_greedy_dflash_equal_to_its_plain_decoding_on_onnxruntime(core, ort, trt_int4):
    assert ort.executor_config(trt_int4, 3, 64).min_query_tokens == 1  # its caches are static: no spare position
    work = [(0, [5, 6, 7], 12), (1, [9, 10, 11, 12], 10), (2, [20], 14)]
    plain, _ = drive_scheduler(core, bundle_scheduler(core, ort, trt_int4, 1, 1)[0], [(0, p, m) for _, p, m in work])
    tokens, _ = drive_scheduler(core, bundle_scheduler(core, ort, trt_int4, 3, 4)[0], work)
    assert tokens == plain


def test_an_int4_drafter_leaves_the_target_alone_and_the_output_unchanged(core, ort, int4, tmp_path):
    """--draft-quant int4: the draft graphs' matmuls in 4 bits, the target graph byte for byte the int4
    bundle's; drafts are verified, so greedy output still equals the target's own."""
    target_dir = int4["dense"][2]
    target, tokenizer = load_target(str(target_dir))
    drafter = load_drafter(target_dir.parent / "qwen3-draft")
    bundle = export_bundle(target, drafter, tokenizer, tmp_path / "b", flavour="slots", check=False, quant="int4",
                           draft_quant="int4")
    for graph in ("draft_context", "draft_block"):
        model = onnx.load(str(bundle / f"{graph}.onnx"), load_external_data=False)
        weights = _weights(model)
        assert "MatMulNBits" in {n.op_type for n in model.graph.node}
        assert not [n for n in model.graph.node if n.op_type == "MatMul" and set(n.input) & weights]
    assert (bundle / "target.onnx.data").read_bytes() == (int4["dense"][0] / "target.onnx.data").read_bytes()
    assert json.loads((bundle / "bundle.json").read_text())["draft_quant"]["weights"] == "int4"
    work = [(0, [5, 6, 7], 12), (1, [9, 10, 11, 12], 10), (2, [20], 14)]
    plain, _ = drive_scheduler(core, bundle_scheduler(core, ort, int4["dense"][0], 1, 1)[0], [(0, p, m) for _, p, m in work])
    tokens, _ = drive_scheduler(core, bundle_scheduler(core, ort, bundle, 3, 4)[0], work)
    assert tokens == plain

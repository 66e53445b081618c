"""export --quant fp8 | nvfp4 (TensorRT's float weight formats, slots-trt): every target matmul reads
its weight through standard DequantizeLinear whose values are exactly what NVIDIA ModelOpt's own
dequantization of its quantized weights gives (the ONNX reference evaluator reads our graph; ModelOpt
reads its tensors), and greedy DFlash equals the quantized target's own greedy decoding: on
onnxruntime for fp8; for nvfp4, which onnxruntime cannot run, on a float graph of the same weights.
Which exports and builds are refused, in one line before any work."""

import json
import warnings

import numpy as np
import onnx
import pytest
import torch
from click.testing import CliRunner
from factories import make_drafter, make_target
from onnx.reference import ReferenceEvaluator
from scheduler_checks import bundle_scheduler, drive_scheduler

from dflash_trt.cli import main
from dflash_trt.engines.build import check_graphs
from dflash_trt.engines.config import BuildConfig
from dflash_trt.errors import DFlashError
from dflash_trt.export.bundle import export_bundle
from dflash_trt.models.checkpoints import load_drafter, load_target

pytest.importorskip("modelopt", reason="NVIDIA ModelOpt computes the fp8 / nvfp4 scales: pip install nvidia-modelopt")
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from modelopt.torch.quantization.qtensor import FP8QTensor, NVFP4QTensor

FORMATS = ("fp8", "nvfp4")


@pytest.fixture(scope="module")
def bundles(tmp_path_factory):
    """None (float32), "fp8", "nvfp4" -> a slots-trt bundle of the same tiny pair; and the pair's dirs."""
    root = tmp_path_factory.mktemp("float-formats")
    target_dir = make_target(root / "t", "qwen3")
    draft_dir = make_drafter(root / "d", block_size=4, target_layer_ids=[1, 2])
    target, tokenizer = load_target(str(target_dir))
    drafter = load_drafter(draft_dir)
    made = {quant: export_bundle(target, drafter, tokenizer, root / f"b-{quant}", flavour="slots-trt", capacity=64,
                                 check=False, quant=quant) for quant in (None, *FORMATS, "int4")}
    return made, target_dir, draft_dir


def evaluate_dequantized(model: onnx.ModelProto, outputs: list[str]) -> list[np.ndarray]:
    """The named outputs of the graph's DequantizeLinear chains, by the ONNX reference evaluator."""
    chains = [n for n in model.graph.node if n.op_type == "DequantizeLinear"]
    graph = onnx.helper.make_graph(chains, "weights", [], [onnx.helper.make_tensor_value_info(o, onnx.TensorProto.FLOAT,
                                                                                              None) for o in outputs],
                                   list(model.graph.initializer))
    return ReferenceEvaluator(onnx.helper.make_model(graph, opset_imports=model.opset_import)).run(None, {})


def dequantized_weights(path) -> dict[str, np.ndarray]:
    """The float weight each DequantizeLinear chain of the graph gives, by the original weight's name."""
    model = onnx.load(str(path))
    outputs = [o for n in model.graph.node if n.op_type == "DequantizeLinear" for o in n.output
               if o.endswith("_dequantized")]
    return {o.removesuffix("_dequantized"): v for o, v in zip(outputs, evaluate_dequantized(model, outputs), strict=True)}


def matmul_weights(path) -> list[np.ndarray]:
    """The float weight [K, N] of every MatMul fed by a DequantizeLinear (chain)."""
    model = onnx.load(str(path))
    into_matmul = {n.input[1] for n in model.graph.node if n.op_type == "MatMul"}
    outputs = [o for n in model.graph.node if n.op_type == "DequantizeLinear" for o in n.output if o in into_matmul]
    return evaluate_dequantized(model, outputs)


def modelopt_round_trip(quant: str, weight: np.ndarray) -> np.ndarray:
    """ModelOpt's quantize then its own dequantize of a [K, N] MatMul weight (it scales rows of [N, K])."""
    rows = torch.from_numpy(np.ascontiguousarray(weight.T))
    if quant == "fp8":
        quantized, scales = FP8QTensor.quantize(rows, axis=0)
        back = quantized.dequantize(dtype=torch.float32, scale=scales)
    else:
        quantized, block, tensor = NVFP4QTensor.quantize(rows, 16)
        back = quantized.dequantize(dtype=torch.float32, scale=block, double_scale=tensor, block_sizes={-1: 16})
    return back.numpy().T


@pytest.mark.parametrize("quant", FORMATS)
def test_every_target_matmul_reads_modelopts_weights_through_dequantize_linear(bundles, quant):
    made, _, _ = bundles
    model = onnx.load(str(made[quant] / "target.onnx"), load_external_data=False)
    float_model = onnx.load(str(made[None] / "target.onnx"))
    float_weights = {i.name: onnx.numpy_helper.to_array(i) for i in float_model.graph.initializer}
    matmuls = [n for n in float_model.graph.node if n.op_type == "MatMul" and n.input[1] in float_weights]
    consumers = {i: n.op_type for n in model.graph.node for i in n.input}
    weights = dequantized_weights(made[quant] / "target.onnx")
    assert len(matmuls) == len(weights) == 7 * 4 + 1  # q k v o gate up down per layer, and the LM head
    for name, value in weights.items():
        assert consumers[name + "_dequantized"] == "MatMul"
        assert name not in {i.name for i in model.graph.initializer}  # the float weight is gone
        np.testing.assert_array_equal(value, modelopt_round_trip(quant, float_weights[name]))
        error = np.abs(value - float_weights[name]).max() / np.abs(float_weights[name]).max()
        assert 0 < error < (0.07 if quant == "fp8" else 0.2), (name, error)  # rounded, within the format's step
    types = {i.name: i.data_type for i in model.graph.initializer}
    codes = onnx.TensorProto.FLOAT8E4M3FN if quant == "fp8" else onnx.TensorProto.FLOAT4E2M1
    assert sum(t == codes for t in types.values()) == len(weights)
    record = json.loads((made[quant] / "bundle.json").read_text())["quant"]
    assert (record["weights"], record["quantized_matmuls"], record["float_matmuls"]) == (quant, 29, 0)
    assert record["activations"] == "float (weight-only)" and "ModelOpt" in record["method"]
    shown = CliRunner().invoke(main, ["inspect", str(made[quant])])
    assert shown.exit_code == 0 and f"weights {quant}: 29 matmuls as DequantizeLinear (float" in shown.output
    size = (made[quant] / "target.onnx.data").stat().st_size
    assert size < (0.4 if quant == "fp8" else 0.3) * (made[None] / "target.onnx.data").stat().st_size


WORK = [(0, [5, 6, 7], 12), (1, [9, 10, 11, 12], 10), (2, [20], 14)]


def greedy_dflash_equals_plain(core, ort, bundle):
    plain, _ = drive_scheduler(core, bundle_scheduler(core, ort, bundle, 1, 1)[0], [(0, p, m) for _, p, m in WORK])
    tokens, _ = drive_scheduler(core, bundle_scheduler(core, ort, bundle, 3, 4)[0], WORK)
    assert tokens == plain
    return tokens


def test_fp8_decodes_greedy_dflash_equal_to_its_own_plain_decoding_on_onnxruntime(core, ort, bundles):
    made, _, _ = bundles
    tokens = greedy_dflash_equals_plain(core, ort, made["fp8"])
    assert tokens != greedy_dflash_equals_plain(core, ort, made[None])  # the weights really changed the model


def test_nvfp4_weights_decode_greedy_dflash_equal_to_plain_on_a_float_graph_of_them(core, ort, bundles, tmp_path):
    """onnxruntime has no float4 DequantizeLinear: the target whose every matmul weight is ModelOpt's
    NVFP4 round trip (the values the nvfp4 graph dequantizes, checked above), exported in float."""
    made, target_dir, draft_dir = bundles
    with pytest.raises(DFlashError, match="NVFP4, which onnxruntime cannot run"):
        ort.ort_executor(made["nvfp4"], max_batch=1, capacity=64)
    target, tokenizer = load_target(str(target_dir))
    with torch.no_grad():
        for module in target.model.modules():
            if isinstance(module, torch.nn.Linear):  # [out, in]: the graph's MatMul weight transposed
                module.weight.copy_(torch.from_numpy(modelopt_round_trip("nvfp4", module.weight.numpy().T).T.copy()))
    twin = export_bundle(target, load_drafter(draft_dir), tokenizer, tmp_path / "twin", flavour="slots-trt",
                         capacity=64, check=False)
    twin_weights = {i.name: onnx.numpy_helper.to_array(i) for i in onnx.load(str(twin / "target.onnx")).graph.initializer}
    for name, value in dequantized_weights(made["nvfp4"] / "target.onnx").items():
        np.testing.assert_array_equal(twin_weights[name], value)  # the same names: the same export of the same model
    greedy_dflash_equals_plain(core, ort, twin)


@pytest.mark.parametrize("quant", FORMATS)
def test_the_cpu_flavour_is_refused_in_one_line(bundles, quant, tmp_path):
    _, target_dir, draft_dir = bundles
    result = CliRunner().invoke(main, ["export", "--target", str(target_dir), "--draft", str(draft_dir), "--flavour",
                                       "slots", "--quant", quant, "-o", str(tmp_path / "out")])
    assert result.exit_code == 2 and "written for --flavour slots-trt" in result.stderr
    assert "for the CPU use --quant int4" in result.stderr and not (tmp_path / "out").exists()


@pytest.mark.parametrize("quant, engine, capabilities, says", [
    ("nvfp4", "tensorrt-rtx", ("8.9",), "nvfp4 weights need compute capability 12.0 or newer"),
    ("nvfp4", "tensorrt-rtx", ("12.0", "8.9"), "SM 8.9 cannot build them"),
    ("fp8", "tensorrt-rtx", ("8.6",), "fp8 weights need compute capability 8.9 or newer"),
    ("fp8", "onnxruntime", (), "fp8 weights are for TensorRT engines"),
    ("nvfp4", "onnxruntime", (), "no float4 DequantizeLinear kernel"),
])
def test_a_build_that_cannot_hold_the_format_is_refused(quant, engine, capabilities, says):
    with pytest.raises(DFlashError, match=says):
        check_graphs("slots-trt", "float32", BuildConfig(engine=engine, compute_capabilities=capabilities), "here", (quant,))
    for fine in (("12.0",), ("12.0", "12.1")):
        check_graphs("slots-trt", "float32", BuildConfig(engine="tensorrt-rtx", compute_capabilities=fine), "here", (quant,))


@pytest.mark.parametrize("quant", FORMATS)
def test_the_dry_run_estimates_the_quantized_targets_weights(bundles, quant):
    """build --dry-run's figure for each format against the bytes the export wrote (every initializer:
    codes and scales); RoPE tables and other small constants are not estimated, nor fp8's scale per
    output channel (4 bytes per row of 64 weights here: 6 %; under 0.2 % from 2,048 wide)."""
    from dflash_trt.engines.plan import plan_pair

    made, target_dir, draft_dir = bundles
    model = onnx.load(str(made[quant] / "target.onnx"))
    written = sum(len(i.raw_data) or onnx.numpy_helper.to_array(i).nbytes for i in model.graph.initializer)
    estimate, _ = plan_pair(str(target_dir), str(draft_dir), BuildConfig(engine="tensorrt-rtx",
                                                                         compute_capabilities=("12.0",)),
                            "slots-trt", None).quantized_target_bytes(quant)
    assert abs(estimate - written) / written < (0.05 if quant == "fp8" else 0.02), (estimate, written)


@pytest.mark.parametrize("quant", FORMATS)
def test_a_drafter_in_a_float_format_leaves_the_target_and_the_output_alone(core, ort, bundles, quant, tmp_path):
    """--draft-quant fp8 / nvfp4: both draft graphs' matmuls in the format, the target graph the float
    bundle's byte for byte; drafts are verified, so greedy output is the float target's (fp8 on
    onnxruntime); an nvfp4 drafter is refused at load there, in one line naming it."""
    made, target_dir, draft_dir = bundles
    target, tokenizer = load_target(str(target_dir))
    bundle = export_bundle(target, load_drafter(draft_dir), tokenizer, tmp_path / "b", flavour="slots-trt",
                           capacity=64, check=False, draft_quant=quant)
    codes = onnx.TensorProto.FLOAT8E4M3FN if quant == "fp8" else onnx.TensorProto.FLOAT4E2M1
    for graph in ("draft_context", "draft_block"):
        model = onnx.load(str(bundle / f"{graph}.onnx"), load_external_data=False)
        floats = {i.name for i in model.graph.initializer if i.data_type == onnx.TensorProto.FLOAT}
        assert not [n for n in model.graph.node if n.op_type == "MatMul" and n.input[1] in floats]
        assert any(i.data_type == codes for i in model.graph.initializer)
    assert (bundle / "target.onnx.data").read_bytes() == (made[None] / "target.onnx.data").read_bytes()
    assert json.loads((bundle / "bundle.json").read_text())["draft_quant"]["weights"] == quant
    if quant == "fp8":
        assert greedy_dflash_equals_plain(core, ort, bundle) == greedy_dflash_equals_plain(core, ort, made[None])
    else:
        with pytest.raises(DFlashError, match="its drafter weights are NVFP4, which onnxruntime cannot run"):
            ort.ort_executor(bundle, max_batch=1, capacity=64)
    with pytest.raises(DFlashError, match="written for float32 --flavour slots-trt exports, not a float32 slots one"):
        export_bundle(target, load_drafter(draft_dir), tokenizer, tmp_path / "s", flavour="slots", check=False,
                      draft_quant=quant)


@pytest.mark.parametrize("quant", ["int4", *FORMATS])
def test_the_torch_backend_runs_the_exported_quantized_target(bundles, quant):
    """LLM(backend="torch", quant=...): every target linear dequantizes to exactly the weights the
    slots-trt bundle's DequantizeLinear chains give (the model TensorRT would run), greedy DFlash equals
    the quantized target's own greedy decoding and not the float target's, and where onnxruntime runs
    the bundle (int4, fp8) it decodes the same tokens."""
    from dflash_trt import LLM, SamplingParams
    from dflash_trt.runtime.weight_only import WeightOnlyLinear

    made, target_dir, draft_dir = bundles
    llm = LLM(str(target_dir), str(draft_dir), backend="torch", quant=quant, block_size=4)
    linears = [m for m in llm.target.model.modules() if isinstance(m, WeightOnlyLinear)]
    graph = matmul_weights(made[quant] / "target.onnx")  # [K, N] per MatMul
    assert len(linears) == len(graph) == 29
    with torch.no_grad():
        assert sorted(m.dequantized().numpy().tobytes() for m in linears) == \
            sorted(np.ascontiguousarray(v.T).tobytes() for v in graph)
    assert not isinstance(llm.draft_head.proj, WeightOnlyLinear)  # the drafter drafts through the float head
    prompts = [p for _, p, _ in WORK]
    params = SamplingParams(max_tokens=12, ignore_eos=True)
    tokens = [o.token_ids for o in llm.generate(prompts, params)]
    assert tokens == [o.token_ids for o in llm.generate(prompts, params, speculative=False)]
    float_llm = LLM(str(target_dir), str(draft_dir), backend="torch", block_size=4)
    assert tokens != [o.token_ids for o in float_llm.generate(prompts, params)]
    if quant != "nvfp4":  # onnxruntime has no float4 DequantizeLinear
        onnxruntime = LLM.from_bundle(made[quant], block_size=4, capacity=64)
        assert tokens == [o.token_ids for o in onnxruntime.generate(prompts, params)]


def test_the_torch_backend_refuses_a_format_it_does_not_run(bundles):
    from dflash_trt import LLM

    _, target_dir, draft_dir = bundles
    with pytest.raises(DFlashError, match="int4 or fp8 or nvfp4 on torch; got quant='int4-awq' on backend 'torch'"):
        LLM(str(target_dir), str(draft_dir), backend="torch", quant="int4-awq")


def test_the_torch_runtimes_quantizers_are_modelopts_bit_for_bit():
    """runtime/weight_only.py's fp8_weight / nvfp4_weight (ModelOpt's formulas in plain torch, for a GPU
    machine without ModelOpt) against ModelOpt itself (what the export calls): random rows over many
    magnitudes, an all-zero row and block, and values on every E2M1 rounding boundary."""
    from dflash_trt.export.float_formats import fp8_rows, nvfp4_rows
    from dflash_trt.runtime.weight_only import E2M1_BOUNDS, fp8_weight, nvfp4_weight

    gen = torch.Generator().manual_seed(0)
    rows = torch.randn(24, 64, generator=gen) * torch.logspace(-3, 2, 24)[:, None]
    rows[3] = 0.0
    rows[5, 16:32] = 0.0
    # amax 6 in the tensor and every block: each block's scale is 1, so the values meet the rounding
    # boundaries exactly (ties included)
    edges = (torch.tensor([*E2M1_BOUNDS, 6.0] * 8) * torch.tensor([1.0, -1.0]).repeat(32))[None]
    _, block_scales, tensor_scale = nvfp4_weight(edges)
    assert torch.equal(block_scales.float() * tensor_scale, torch.ones(1, 4))
    for weight in (rows, edges):
        codes, scales = fp8_weight(weight)
        theirs_codes, theirs_scales = fp8_rows(weight)
        assert torch.equal(codes.view(torch.uint8), theirs_codes.view(torch.uint8))
        assert torch.equal(scales, theirs_scales)
        mine, theirs = nvfp4_weight(weight), nvfp4_rows(weight)
        assert torch.equal(mine[0], theirs[0])
        assert torch.equal(mine[1].view(torch.uint8), theirs[1].view(torch.uint8))
        assert torch.equal(mine[2].reshape(()), theirs[2].reshape(()))

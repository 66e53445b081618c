"""The portable lowering of dflash::GatedDeltaRule (export/delta_rule_loop.py) against its reference,
delta_rule_scan (itself equal to HF's recurrent gated delta rule), on onnxruntime; and the lowered
graph is one TensorRT's ONNX parser takes (no sequence ops), built for SM120 where TensorRT-RTX is."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper
from transformers.models.qwen3_next.modeling_qwen3_next import torch_recurrent_gated_delta_rule

from dflash_trt.export.delta_rule import delta_rule_scan, delta_rule_scan_at
from dflash_trt.export.delta_rule_loop import lower_gated_delta_rule

NAMES = ["query", "key", "value", "g", "beta", "state", "states_from"]


@pytest.fixture(scope="module")
def lowered(tmp_path_factory):
    """One GatedDeltaRule node, lowered: its path."""
    f32 = TensorProto.FLOAT
    inputs = [helper.make_tensor_value_info(n, f32, [None] * rank) for n, rank in zip(NAMES, [4, 4, 4, 3, 3, 4])]
    inputs.append(helper.make_tensor_value_info("states_from", TensorProto.INT64, []))
    outputs = [helper.make_tensor_value_info("out", f32, [None] * 4), helper.make_tensor_value_info("states", f32, [None] * 5)]
    node = helper.make_node("GatedDeltaRule", NAMES, ["out", "states"], domain="dflash", name="layer0")
    model = helper.make_model(helper.make_graph([node], "g", inputs, outputs),
                              opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("dflash", 1)])
    assert lower_gated_delta_rule(model, "dflash") == 1
    assert [o.domain for o in model.opset_import] == [""]  # the custom domain is gone with its node
    onnx.checker.check_model(model, full_check=True)
    path = tmp_path_factory.mktemp("lowered") / "delta_rule.onnx"
    onnx.save(model, str(path))
    return path


def random_inputs(b, s, heads_k, heads_v, dim, states_from, seed):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(b, s, heads_k, dim, generator=gen), torch.randn(b, s, heads_k, dim, generator=gen),
            torch.randn(b, s, heads_v, dim, generator=gen), -torch.rand(b, s, heads_v, generator=gen) * 2,
            torch.rand(b, s, heads_v, generator=gen), torch.randn(b, heads_v, dim, dim, generator=gen),
            torch.tensor(states_from))


@pytest.mark.parametrize("b, s, heads_k, heads_v, dim, states_from", [
    (1, 1, 2, 2, 4, 0), (2, 5, 2, 4, 8, 0), (1, 7, 1, 4, 8, 6), (3, 16, 2, 4, 16, 0), (2, 9, 2, 4, 16, 3)])
def test_the_lowered_loop_equals_the_reference_and_hf(lowered, b, s, heads_k, heads_v, dim, states_from):
    inputs = random_inputs(b, s, heads_k, heads_v, dim, states_from, seed=s)
    out, states = delta_rule_scan(*inputs)
    assert states.shape == (b, s - states_from, heads_v, dim, dim)
    hf_out, hf_state = torch_recurrent_gated_delta_rule(*inputs[:5], initial_state=inputs[5], output_final_state=True,
                                                        use_qk_l2norm_in_kernel=True)
    torch.testing.assert_close(out, hf_out, atol=1e-6, rtol=0)
    torch.testing.assert_close(states[:, -1], hf_state, atol=1e-6, rtol=0)
    session = ort.InferenceSession(str(lowered), providers=["CPUExecutionProvider"])
    got = session.run(None, dict(zip(NAMES, (t.numpy() for t in inputs), strict=True)))
    np.testing.assert_allclose(got[0], out.numpy(), atol=1e-5, rtol=0)
    np.testing.assert_allclose(got[1], states.numpy(), atol=1e-5, rtol=0)


def test_the_lowered_graph_holds_no_sequence_ops(lowered):
    model = onnx.load(str(lowered))
    loops = [n for n in model.graph.node if n.op_type == "Loop"]
    assert len(loops) == 1
    ops = {n.op_type for n in model.graph.node} | {n.op_type for n in loops[0].attribute[0].g.node}
    assert not {op for op in ops if "Sequence" in op} and "If" not in ops


def test_tensorrt_rtx_parses_and_builds_the_lowered_loop_for_sm120(lowered):
    trt = pytest.importorskip("tensorrt_rtx", reason="TensorRT-RTX is not installed (pip install tensorrt-rtx-cu13)")
    logger = trt.Logger(trt.Logger.ERROR)
    builder = trt.Builder(logger)
    network = builder.create_network(0)
    parser = trt.OnnxParser(network, logger)
    assert parser.parse_from_file(str(lowered)), [str(parser.get_error(i)) for i in range(parser.num_errors)]
    config = builder.create_builder_config()
    config.num_compute_capabilities = 1
    config.set_compute_capability(trt.ComputeCapability.SM120, 0)
    profile = builder.create_optimization_profile()
    for name, heads in (("query", 2), ("key", 2), ("value", 4)):
        profile.set_shape(name, (1, 1, heads, 16), (1, 4, heads, 16), (2, 16, heads, 16))
    for name in ("g", "beta"):
        profile.set_shape(name, (1, 1, 4), (1, 4, 4), (2, 16, 4))
    profile.set_shape("state", (1, 4, 16, 16), (1, 4, 16, 16), (2, 4, 16, 16))
    profile.set_shape_input("states_from", [0], [0], [15])  # a slice bound: a shape tensor, as logits_from
    config.add_optimization_profile(profile)
    engine = builder.build_serialized_network(network, config)
    assert engine is not None and engine.nbytes > 10_000


def test_the_positions_form_keeps_each_rows_chosen_states(tmp_path):
    """GatedDeltaRuleAt (contract 2's ragged rows): states after per-row positions, repeats included."""
    f32 = TensorProto.FLOAT
    names = NAMES[:-1] + ["positions"]
    inputs = [helper.make_tensor_value_info(n, f32, [None] * rank) for n, rank in zip(names, [4, 4, 4, 3, 3, 4])]
    inputs.append(helper.make_tensor_value_info("positions", TensorProto.INT64, [None, None]))
    outputs = [helper.make_tensor_value_info("out", f32, [None] * 4), helper.make_tensor_value_info("states", f32, [None] * 5)]
    node = helper.make_node("GatedDeltaRuleAt", names, ["out", "states"], domain="dflash", name="layer0")
    model = helper.make_model(helper.make_graph([node], "g", inputs, outputs),
                              opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("dflash", 1)])
    assert lower_gated_delta_rule(model, "dflash") == 1
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, str(tmp_path / "at.onnx"))
    session = ort.InferenceSession(str(tmp_path / "at.onnx"), providers=["CPUExecutionProvider"])
    *tensors, _ = random_inputs(3, 6, 2, 4, 8, 0, seed=4)
    positions = torch.tensor([[5, 0, 2], [1, 1, 1], [0, 3, 5]])
    out, states = delta_rule_scan_at(*tensors, positions)
    _, every = delta_rule_scan(*tensors, torch.tensor(0))
    # the reference keeps the scan's states at the positions asked for
    torch.testing.assert_close(states, every[torch.arange(3)[:, None], positions], rtol=0, atol=0)
    got = session.run(None, {**dict(zip(names, (t.numpy() for t in tensors))), "positions": positions.numpy()})
    np.testing.assert_allclose(got[0], out.numpy(), atol=1e-5, rtol=0)
    np.testing.assert_allclose(got[1], states.numpy(), atol=1e-5, rtol=0)

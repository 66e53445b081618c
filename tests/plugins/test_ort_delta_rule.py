"""dflash::GatedDeltaRule on onnxruntime (the C++ reference kernel) against delta_rule_scan: random
inputs, several shapes, the refusals, and a graph exported from the PyTorch twin."""

import io

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper

from dflash_trt.export import op_library
from dflash_trt.export.delta_rule import delta_rule_scan, gated_delta_rule, register_delta_rule_symbolic

if not op_library.LIBRARY.is_file():
    pytest.skip("dflash op library not built (bash scripts/build_plugins.sh)", allow_module_level=True)

ATOL = 1e-5  # float32, different summation order
INPUTS = ["query", "key", "value", "g", "beta", "initial_state", "states_from"]


def session(model: onnx.ModelProto):
    import onnxruntime as ort

    return ort.InferenceSession(model.SerializeToString(), op_library.session_options(True),
                                providers=["CPUExecutionProvider"])


def run_node(feed: dict[str, np.ndarray], **attrs) -> list[np.ndarray]:
    def info(name):
        return helper.make_tensor_value_info(name, TensorProto.INT64 if name == "states_from" else TensorProto.FLOAT,
                                             None)

    node = helper.make_node("GatedDeltaRule", INPUTS, ["out", "states"], domain="dflash", **attrs)
    graph = helper.make_graph([node], "gated_delta_rule", [info(n) for n in INPUTS], [info("out"), info("states")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("dflash", 1)],
                              ir_version=9)
    return session(model).run(None, feed)


def random_inputs(b, s, hk, hv, dk, dv, states_from, seed) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "query": torch.randn(b, s, hk, dk, generator=g),
        "key": torch.randn(b, s, hk, dk, generator=g),
        "value": torch.randn(b, s, hv, dv, generator=g),
        "g": -torch.nn.functional.softplus(torch.randn(b, s, hv, generator=g)),  # log decay < 0
        "beta": torch.sigmoid(torch.randn(b, s, hv, generator=g)),
        "initial_state": torch.randn(b, hv, dk, dv, generator=g) * 0.5,
        "states_from": torch.tensor(states_from, dtype=torch.int64),
    }


@pytest.mark.parametrize("b", [1, 3])
@pytest.mark.parametrize("hk, hv", [(2, 2), (2, 4)])  # Hv = Hk, and two value heads per key head
@pytest.mark.parametrize("s", [1, 4, 17])
@pytest.mark.parametrize("last_only", [False, True])  # states_from 0 (a verify) or s - 1 (a prefill)
def test_the_onnxruntime_op_matches_delta_rule_scan(b, hk, hv, s, last_only):
    states_from = s - 1 if last_only else 0
    feed = random_inputs(b, s, hk, hv, 8, 6, states_from, seed=b * 1000 + s * 10 + hv)
    out_ref, states_ref = delta_rule_scan(*(feed[n] for n in INPUTS))
    out, states = run_node({n: t.numpy() for n, t in feed.items()})
    assert states.shape == (b, s - states_from, hv, 8, 6)
    np.testing.assert_allclose(out, out_ref.numpy(), atol=ATOL, rtol=1e-5)
    np.testing.assert_allclose(states, states_ref.numpy(), atol=ATOL, rtol=1e-5)


@pytest.mark.parametrize("dk, dv", [(12, 20), (64, 64)])  # value_dim a partial / whole number of kernel tiles
@pytest.mark.parametrize("s", [64, 65, 200])  # long sequences: round-off carried over many tokens
@pytest.mark.parametrize("kept", ["all", "middle", "last"])  # states_from 0, s // 3, s - 1
def test_long_sequences_match_from_any_states_from(dk, dv, s, kept):
    # The kernel fuses the four passes per token into one, with FMAs: float32 round-off against
    # the scan's order stays near 1e-7 here (g < 0 damps it), so ATOL 1e-5 is not loose.
    states_from = {"all": 0, "middle": s // 3, "last": s - 1}[kept]
    b, hk, hv = (2, 2, 4) if dk < 64 else (1, 1, 2)
    feed = random_inputs(b, s, hk, hv, dk, dv, states_from, seed=s * 100 + dk + states_from)
    out_ref, states_ref = delta_rule_scan(*(feed[n] for n in INPUTS))
    out, states = run_node({n: t.numpy() for n, t in feed.items()})
    assert states.shape == (b, s - states_from, hv, dk, dv)
    np.testing.assert_allclose(out, out_ref.numpy(), atol=ATOL, rtol=1e-5)
    np.testing.assert_allclose(states, states_ref.numpy(), atol=ATOL, rtol=1e-5)


def test_a_head_of_qwen3_next_size_matches():
    feed = random_inputs(1, 5, 1, 2, 128, 128, 2, seed=7)
    out_ref, states_ref = delta_rule_scan(*(feed[n] for n in INPUTS))
    out, states = run_node({n: t.numpy() for n, t in feed.items()})
    np.testing.assert_allclose(out, out_ref.numpy(), atol=ATOL, rtol=1e-5)
    np.testing.assert_allclose(states, states_ref.numpy(), atol=ATOL, rtol=1e-5)


def test_the_tensorrt_shape_input_attribute_is_ignored():
    # A node exported for TensorRT marks states_from as a shape input (plugins/gated_delta_rule/README.md).
    feed = {n: t.numpy() for n, t in random_inputs(2, 4, 1, 2, 8, 4, 1, seed=3).items()}
    plain = run_node(feed)
    marked = run_node(feed, tensorrt_plugin_shape_input_indices=[6])
    for a, b in zip(plain, marked):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("states_from", [-1, 4, 9])
def test_states_from_outside_the_sequence_is_refused(states_from):
    feed = {n: t.numpy() for n, t in random_inputs(1, 4, 1, 1, 4, 4, 0, seed=1).items()}
    feed["states_from"] = np.array(states_from, dtype=np.int64)
    with pytest.raises(Exception, match=r"states_from must be in \[0, tokens - 1\] = \[0, 3\], got " + str(states_from)):
        run_node(feed)


def test_value_heads_not_a_multiple_of_key_heads_are_refused():
    feed = {n: t.numpy() for n, t in random_inputs(1, 3, 2, 3, 4, 4, 0, seed=2).items()}
    with pytest.raises(Exception, match="value_heads must be a multiple of key_heads"):
        run_node(feed)


def test_a_graph_exported_from_the_twin_runs_the_op():
    class Layer(torch.nn.Module):
        def forward(self, query, key, value, g, beta, initial_state, states_from):
            return gated_delta_rule(query, key, value, g, beta, initial_state, states_from)

    feed = random_inputs(2, 6, 1, 2, 8, 4, 3, seed=5)
    register_delta_rule_symbolic(17)
    buffer = io.BytesIO()
    torch.onnx.export(Layer(), tuple(feed[n] for n in INPUTS), buffer, input_names=INPUTS,
                      output_names=["out", "states"], opset_version=17, dynamo=False, custom_opsets={"dflash": 1})
    model = onnx.load_from_string(buffer.getvalue())
    assert [n.op_type for n in model.graph.node if n.domain == "dflash"] == ["GatedDeltaRule"]
    out, states = session(model).run(None, {n: t.numpy() for n, t in feed.items()})
    out_ref, states_ref = delta_rule_scan(*(feed[n] for n in INPUTS))
    np.testing.assert_allclose(out, out_ref.numpy(), atol=ATOL, rtol=1e-5)
    np.testing.assert_allclose(states, states_ref.numpy(), atol=ATOL, rtol=1e-5)

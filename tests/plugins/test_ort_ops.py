"""The C++ dflash ops on onnxruntime against their PyTorch twins: random inputs, several shapes."""

import numpy as np
import pytest
import torch
from onnx import TensorProto, helper

from dflash_trt.export import op_library
from dflash_trt.export.plugin_ops import block_attention, inject_kv

if not op_library.LIBRARY.is_file():
    pytest.skip("dflash op library not built (bash scripts/build_plugins.sh)", allow_module_level=True)

ATOL = 2e-5  # float32, different summation order


def run_node(op: str, inputs: dict[str, np.ndarray], outputs: list[str], **attrs) -> list[np.ndarray]:
    import onnxruntime as ort

    def info(name, array):
        kind = TensorProto.INT64 if array.dtype == np.int64 else TensorProto.FLOAT
        return helper.make_tensor_value_info(name, kind, None)

    node = helper.make_node(op, list(inputs), outputs, domain="dflash", **attrs)
    graph = helper.make_graph([node], op, [info(n, a) for n, a in inputs.items()],
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in outputs])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("dflash", 1)],
                              ir_version=9)  # what torch.onnx writes at opset 17; onnxruntime reads it
    session = ort.InferenceSession(model.SerializeToString(), op_library.session_options(True),
                                   providers=["CPUExecutionProvider"])
    return session.run(None, inputs)


def rope_tables(b, n, d, generator):
    angles = torch.rand(b, n, d // 2, generator=generator) * 6.0
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos(), angles.sin()


@pytest.mark.parametrize("b, n, hidden, kv, d", [(1, 1, 16, 1, 8), (2, 5, 32, 2, 16), (3, 7, 24, 3, 4)])
def test_inject_kv_matches_its_pytorch_twin(b, n, hidden, kv, d):
    g = torch.Generator().manual_seed(b * 100 + n)
    x = torch.randn(b, n, hidden, generator=g)
    wk, wv = torch.randn(kv * d, hidden, generator=g), torch.randn(kv * d, hidden, generator=g)
    gamma = torch.rand(d, generator=g) + 0.5
    cos, sin = rope_tables(b, n, d, g)
    k_ref, v_ref = inject_kv(x, wk, wv, gamma, cos, sin, kv, 1e-6)
    feed = {"hidden": x, "k_weight": wk, "v_weight": wv, "k_norm": gamma, "cos": cos, "sin": sin}
    k, v = run_node("InjectKV", {n_: t.numpy() for n_, t in feed.items()}, ["k", "v"], num_kv_heads=kv, epsilon=1e-6)
    np.testing.assert_allclose(k, k_ref.numpy(), atol=ATOL, rtol=1e-5)
    np.testing.assert_allclose(v, v_ref.numpy(), atol=ATOL, rtol=1e-5)


@pytest.mark.parametrize("b, heads, kv, n, c, d, lengths, causal, window", [
    (1, 2, 1, 4, 6, 8, [6], 0, 0),          # plain non-causal block, GQA 2:1
    (2, 4, 2, 8, 9, 16, [9, 3], 0, 0),      # ragged context: row 1 must ignore slots 3..8
    (2, 3, 3, 5, 7, 4, [7, 0], 1, 0),       # causal layer; an empty context
    (2, 4, 1, 6, 10, 8, [10, 6], 0, 4),     # sliding window, both sides
    (1, 2, 2, 16, 20, 8, [17], 1, 5),       # causal + window, B=16
])
def test_block_attention_matches_its_pytorch_twin(b, heads, kv, n, c, d, lengths, causal, window):
    g = torch.Generator().manual_seed(heads * 10 + n)
    q = torch.randn(b, heads, n, d, generator=g)
    kc, vc = torch.randn(b, kv, c, d, generator=g), torch.randn(b, kv, c, d, generator=g)
    kb, vb = torch.randn(b, kv, n, d, generator=g), torch.randn(b, kv, n, d, generator=g)
    lens = torch.tensor(lengths)
    ref = block_attention(q, kc, vc, kb, vb, lens, d**-0.5, causal, window)
    feed = {"q": q, "k_context": kc, "v_context": vc, "k_block": kb, "v_block": vb, "context_lengths": lens}
    (out,) = run_node("BlockAttention", {k: t.numpy() for k, t in feed.items()}, ["out"],
                      scale=d**-0.5, causal=causal, window=window)
    np.testing.assert_allclose(out, ref.numpy(), atol=ATOL, rtol=1e-5)


def test_padding_beyond_the_context_length_has_no_effect():
    g = torch.Generator().manual_seed(3)
    q = torch.randn(1, 2, 4, 8, generator=g)
    kc, vc = torch.randn(1, 2, 6, 8, generator=g), torch.randn(1, 2, 6, 8, generator=g)
    kb, vb = torch.randn(1, 2, 4, 8, generator=g), torch.randn(1, 2, 4, 8, generator=g)
    feed = {"q": q, "k_context": kc, "v_context": vc, "k_block": kb, "v_block": vb, "context_lengths": torch.tensor([3])}
    args = {k: t.numpy() for k, t in feed.items()}
    (first,) = run_node("BlockAttention", args, ["out"], scale=0.35, causal=0, window=0)
    args["k_context"][:, :, 3:] = 1e4  # garbage in the padding
    (second,) = run_node("BlockAttention", args, ["out"], scale=0.35, causal=0, window=0)
    np.testing.assert_array_equal(first, second)


def test_bad_shapes_are_refused_by_the_op():
    with pytest.raises(Exception, match="k_weight and v_weight must be"):
        run_node("InjectKV", {"hidden": np.zeros((1, 2, 8), np.float32), "k_weight": np.zeros((4, 8), np.float32),
                              "v_weight": np.zeros((4, 8), np.float32), "k_norm": np.ones(2, np.float32),
                              "cos": np.ones((1, 2, 2), np.float32), "sin": np.zeros((1, 2, 2), np.float32)},
                 ["k", "v"], num_kv_heads=1, epsilon=1e-6)

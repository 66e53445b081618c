"""dflash::MoE on onnxruntime (the C++ reference kernel) against the PyTorch twin (moe_routing's routed
experts): random inputs at several token counts, expert counts and top-k, experts picked by many tokens
and by none, both routers, the tie rule, the refusals, and a graph exported from the twin."""

import io

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper

from dflash_trt.export import op_library
from dflash_trt.export.moe_ops import moe, register_moe_symbolic

if not op_library.LIBRARY.is_file():
    pytest.skip("dflash op library not built (bash scripts/build_plugins.sh)", allow_module_level=True)

INPUTS = ["hidden", "router_logits", "gate_up", "down"]


def session(model: onnx.ModelProto):
    import onnxruntime as ort

    return ort.InferenceSession(model.SerializeToString(), op_library.session_options(True),
                                providers=["CPUExecutionProvider"])


def run_node(feed: dict[str, np.ndarray], top_k: int, normalize: bool) -> np.ndarray:
    def info(name):
        return helper.make_tensor_value_info(name, TensorProto.FLOAT, None)

    node = helper.make_node("MoE", INPUTS, ["out"], domain="dflash", top_k=top_k, normalize=int(normalize))
    graph = helper.make_graph([node], "moe", [info(n) for n in INPUTS], [info("out")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("dflash", 1)],
                              ir_version=9)
    return session(model).run(None, feed)[0]


def random_inputs(tokens, hidden, experts, inter, seed, unused=0) -> dict[str, torch.Tensor]:
    """`unused`: the last experts' router logits pushed down so far that no token picks them."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(tokens, experts, generator=g) * 2
    if unused:
        logits[:, experts - unused:] -= 100
    return {
        "hidden": torch.randn(tokens, hidden, generator=g),
        "router_logits": logits,
        "gate_up": torch.randn(experts, 2 * inter, hidden, generator=g) / hidden**0.5,
        "down": torch.randn(experts, hidden, inter, generator=g) / inter**0.5,
    }


def by_hand(feed: dict[str, torch.Tensor], top_k: int, normalize: bool) -> np.ndarray:
    """The README's math written out per token, in float64, ties to the lowest index (a stable sort)."""
    x, logits, gate_up, down = (feed[n].double().numpy() for n in INPUTS)
    inter = down.shape[2]
    out = np.zeros_like(x)
    for t in range(x.shape[0]):
        p = np.exp(logits[t] - logits[t].max())
        p /= p.sum()
        picked = np.argsort(-p, kind="stable")[:top_k]
        weights = p[picked] / (p[picked].sum() if normalize else 1.0)
        for e, w in zip(picked, weights):
            projected = gate_up[e] @ x[t]
            gate, up = projected[:inter], projected[inter:]
            out[t] += w * (down[e] @ (gate / (1 + np.exp(-gate)) * up))
    return out


@pytest.mark.parametrize("tokens", [1, 4, 16, 200])
@pytest.mark.parametrize("experts, top_k, unused", [(8, 2, 0), (32, 4, 20), (6, 6, 0)])  # top_k = E: all of them
@pytest.mark.parametrize("normalize", [True, False])
def test_the_onnxruntime_op_matches_the_twin(tokens, experts, top_k, unused, normalize):
    feed = random_inputs(tokens, 24, experts, 20, seed=tokens * 100 + experts + top_k, unused=unused)
    want = moe(*(feed[n] for n in INPUTS), top_k, normalize)
    got = run_node({n: t.numpy() for n, t in feed.items()}, top_k, normalize)
    assert got.shape == (tokens, 24)
    np.testing.assert_allclose(got, want.numpy(), atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(got, by_hand(feed, top_k, normalize), atol=1e-5, rtol=1e-5)


def test_a_tie_at_the_kth_place_goes_to_the_lowest_expert():
    feed = random_inputs(2, 16, 5, 8, seed=3)
    feed["router_logits"] = torch.tensor([[0.1, 2.0, 2.0, 2.0, -1.0], [3.0, -2.0, 1.0, 1.0, 1.0]])
    got = run_node({n: t.numpy() for n, t in feed.items()}, 2, True)
    np.testing.assert_allclose(got, by_hand(feed, 2, True), atol=1e-5, rtol=1e-5)
    # and not to another expert of the same probability
    assert not np.allclose(got[0], by_hand({**feed, "router_logits": feed["router_logits"][:, [0, 1, 3, 2, 4]],
                                            "gate_up": feed["gate_up"][[0, 1, 3, 2, 4]],
                                            "down": feed["down"][[0, 1, 3, 2, 4]]}, 2, True)[0], atol=1e-3)


@pytest.mark.parametrize("change, message", [
    (dict(top_k=0), r"top_k must be in \[1, E\] = \[1, 4\], got 0"),
    (dict(top_k=5), r"top_k must be in \[1, E\] = \[1, 4\], got 5"),
    (dict(router_logits=np.zeros((3, 5), np.float32)), r"router_logits must be \[tokens, E\]"),
    (dict(down=np.zeros((4, 16, 7), np.float32)), r"down must be \[E, H, I\]"),
    (dict(gate_up=np.zeros((4, 15, 16), np.float32)), r"gate_up must be \[E, 2I, H\]"),
    (dict(gate_up=np.zeros((4, 16, 12), np.float32)), r"gate_up must be \[E, 2I, H\]"),
])
def test_shapes_and_top_k_that_disagree_are_refused(change, message):
    feed = {n: t.numpy() for n, t in random_inputs(3, 16, 4, 8, seed=1).items()}
    top_k = change.pop("top_k", 2)
    with pytest.raises(Exception, match=message):
        run_node({**feed, **change}, top_k, True)


def test_a_graph_exported_from_the_twin_runs_the_op():
    class Layer(torch.nn.Module):
        def forward(self, hidden, router_logits, gate_up, down):
            return moe(hidden, router_logits, gate_up, down, 3, False)

    feed = random_inputs(5, 16, 8, 12, seed=5)
    register_moe_symbolic(17)
    buffer = io.BytesIO()
    torch.onnx.export(Layer(), tuple(feed[n] for n in INPUTS), buffer, input_names=INPUTS, output_names=["out"],
                      opset_version=17, dynamo=False, custom_opsets={"dflash": 1})
    model = onnx.load_from_string(buffer.getvalue())
    [node] = [n for n in model.graph.node if n.domain == "dflash"]
    assert node.op_type == "MoE"
    assert {a.name: helper.get_attribute_value(a) for a in node.attribute} == {"top_k": 3, "normalize": 0}
    got = session(model).run(None, {n: t.numpy() for n, t in feed.items()})[0]
    np.testing.assert_allclose(got, by_hand(feed, 3, False), atol=1e-5, rtol=1e-5)

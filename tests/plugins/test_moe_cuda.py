"""`dflash::moe` on CUDA, our MoE kernel (runtime/cuda_ops.py), against the op's PyTorch body
(moe_routing.routed_experts with SiLU) on the same inputs, and inside a CUDA graph. Marked `gpu`;
skipped without a GPU or the plugin library. The kernel against its C++ reference at more shapes:
tests/plugins/cpp/kernel_parity.cpp."""

import pytest
import torch

from dflash_trt.export.moe_routing import routed_experts

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU that PyTorch sees"),
]


@pytest.fixture(scope="module", autouse=True)
def kernels():
    from dflash_trt.runtime.cuda_ops import LIBRARY, register_target_kernels

    if not LIBRARY.is_file():
        pytest.skip(f"{LIBRARY.name} not built (bash scripts/build_plugins.sh)")
    assert register_target_kernels()


def layer(tokens: int, hidden: int, experts: int, inter: int, dtype: torch.dtype, seed: int):
    """Random inputs of one routed layer, every projection O(1). Each token's logits are a permutation
    of 0, 0.25, 0.5, ...: exact in bfloat16 and never tied, so torch.topk (whose tie order is its own)
    and the kernel (the lowest index) route alike."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(tokens, hidden, device="cuda", generator=g)
    order = torch.rand(tokens, experts, device="cuda", generator=g).argsort(dim=-1)
    logits = order.float() * 0.25
    gate_up = torch.randn(experts, 2 * inter, hidden, device="cuda", generator=g) / hidden**0.5
    down = torch.randn(experts, hidden, inter, device="cuda", generator=g) / inter**0.5
    return [t.to(dtype) for t in (x, logits, gate_up, down)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("tokens", [1, 16, 200])
@pytest.mark.parametrize("normalize", [True, False])
@pytest.mark.parametrize("width", [(64, 16, 48, 4), (37, 12, 13, 3)], ids=["aligned", "odd-width"])
def test_the_moe_kernel_equals_the_ops_reference_body(dtype, tokens, normalize, width):
    """The body runs in float32 on the same (rounded) values: the gap is then the kernel's own, its
    bfloat16 activations and output, not also the body's bfloat16 matmuls."""
    hidden, experts, inter, top_k = width
    x, logits, gate_up, down = layer(tokens, hidden, experts, inter, dtype, seed=tokens)
    out = torch.ops.dflash.moe(x, logits, gate_up, down, top_k, normalize)
    want = routed_experts(x.float(), logits.float(), gate_up.float(), down.float(), torch.nn.functional.silu,
                          top_k, normalize)
    assert out.dtype == dtype and out.shape == x.shape
    tolerance = {"rtol": 1.6e-2, "atol": 1.6e-2} if dtype == torch.bfloat16 else {"rtol": 1e-4, "atol": 1e-4}
    torch.testing.assert_close(out.float(), want, **tolerance)


def test_the_moe_kernel_replays_in_a_cuda_graph_and_a_tokens_row_ignores_the_others():
    """No host sync (a capture would refuse it), and each token's output bit for bit what a call of its
    own gives: the kernel's sums have one order per expert and output element."""
    x, logits, gate_up, down = layer(16, 2048, 64, 512, torch.bfloat16, seed=3)
    eager = torch.ops.dflash.moe(x, logits, gate_up, down, 8, True)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.ops.dflash.moe(x, logits, gate_up, down, 8, True)  # warm-up outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = torch.ops.dflash.moe(x, logits, gate_up, down, 8, True)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, eager)
    for t in (0, 5, 15):
        alone = torch.ops.dflash.moe(x[t:t + 1], logits[t:t + 1], gate_up, down, 8, True)
        assert torch.equal(alone[0], eager[t])

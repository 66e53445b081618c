"""The plugin library's C entry points for the torch backend's custom ops (plugins/common/kernel_api.cpp)
through runtime/cuda_ops.py's ctypes bindings, on the calls that answer without a GPU: workspace sizes
and refusals, which fix the argument order the bindings declare. The kernels themselves run in
`pytest -m gpu` (tests/core/test_torch_graph_executor_gpu.py)."""

import ctypes

import pytest

from dflash_trt.runtime import cuda_ops

if not cuda_ops.LIBRARY.is_file():
    pytest.skip("TensorRT plugin library not built (bash scripts/build_plugins.sh; needs nvcc)",
                allow_module_level=True)


@pytest.fixture(scope="module")
def library():
    lib = ctypes.CDLL(str(cuda_ops.LIBRARY))
    cuda_ops._bind(lib)
    return lib


def test_workspace_sizes_follow_the_kernels_plans(library):
    # BlockAttention: min(64 splits x rows, 1024 blocks x 16 rows) x (d + 2) floats; rows = b x heads x n
    assert library.dflash_block_attention_workspace(1, 32, 8, 16, 4096, 128) == 16384 * 130 * 4
    assert library.dflash_block_attention_workspace(1, 2, 1, 3, 10, 8) == 64 * 6 * 10 * 4
    # InjectKV: min(rows per launch, splits x b x n) x 2 x kv x d floats
    assert library.dflash_inject_kv_workspace(0, 5, 64, 2, 16) == 0


def test_bad_calls_are_refused_in_one_line_before_any_launch(library):
    null = [None] * 6
    assert library.dflash_block_attention(1, 4, 2, 4, 8, 16, 7, *null, 1.0, 0, 0, None, None, None) == (
        b"dtype must be 0 (float32), 1 (float16) or 2 (bfloat16)")
    assert library.dflash_block_attention(1, 3, 2, 4, 8, 16, 0, *null, 1.0, 0, 0, None, None, None) == (
        b"heads must be a multiple of kv_heads >= 1")
    assert b"head_dim must be even" in library.dflash_inject_kv(1, 4, 64, 2, 15, 0, *null, 1e-6, None, None, None,
                                                                 None)


def test_the_gated_delta_rule_entry_refuses_before_any_launch(library):
    # (b, s, Hk, Hv, Dk, Dv, dtype, q, k, v, g, beta, state, states_from, out, states, stream)
    null = [None] * 6
    assert library.dflash_gated_delta_rule(1, 4, 2, 4, 8, 8, 3, *null, 0, None, None, None) == (
        b"dtype must be 0 (float32), 1 (float16) or 2 (bfloat16)")
    assert library.dflash_gated_delta_rule(1, 4, 2, 4, 8, 8, 0, *null, 4, None, None, None) == (
        b"states_from must be in [0, tokens - 1]")
    assert library.dflash_gated_delta_rule(1, 4, 2, 3, 8, 8, 0, *null, 0, None, None, None) == (
        b"value_heads must be a multiple of key_heads >= 1")
    assert library.dflash_gated_delta_rule(1, 4, 2, 4, 257, 8, 0, *null, 0, None, None, None) == (
        b"key_dim must be in [1, 256]")


def test_the_moe_entry_sizes_its_scratch_and_refuses_before_any_launch(library):
    # Qwen3.5-35B-A3B, a 16-token verify: per (token, slot) pair its expert, weight, activations [I] and
    # float32 partial [H]; per expert its count and pair list; each region 256-byte aligned.
    assert library.dflash_moe_workspace(16, 2048, 256, 512, 8) == (
        512 + 512 + 1024 + 1280 + 256 * 16 * 4 + 128 * 512 * 4 + 128 * 2048 * 4)
    # A long prefill runs 512 tokens a launch in the same scratch.
    qwen = (2048, 256, 512, 8)
    assert library.dflash_moe_workspace(4096, *qwen) == library.dflash_moe_workspace(512, *qwen)
    # (tokens, H, E, I, top_k, normalize, dtype, hidden, router_logits, gate_up, down, workspace, out, stream)
    null = [None] * 7
    assert library.dflash_moe(1, 8, 4, 4, 2, 1, 3, *null) == (
        b"dtype must be 0 (float32), 1 (float16) or 2 (bfloat16)")
    assert library.dflash_moe(1, 8, 4, 4, 2, 2, 0, *null) == b"normalize must be 0 or 1"
    assert library.dflash_moe(1, 8, 4, 4, 5, 1, 0, *null) == b"top_k must be in [1, experts]"
    assert library.dflash_moe(1, 8, 4, 4, 0, 1, 0, *null) == b"top_k must be in [1, experts]"
    assert library.dflash_moe(1, 8, 513, 4, 8, 1, 0, *null).startswith(b"experts must be in [1, 512]")
    assert library.dflash_moe(1, 8, 64, 4, 33, 1, 0, *null).startswith(b"top_k must be <= 32")
    assert library.dflash_moe(0, 8, 4, 4, 2, 1, 0, *null) is None  # no tokens: nothing to launch


def test_a_layer_past_the_moe_kernels_limits_is_found_before_decoding(library):
    """The torch backend asks, per routed layer, whether our MoE kernel runs its widths (a call of no
    tokens: the shape checked, nothing launched); Qwen3-Next's 512 experts top-10 and Qwen3.5-35B-A3B's
    widths run, more experts or picks than the kernel holds do not."""
    assert cuda_ops._moe_refusal(library, (512, 1024, 2048), 10) is None
    assert cuda_ops._moe_refusal(library, (256, 1024, 2048), 8) is None
    assert cuda_ops._moe_refusal(library, (1024, 1024, 2048), 8).startswith("experts must be in [1, 512]")
    assert cuda_ops._moe_refusal(library, (64, 64, 32), 33).startswith("top_k must be <= 32")

"""A routed MoE layer as one fused node: `dflash::onnxruntime_moe` traces as onnxruntime's
`com.microsoft::MoE` (the `slots` flavour), `dflash::moe` as our `dflash::MoE` (the `plugin` flavour;
plugins/moe/README.md), whose CUDA kernel the torch backend also runs on a GPU (runtime/cuda_ops.py).

Both Python bodies are the reference (moe_routing.routed_experts with SiLU). onnxruntime's MoE runs
SwiGLU experts; measured on onnxruntime 1.32 CPU against HF's formula (float32 and float16, large
activations included): `activation_type=swiglu` with `activation_alpha=1`,
`activation_beta=0` is silu(gate) * up with no clamp; the CPU kernel takes only the interleaved
layout (`swiglu_fusion=1`: rows gate_0, up_0, gate_1, ...), so the graph interleaves HF's
concatenated [gate; up] (a constant-folded transpose of the initializer); the router's softmax and
top-k run inside, renormalised where `normalize_routing_weights=1` (a bit-exact tie at the k-th
place goes to the highest expert index, where ONNX TopK takes the lowest). On a random 64-expert layer
(hidden 1024, experts 512 wide, top 2) it took 0.16 / 4.6 / 21 ms for 1 / 16 / 256 tokens where the
standard-op form takes 0.46 / 20 / 154 ms (scripts/moe_bench.py measures whole steps).
"""

from __future__ import annotations

import torch
from torch import Tensor

from dflash_trt.export.moe_routing import routed_experts
from dflash_trt.export.plugin_ops import DOMAIN
from dflash_trt.export.slot_ops import ORT_DOMAIN


@torch.library.custom_op("dflash::onnxruntime_moe", mutates_args=())
def onnxruntime_moe(x: Tensor, router_logits: Tensor, gate_up: Tensor, down: Tensor, top_k: int,
                    normalize: bool) -> Tensor:
    """x [T, H], router logits [T, E], gate_up [E, 2I, H] ([gate; up]), down [E, H, I] -> [T, H]."""
    return routed_experts(x, router_logits, gate_up, down, torch.nn.functional.silu, top_k, normalize)


@onnxruntime_moe.register_fake
def _(x, router_logits, gate_up, down, top_k, normalize):
    return torch.empty_like(x)


def _symbolic_onnxruntime_moe(g, x, router_logits, gate_up, down, top_k, normalize):
    from torch.onnx import symbolic_helper

    experts, two_i, hidden = symbolic_helper._get_tensor_sizes(gate_up)
    shape = g.op("Constant", value_t=torch.tensor([experts, 2, two_i // 2, hidden]))
    flat = g.op("Constant", value_t=torch.tensor([experts, two_i, hidden]))
    # [E, 2, I, H] -> [E, I, 2, H] -> [E, 2I, H]: gate and up rows interleaved
    interleaved = g.op("Reshape", g.op("Transpose", g.op("Reshape", gate_up, shape), perm_i=[0, 2, 1, 3]), flat)
    no_bias = symbolic_helper._optional_input_placeholder_tensor(g)
    out = g.op(f"{ORT_DOMAIN}::MoE", x, router_logits, interleaved, no_bias, down,
               k_i=symbolic_helper._maybe_get_const(top_k, "i"), activation_type_s="swiglu", swiglu_fusion_i=1,
               activation_alpha_f=1.0, activation_beta_f=0.0,
               normalize_routing_weights_i=int(symbolic_helper._maybe_get_const(normalize, "b")))
    out.setType(x.type())
    return out


@torch.library.custom_op("dflash::moe", mutates_args=())
def moe(x: Tensor, router_logits: Tensor, gate_up: Tensor, down: Tensor, top_k: int, normalize: bool) -> Tensor:
    """x [T, H], router logits [T, E], gate_up [E, 2I, H] ([gate; up]), down [E, H, I] -> [T, H]."""
    return routed_experts(x, router_logits, gate_up, down, torch.nn.functional.silu, top_k, normalize)


@moe.register_fake
def _(x, router_logits, gate_up, down, top_k, normalize):
    return torch.empty_like(x)


def _symbolic_moe(g, x, router_logits, gate_up, down, top_k, normalize):
    from torch.onnx import symbolic_helper

    out = g.op(f"{DOMAIN}::MoE", x, router_logits, gate_up, down, top_k_i=symbolic_helper._maybe_get_const(top_k, "i"),
               normalize_i=int(symbolic_helper._maybe_get_const(normalize, "b")))
    out.setType(x.type())
    return out


def register_moe_symbolic(opset: int) -> None:
    torch.onnx.register_custom_op_symbolic("dflash::onnxruntime_moe", _symbolic_onnxruntime_moe, opset)
    torch.onnx.register_custom_op_symbolic("dflash::moe", _symbolic_moe, opset)

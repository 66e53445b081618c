"""The `dflash` custom ops (plugin flavour): PyTorch reference twins and their ONNX symbolics.

Contracts: plugins/inject_kv/README.md and plugins/block_attention/README.md. The reference bodies
here are the math the C++ kernels must reproduce; tracing for export records one `dflash::` node
per call instead of their standard-op expansion.
"""

from __future__ import annotations

import torch
from torch import Tensor
from transformers.models.qwen3.modeling_qwen3 import rotate_half

DOMAIN = "dflash"
OP_VERSION = 1


@torch.library.custom_op("dflash::inject_kv", mutates_args=())
def inject_kv(hidden: Tensor, k_weight: Tensor, v_weight: Tensor, k_norm_weight: Tensor, cos: Tensor, sin: Tensor,
              num_kv_heads: int, eps: float) -> tuple[Tensor, Tensor]:
    """hidden [b, n, H] -> K [b, kv, n, d] (projected, RMS-normed per head, RoPE) and V [b, kv, n, d]."""
    b, n, _ = hidden.shape
    d = cos.shape[-1]
    k = (hidden @ k_weight.T).view(b, n, num_kv_heads, d)
    variance = k.float().pow(2).mean(-1, keepdim=True)
    k = (k.float() * torch.rsqrt(variance + eps)).to(hidden.dtype) * k_norm_weight
    k = k.transpose(1, 2)
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    k = k * cos + rotate_half(k) * sin
    v = (hidden @ v_weight.T).view(b, n, num_kv_heads, d).transpose(1, 2)
    return k.contiguous(), v.contiguous()


@inject_kv.register_fake
def _(hidden, k_weight, v_weight, k_norm_weight, cos, sin, num_kv_heads, eps):
    b, n, _ = hidden.shape
    shape = (b, num_kv_heads, n, cos.shape[-1])
    return hidden.new_empty(shape), hidden.new_empty(shape)


@torch.library.custom_op("dflash::block_attention", mutates_args=())
def block_attention(q: Tensor, k_context: Tensor, v_context: Tensor, k_block: Tensor, v_block: Tensor,
                    context_lengths: Tensor, scale: float, causal: int, window: int) -> Tensor:
    """Block queries over the valid context and the whole block -> [b, heads, n, d].

    Positions: context slot j is position j (valid when j < context_lengths[b]); block slot i is
    position context_lengths[b] + i. `causal` keeps keys at positions <= the query's; `window` > 0
    keeps keys less than `window` positions away (both sides unless causal).
    """
    b, heads, n, _ = q.shape
    c = k_context.shape[2]
    lengths = context_lengths[:, None]
    q_pos = lengths + torch.arange(n)[None]  # [b, n]
    context_index = torch.arange(c)[None].expand(b, c)
    k_pos = torch.cat([context_index, q_pos], dim=1)  # [b, c + n]
    valid = torch.cat([context_index < lengths, torch.ones(b, n, dtype=torch.bool)], dim=1)
    diff = q_pos[:, :, None] - k_pos[:, None, :]
    visible = valid[:, None, :].expand(b, n, c + n)
    if causal:
        visible = visible & (diff >= 0)
    if window > 0:
        visible = visible & (diff < window)
        if not causal:
            visible = visible & (-diff < window)
    groups = heads // k_block.shape[1]
    k = torch.cat([k_context, k_block], dim=2).repeat_interleave(groups, dim=1)
    v = torch.cat([v_context, v_block], dim=2).repeat_interleave(groups, dim=1)
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=visible[:, None], scale=scale)


@block_attention.register_fake
def _(q, k_context, v_context, k_block, v_block, context_lengths, scale, causal, window):
    return torch.empty_like(q)


def _symbolic_inject_kv(g, hidden, k_weight, v_weight, k_norm_weight, cos, sin, num_kv_heads, eps):
    from torch.onnx import symbolic_helper

    k, v = g.op(f"{DOMAIN}::InjectKV", hidden, k_weight, v_weight, k_norm_weight, cos, sin,
                num_kv_heads_i=symbolic_helper._maybe_get_const(num_kv_heads, "i"),
                epsilon_f=symbolic_helper._maybe_get_const(eps, "f"), outputs=2)
    k.setType(hidden.type().with_sizes(None))
    v.setType(hidden.type().with_sizes(None))
    return k, v


def _symbolic_block_attention(g, q, k_context, v_context, k_block, v_block, context_lengths, scale, causal, window):
    from torch.onnx import symbolic_helper

    out = g.op(f"{DOMAIN}::BlockAttention", q, k_context, v_context, k_block, v_block, context_lengths,
               scale_f=symbolic_helper._maybe_get_const(scale, "f"),
               causal_i=symbolic_helper._maybe_get_const(causal, "i"),
               window_i=symbolic_helper._maybe_get_const(window, "i"))
    out.setType(q.type())
    return out


def register_symbolics(opset: int) -> None:
    torch.onnx.register_custom_op_symbolic("dflash::inject_kv", _symbolic_inject_kv, opset)
    torch.onnx.register_custom_op_symbolic("dflash::block_attention", _symbolic_block_attention, opset)

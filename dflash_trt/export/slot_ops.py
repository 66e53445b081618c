"""dflash::slot_attention: causal attention that writes the new K/V into fixed-capacity slot caches in place.

Graph contract 2 (docs/design/contract-v2.md §2(a), §4). The Python body is the reference: a
functional copy of each cache with row b's valid new K/V at [cache_lengths[b], cache_lengths[b] +
query_lengths[b]), and every valid query row j attending cache[:cache_lengths[b] + j + 1] (and only
the last `window` of those when the layer slides). The ONNX symbolic emits one
`com.microsoft::GroupQueryAttention` node, whose past and present the runtime binds to the same
buffer: onnxruntime's CPU kernel then writes only the valid rows and copies nothing.

Measured on onnxruntime 1.32 CPU (float32 and float16): rows past query_lengths come out zero (so
the reference zeroes them too, and every output can be compared); `local_window_size = W` keeps the
W most recent keys, HF's `diff < W`; a row with query_lengths 0 leaves its cache untouched.
"""

from __future__ import annotations

import torch
from torch import Tensor

from dflash_trt.models.drafter import rotate_half

ORT_DOMAIN = "com.microsoft"
ORT_DOMAIN_VERSION = 1


@torch.library.custom_op("dflash::slot_attention", mutates_args=())
def slot_attention(query: Tensor, key: Tensor, value: Tensor, key_cache: Tensor, value_cache: Tensor,
                   cache_lengths: Tensor, query_lengths: Tensor, num_heads: int, kv_heads: int,
                   scale: float, window: int, rope_cos: Tensor | None = None, rope_sin: Tensor | None = None,
                   rope_positions: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """query [b, s, heads*d], key/value [b, s, kv*d] (Q and K after RoPE, or rotated here by the rope_*
    tables: `rope_tables`), caches [b, kv, C, d] -> attention [b, s, heads*d] (zero past
    query_lengths), key cache, value cache (new arrays)."""
    if rope_cos is not None:
        query = table_rope(query, rope_cos, rope_sin, rope_positions, num_heads)
        key = table_rope(key, rope_cos, rope_sin, rope_positions, kv_heads)
    b, s, _ = query.shape
    _, capacity, d = key_cache.shape[1:]
    start = cache_lengths[:, None]  # [b, 1]
    slot = torch.arange(capacity)[None]  # [1, C]
    written = (slot >= start) & (slot < start + query_lengths[:, None])  # [b, C]
    source = (slot - start).clamp(0, s - 1)[:, None, :, None].expand(b, kv_heads, capacity, d)
    caches = []
    for new, cache in ((key, key_cache), (value, value_cache)):
        new = new.view(b, s, kv_heads, d).transpose(1, 2).to(cache.dtype)
        caches.append(torch.where(written[:, None, :, None], new.gather(2, source), cache))
    positions = start + torch.arange(s)[None]  # [b, s]
    diff = positions[:, :, None] - slot[:, None, :]  # [b, s, C]
    visible = diff >= 0
    if window > 0:
        visible = visible & (diff < window)
    valid = torch.arange(s)[None] < query_lengths[:, None]  # [b, s]
    visible = visible & valid[:, :, None]
    q = query.view(b, s, num_heads, d).transpose(1, 2).float()
    groups = num_heads // kv_heads
    k, v = (c.float().repeat_interleave(groups, dim=1) for c in caches)
    scores = (q @ k.transpose(2, 3)) * scale
    scores = scores.masked_fill(~visible[:, None], float("-inf"))
    # Padding rows see no key: their softmax is NaN, replaced by the zeros GQA writes there.
    out = torch.nan_to_num(torch.softmax(scores, dim=-1) @ v, nan=0.0)
    out = torch.where(valid[:, None, :, None], out, 0.0)
    return out.transpose(1, 2).reshape(b, s, -1).to(query.dtype), caches[0], caches[1]


@slot_attention.register_fake
def _(query, key, value, key_cache, value_cache, cache_lengths, query_lengths, num_heads, kv_heads, scale, window,
      rope_cos=None, rope_sin=None, rope_positions=None):
    return torch.empty_like(query), torch.empty_like(key_cache), torch.empty_like(value_cache)


def rope_tables(cos: Tensor, sin: Tensor, capacity) -> tuple[Tensor, Tensor, Tensor]:
    """HF's cos / sin [b, s, d] at each query row's position (rotate-half RoPE: halves repeated) as
    GroupQueryAttention's `do_rotary` inputs: cos and sin tables [b*s + capacity, d/2] whose row b*s + j
    is query j of row b, and position_ids [b, s] pointing there. The rows are the exact values the
    unfused graph multiplies by (scaling included); the zero rows after them are there because GQA
    wants at least total_sequence_length (the capacity) rows and never reads them."""
    b, s, d = cos.shape
    pad = cos.new_zeros(capacity, d // 2, dtype=torch.float32).to(cos.dtype)  # ONNX makes no bfloat16 constants
    cos_table, sin_table = (torch.cat((t[..., : d // 2].reshape(b * s, d // 2), pad)) for t in (cos, sin))
    return cos_table, sin_table, torch.arange(b * s, device=cos.device).view(b, s)


def table_rope(x: Tensor, cos_table: Tensor, sin_table: Tensor, positions: Tensor, heads: int) -> Tensor:
    """x [b, s, heads*d] rotated as GroupQueryAttention's do_rotary (not interleaved) rotates it."""
    b, s, _ = x.shape
    d = 2 * cos_table.shape[-1]
    c, sn = (torch.cat((t, t), dim=-1)[positions][:, :, None] for t in (cos_table, sin_table))  # [b, s, 1, d]
    x = x.view(b, s, heads, d)
    return (x * c + rotate_half(x, d) * sn).reshape(b, s, -1)


def _symbolic_slot_attention(g, query, key, value, key_cache, value_cache, cache_lengths, query_lengths,
                             num_heads, kv_heads, scale, window, rope_cos=None, rope_sin=None, rope_positions=None):
    from torch.onnx import symbolic_helper
    from torch.onnx._internal.torchscript_exporter._type_utils import JitScalarType

    int32 = JitScalarType.INT.onnx_type()
    one = g.op("Constant", value_t=torch.tensor(1, dtype=torch.long))
    zero = g.op("Constant", value_t=torch.tensor(0, dtype=torch.long))
    # seqlens_k = tokens after the step - 1. GQA requires it >= 0: an idle row of an empty slot
    # (0 + 0 - 1) becomes 0, which with query_seqlens 0 still writes nothing.
    seqlens_k = g.op("Max", g.op("Sub", g.op("Add", cache_lengths, query_lengths), one), zero)
    # total_sequence_length: the longest row's tokens after the step. From the lengths alone, so every
    # layer's is the same node (onnxruntime merges them), where the capacity read from each layer's
    # cache took three nodes a layer.
    total = g.op("Add", g.op("ReduceMax", seqlens_k, keepdims_i=0), one)
    window = symbolic_helper._maybe_get_const(window, "i")
    attributes = {"num_heads_i": symbolic_helper._maybe_get_const(num_heads, "i"),
                  "kv_num_heads_i": symbolic_helper._maybe_get_const(kv_heads, "i"),
                  "scale_f": symbolic_helper._maybe_get_const(scale, "f")}
    if window > 0:
        attributes["local_window_size_i"] = window
    rope = [] if symbolic_helper._is_none(rope_cos) else [rope_cos, rope_sin, rope_positions]
    if rope:
        attributes.update(do_rotary_i=1, rotary_interleaved_i=0)
    unused = [symbolic_helper._optional_input_placeholder_tensor(g) for _ in range(9 - len(rope))]
    # Inputs: query key value past_key past_value seqlens_k total_sequence_length, then cos_cache
    # sin_cache position_ids (the rope tables, or unused: RoPE applied before), attention_bias head_sink
    # k_scale v_scale q_norm_weight k_norm_weight (unused: q/k norms are applied before), then
    # query_seqlens. causal stays its default 1, which query_seqlens requires.
    out, key_out, value_out = g.op(
        f"{ORT_DOMAIN}::GroupQueryAttention", query, key, value, key_cache, value_cache,
        g.op("Cast", seqlens_k, to_i=int32), g.op("Cast", total, to_i=int32), *rope, *unused,
        g.op("Cast", query_lengths, to_i=int32), outputs=3, **attributes)
    out.setType(query.type())
    key_out.setType(key_cache.type())
    value_out.setType(value_cache.type())
    return out, key_out, value_out


def register_slot_symbolics(opset: int) -> None:
    torch.onnx.register_custom_op_symbolic("dflash::slot_attention", _symbolic_slot_attention, opset)

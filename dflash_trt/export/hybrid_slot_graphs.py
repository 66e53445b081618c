"""The slots flavour (graph contract 2) of the hybrid families' target: ragged rows over slot buffers.

    inputs   input_ids [b, new], cache_lengths [b], query_lengths [b], logits_index [b, rows],
             cache_key_<i> / cache_value_<i> [b, kv_heads, capacity, head_dim] per full-attention
             layer i (written in place, as slot_graphs.py), then per linear-attention layer i:
             conv_state_<i> [b, conv_dim, K-1] and recurrent_state_<i> [b, Hv, Dk, Dv] (float32)
    outputs  logits [b, rows, V], features [b, new, taps*H], cache_key_out_<i> / cache_value_out_<i>,
             then per linear layer: conv_state_out_<i> [b, conv_dim, K-1] and recurrent_state_out_<i>
             [b, Hv, Dk, Dv] float32, the states after position logits_index[b, -1] of the row;
             conv_inputs_<i> [b, conv_dim, new], each position's conv input column; and
             delta_inputs_<i> [b, new, Hk*Dk + Hv*Dv + 2*Hv] float32, what each position's
             recurrence step reads (raw key, value, log decay g, write strength beta)

The states are read, never written in place. A prefill's last logits row is its last token, a
verify's last is its block's last (padding rows repeat it), so a prefill and a fully accepted block
copy the returned states into the row's slot; a commit that keeps part of a block rebuilds the states
at its last kept position from the slot's and the positions' inputs (csrc/state_rebuild.h), which
cost a few KiB a position where a state per position would cost the whole state. Rows are
right-padded: a padding token comes after every real one, so nothing at a real position sees it.
"""

from __future__ import annotations

import torch

from dflash_trt.export.graphs import in_tap_order
from dflash_trt.export.hybrid_graphs import (
    HybridTargetGraph,
    delta_input_width,
    gated_qk,
    layer_indices,
    linear_attention_at,
    linear_attention_shapes,
    text_rope,
)
from dflash_trt.export.slot_graphs import example_capacity, tapped
from dflash_trt.export.slot_ops import slot_attention


def hybrid_slot_target_spec(config, vocab: int, features: int, dtype: str, capacity: int | str = "capacity") -> dict:
    def io(name, type_, shape):
        return {"name": name, "dtype": type_, "shape": shape}

    cache = ["batch", config.num_key_value_heads, capacity, config.head_dim]
    attention, linear = layer_indices(config, "full_attention"), layer_indices(config, "linear_attention")
    shapes = linear_attention_shapes(config)
    conv = [shapes["conv_dim"], shapes["conv_kernel"] - 1]
    state = [shapes["num_value_heads"], shapes["key_head_dim"], shapes["value_head_dim"]]
    delta = delta_input_width(shapes)
    return {
        "inputs": [io("input_ids", "int64", ["batch", "new"]), io("cache_lengths", "int64", ["batch"]),
                   io("query_lengths", "int64", ["batch"]), io("logits_index", "int64", ["batch", "rows"])]
        + [io(f"cache_{kind}_{i}", dtype, cache) for i in attention for kind in ("key", "value")]
        + [x for i in linear for x in (io(f"conv_state_{i}", dtype, ["batch", *conv]),
                                       io(f"recurrent_state_{i}", "float32", ["batch", *state]))],
        "outputs": [io("logits", "float32", ["batch", "rows", vocab]), io("features", dtype, ["batch", "new", features])]
        + [io(f"cache_{kind}_out_{i}", dtype, cache) for i in attention for kind in ("key", "value")]
        + [x for i in linear for x in (io(f"conv_state_out_{i}", dtype, ["batch", *conv]),
                                       io(f"recurrent_state_out_{i}", "float32", ["batch", *state]),
                                       io(f"conv_inputs_{i}", dtype, ["batch", conv[0], "new"]),
                                       io(f"delta_inputs_{i}", "float32", ["batch", "new", delta]))],
    }


def gated_slot_attention(attn, h, cos, sin, key_cache, value_cache, cache_lengths, query_lengths,
                         attention=slot_attention):
    """hybrid_graphs.gated_attention over slot caches: the new K/V written at each row's offset."""
    b, s, _ = h.shape
    q, k, gate = gated_qk(attn, h, cos, sin)
    heads, kv_heads = q.shape[1], k.shape[1]
    out, key_cache, value_cache = attention(
        q.transpose(1, 2).reshape(b, s, -1), k.transpose(1, 2).reshape(b, s, -1), attn.v_proj(h), key_cache,
        value_cache, cache_lengths, query_lengths, heads, kv_heads, attn.scaling, 0)
    return attn.o_proj(out * gate), key_cache, value_cache


class HybridSlotTargetGraph(HybridTargetGraph):
    """HybridTargetGraph's layers (same weights, RoPE, norms, taps) over contract 2's slot buffers;
    `attend` as in SlotTargetGraph."""

    attend = staticmethod(slot_attention)

    def forward(self, input_ids: torch.Tensor, cache_lengths: torch.Tensor, query_lengths: torch.Tensor,
                logits_index: torch.Tensor, *caches: torch.Tensor):
        s = input_ids.shape[1]
        kv, states = self.by_layer(caches)
        x = self.model.embed_tokens(input_ids)
        positions = cache_lengths[:, None] + torch.arange(s, device=input_ids.device)[None]  # [b, s]
        cos, sin = text_rope(self.model.rotary_emb, x, positions)
        valid = (torch.arange(s, device=input_ids.device)[None] < query_lengths[:, None])[:, :, None]
        features, written, new_states = {}, [], []
        for index, layer in enumerate(self.model.layers):
            h = layer.input_layernorm(x)
            if index in kv:
                out, key_cache, value_cache = gated_slot_attention(layer.self_attn, h, cos, sin, *kv[index],
                                                                   cache_lengths, query_lengths, self.attend)
                written += [key_cache, value_cache]
            else:
                out, *outputs = linear_attention_at(layer.linear_attn, h, *states[index], logits_index[:, -1])
                new_states += outputs
            x = x + torch.where(valid, out, 0.0)
            x = x + self.mlps[index](layer.post_attention_layernorm(x))
            if index in self.taps:
                features[index] = self.model.norm(x) if index in self.normed_taps else x
        x = x.gather(1, logits_index[:, :, None].expand(-1, -1, x.shape[-1]))
        logits = self.lm_head(self.model.norm(x)).float()
        return (logits, tapped(in_tap_order(features, self.taps), valid), *written, *new_states)

    def example_inputs(self, spec: dict, vocab_size: int) -> tuple[torch.Tensor, ...]:
        """Ragged rows for the export trace and check, as slot_graphs.slot_example_inputs: 3 rows with
        5, 0 and 9 tokens committed by the graph's own prefill (states included; the empty row's are
        zero, a fresh slot's), cache rows past each length hold large garbage, and 4, 2 and 1 of 4 new
        tokens valid."""
        generator = torch.Generator().manual_seed(0)
        batch, new, capacity = 3, 4, example_capacity(spec)
        cached = torch.tensor([5, 0, 9])
        dtype = getattr(torch, spec["inputs"][4]["dtype"])
        cache_shapes = [[batch if d == "batch" else capacity if d == "capacity" else d for d in io["shape"]]
                        for io in spec["inputs"][4:]]
        zeros = [torch.zeros(shape, dtype=getattr(torch, io["dtype"]))
                 for shape, io in zip(cache_shapes, spec["inputs"][4:], strict=True)]
        prefix = torch.randint(0, vocab_size, (batch, int(cached.max())), generator=generator)
        last = (cached - 1).clamp(min=0)[:, None]
        with torch.no_grad():
            _, _, *out = self(prefix, torch.zeros(batch, dtype=torch.long), cached, last, *zeros)
        kv_count = 2 * len(self.attention)
        slot = torch.arange(capacity)
        kv = [torch.where((slot >= cached[:, None])[:, None, :, None], torch.tensor(1e3, dtype=dtype), c)
              for c in out[:kv_count]]
        fresh = (cached == 0)
        outs = out[kv_count:]
        states = [torch.where(fresh.view(-1, *[1] * (t.dim() - 1)), 0.0, t).to(t.dtype)
                  for n in range(0, len(outs), 4) for t in outs[n:n + 2]]
        ids = torch.randint(0, vocab_size, (batch, new), generator=generator)
        logits_index = torch.tensor([[3, 0], [1, 0], [0, 0]])
        return (ids, cached, torch.tensor([4, 2, 1]), logits_index, *kv, *states)

"""The `slots` flavour's target graph (graph contract 2): fixed-capacity caches written in place.

    target.onnx  input_ids [b, new], cache_lengths [b], query_lengths [b], logits_index [b, rows],
                 cache_key_i / cache_value_i [b, kv_heads, capacity, head_dim] per layer
                 -> logits [b, rows, V] (float32), features [b, new, taps*H],
                    cache_key_out_i / cache_value_out_i (the runtime binds each to its input's buffer)

Row b's query j is at position cache_lengths[b] + j; rows j >= query_lengths[b] are right padding:
their K/V are not written, their features are zero (so a padding row can never put NaN or inf into
a draft context buffer) and their logits mean nothing. Rolling back is lowering cache_lengths:
nothing is copied. An idle row has query_lengths 0. The draft graphs are the
portable ones: the runtime keeps their context in slot buffers and masks them by context_lengths.
"""

from __future__ import annotations

import torch
from torch import nn

from dflash_trt.export.graphs import TargetGraph, _layer_window, in_tap_order, project_qkv, project_qkv_packed
from dflash_trt.export.slot_ops import rope_tables, slot_attention

CONTRACT = 2


def slot_kv_names(layers: int, suffix: str = "") -> list[str]:
    return [f"cache_{kind}{suffix}_{i}" for i in range(layers) for kind in ("key", "value")]


def slot_target_spec(layers: int, kv_heads: int, head_dim: int, vocab: int, features: int, dtype: str,
                     capacity: int | str = "capacity") -> dict:
    """Contract 2's target I/O; `capacity` is a number where the flavour makes it static (slots-trt)."""

    def io(name, type_, shape):
        return {"name": name, "dtype": type_, "shape": shape}

    cache = ["batch", kv_heads, capacity, head_dim]
    return {
        "inputs": [io("input_ids", "int64", ["batch", "new"]), io("cache_lengths", "int64", ["batch"]),
                   io("query_lengths", "int64", ["batch"]), io("logits_index", "int64", ["batch", "rows"])]
        + [io(n, dtype, cache) for n in slot_kv_names(layers)],
        "outputs": [io("logits", "float32", ["batch", "rows", vocab]), io("features", dtype, ["batch", "new", features])]
        + [io(n, dtype, cache) for n in slot_kv_names(layers, "_out")],
    }


class SlotTargetGraph(TargetGraph):
    """TargetGraph's layers (same weights, RoPE, q/k norms, taps) with slot attention. `attend` is
    dflash::slot_attention, what the exporters lower; the torch runtime sets its in-place twin."""

    attend = staticmethod(slot_attention)
    # The slots flavour hands RoPE to GroupQueryAttention (do_rotary, from per-token tables): about 20
    # fewer small nodes a layer, which onnxruntime runs one by one. Where the rotary covers the whole
    # head only (a partial rotary keeps its own nodes).
    rope_in_attention = False

    def forward(self, input_ids: torch.Tensor, cache_lengths: torch.Tensor, query_lengths: torch.Tensor,
                logits_index: torch.Tensor, *caches: torch.Tensor):
        s = input_ids.shape[1]
        x = self.model.embed_tokens(input_ids)
        positions = cache_lengths[:, None] + torch.arange(s, device=input_ids.device)[None]  # [b, s]
        cos, sin = self.model.rotary_emb(x, positions)
        fused = self.rope_in_attention and cos.shape[-1] == self.model.layers[0].self_attn.head_dim
        rope = rope_tables(cos, sin, caches[0].shape[2]) if fused else ()
        # onnxruntime leaves GQA's padding rows unspecified (arena memory: any bits, NaN included), and
        # a padding row that attends nothing can grow past float16 in models with massive activations.
        valid = (torch.arange(s, device=input_ids.device)[None] < query_lengths[:, None])[:, :, None]
        features, written = {}, []
        for index, layer in enumerate(self.model.layers):
            x, kv = self._slot_layer(layer, self.mlps[index], x, cos, sin, caches[2 * index], caches[2 * index + 1],
                                     cache_lengths, query_lengths, valid, _layer_window(self.config, index) or 0, rope)
            written += kv
            if index in self.taps:
                features[index] = self.model.norm(x) if index in self.normed_taps else x
        # Only the asked rows reach the LM head (the largest matmul): [q-1] for a prefill, all for a verify.
        x = x.gather(1, logits_index[:, :, None].expand(-1, -1, x.shape[-1]))
        logits = self.lm_head(self.model.norm(x)).float()
        return (logits, tapped(in_tap_order(features, self.taps), valid), *written)

    def _slot_layer(self, layer, mlp, x, cos, sin, key_cache, value_cache, cache_lengths, query_lengths, valid, window,
                    rope=()):
        attn = layer.self_attn
        b, s, _ = x.shape
        if rope:  # rotated inside the attention, from the tables
            q, k, v = project_qkv_packed(layer, x)
        else:
            q, k, v = project_qkv(layer, x, cos, sin)
            q, k = q.transpose(1, 2).reshape(b, s, -1), k.transpose(1, 2).reshape(b, s, -1)
        heads, kv_heads = q.shape[-1] // attn.head_dim, k.shape[-1] // attn.head_dim
        out, key_cache, value_cache = self.attend(q, k, v, key_cache, value_cache, cache_lengths, query_lengths,
                                                  heads, kv_heads, attn.scaling, window, *rope)
        x = x + attn.o_proj(torch.where(valid, out, 0.0))
        x = x + mlp(layer.post_attention_layernorm(x))
        return x, (key_cache, value_cache)


def tapped(features: list[torch.Tensor], valid: torch.Tensor) -> torch.Tensor:
    """The tapped layers' hidden states side by side, zero at padding rows; [b, s, 0] when nothing is
    tapped (the torch runtime's target without a drafter: exports always tap)."""
    if not features:
        return valid.new_zeros(*valid.shape[:2], 0, dtype=torch.float32)
    return torch.where(valid, torch.cat(features, dim=-1), 0.0)


def example_capacity(spec: dict) -> int:
    """The traced caches' capacity: the spec's where it is static (slots-trt), else 16."""
    capacity = spec["inputs"][4]["shape"][2]
    return capacity if isinstance(capacity, int) else 16


def slot_example_inputs(module: nn.Module, spec: dict, vocab_size: int) -> tuple[torch.Tensor, ...]:
    """Ragged rows for the export trace and the onnxruntime check: 3 rows with 5, 0 and 9 tokens
    cached and 4, 2 and 1 of 4 new tokens valid; cache rows past each length hold large garbage,
    which only a wrong graph would read. The committed rows are the graph's own prefill: random K/V
    put queries where no real cache does (see bundle._own_cache). Capacity 16, or the static one."""
    generator = torch.Generator().manual_seed(0)
    batch, new, capacity = 3, 4, example_capacity(spec)
    cached = torch.tensor([5, 0, 9])
    dtype = getattr(torch, spec["inputs"][4]["dtype"])
    kv_heads, head_dim = spec["inputs"][4]["shape"][1], spec["inputs"][4]["shape"][3]
    caches = [torch.zeros(batch, kv_heads, capacity, head_dim, dtype=dtype) for _ in spec["inputs"][4:]]
    prefix = torch.randint(0, vocab_size, (batch, int(cached.max())), generator=generator)
    with torch.no_grad():
        _, _, *caches = module(prefix, torch.zeros(batch, dtype=torch.long), cached,
                               (cached - 1).clamp(min=0)[:, None], *caches)
    slot = torch.arange(capacity)
    caches = [torch.where((slot >= cached[:, None])[:, None, :, None], torch.tensor(1e3, dtype=dtype), c)
              for c in caches]
    ids = torch.randint(0, vocab_size, (batch, new), generator=generator)
    # rows (2) differs from new (4) and batch (3): the trace cannot confuse the axes
    logits_index = torch.tensor([[3, 0], [1, 0], [0, 0]])
    return (ids, cached, torch.tensor([4, 2, 1]), logits_index, *caches)

"""Plugin-flavour draft graphs: same I/O as graphs.py, with KV injection and block attention as `dflash` ops.

The target graph is the same in both flavours (a standard decoder); what is DFlash-specific — the
per-layer context K/V from target features and the non-causal block pass over them — becomes one
custom node per layer, which a TensorRT plugin or the onnxruntime op library implements.
"""

from __future__ import annotations

import torch
from torch import nn

from dflash_trt.errors import DFlashError
from dflash_trt.export.graphs import block_outputs
from dflash_trt.export.plugin_ops import block_attention, inject_kv
from dflash_trt.models.drafter import DFlashDrafter, apply_rope
from dflash_trt.models.target import TargetModel


def check_plugin_drafter(drafter: DFlashDrafter) -> None:
    if drafter.config.arch.attention_bias:
        raise DFlashError("plugin flavour: dflash::InjectKV v1 has no projection bias; export with --flavour portable")


def _inject(attn, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    return inject_kv(hidden, attn.k_proj.weight, attn.v_proj.weight, attn.k_norm.weight, cos, sin,
                     attn.kv_heads, attn.k_norm.variance_epsilon)


class PluginDraftContextGraph(nn.Module):
    def __init__(self, drafter: DFlashDrafter):
        super().__init__()
        check_plugin_drafter(drafter)
        self.drafter = drafter

    def forward(self, features: torch.Tensor, positions: torch.Tensor):
        context = self.drafter.hidden_norm(self.drafter.fc(features))
        cos, sin = self.drafter.rope(positions, context)
        return tuple(t for layer in self.drafter.layers for t in _inject(layer.self_attn, context, cos, sin))


class PluginDraftBlockGraph(nn.Module):
    keep_logits = False  # as DraftBlockGraph's
    export_logits = False

    def __init__(self, drafter: DFlashDrafter, target: TargetModel, head: nn.Module | None = None):
        super().__init__()
        check_plugin_drafter(drafter)
        self.drafter = drafter
        self.embed_tokens = target.model.get_input_embeddings()
        self.head = head if head is not None else drafter.head(target.lm_head)  # as DraftBlockGraph's

    def forward(self, block_ids: torch.Tensor, context_lengths: torch.Tensor, *context: torch.Tensor):
        d = self.drafter
        b, n = block_ids.shape
        positions = context_lengths[:, None] + torch.arange(n, device=block_ids.device)[None]
        x = nn.functional.embedding(block_ids, self.embed_tokens.weight) * d.config.input_embedding_scale
        cos, sin = d.rope(positions, x)
        for index, layer in enumerate(d.layers):
            attn = layer.self_attn

            def attend(h, attn=attn, index=index):
                q = attn.q_norm(attn.q_proj(h).view(b, n, attn.heads, attn.head_dim)).transpose(1, 2)
                q = apply_rope(q, cos, sin, attn.head_dim)
                k_block, v_block = _inject(attn, h, cos, sin)  # the block's own K/V: same math as injection
                out = block_attention(q, context[2 * index], context[2 * index + 1], k_block, v_block,
                                      context_lengths, attn.head_dim**-0.5, int(d.config.layer_is_causal(index)),
                                      d.config.layer_window(index) or 0)
                return attn.o_proj(out.transpose(1, 2).reshape(b, n, -1))

            # DFlash2's in-block convolutions wrap each sublayer in standard ops (models/dflash2.py)
            h = layer.input_layernorm(x)
            x = x + (layer.attention_conv.around(attend, h) if hasattr(layer, "attention_conv") else attend(h))
            m = layer.post_attention_layernorm(x)
            x = x + (layer.mlp_conv.around(layer.mlp, m) if hasattr(layer, "mlp_conv") else layer.mlp(m))
        return block_outputs(self, d.norm(x)[:, 1:], block_ids[:, 0])  # slot 0 is the bonus: the selector's anchor

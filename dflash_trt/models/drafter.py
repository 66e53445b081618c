"""DFlashDrafter: the block-diffusion drafter in PyTorch (Qwen3-style layers with KV injection).

The forward pass is split the way engines split it (research/dflash.md §1.8):

    inject_context(features, positions)  -> per-layer context K/V   (fc -> hidden_norm -> k/v proj)
    block_hidden(block_embeds, ...)      -> normed block hidden     (B queries over context + block)
    head(lm_head)(hidden, anchor)        -> draft logits and tokens (DFlash2: its selector's path)

Context features enter every layer only as keys and values; they never pass through the draft
MLPs or norms, so their K/V are computed once per committed token and cached.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F
from transformers.models.qwen3.modeling_qwen3 import Qwen3MLP, Qwen3RMSNorm, Qwen3RotaryEmbedding

from dflash_trt.models.dflash2 import CandidateSelector, GroupedDynamicConv
from dflash_trt.models.draft_config import DraftConfig
from dflash_trt.models.draft_vocab import DraftHead

LayerKV = tuple[torch.Tensor, torch.Tensor]  # K, V: [batch, kv_heads, tokens, head_dim], K post-RoPE


def rotate_half(x: torch.Tensor, d: int) -> torch.Tensor:
    """HF's rotate_half with the halves' size a constant: exported as two Slices, not the Shape /
    Gather / Div chain that x.shape[-1] // 2 costs in every layer's graph."""
    return torch.cat((-x[..., d // 2 :], x[..., : d // 2]), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, d: int) -> torch.Tensor:
    # x: [b, heads, n, d]; cos/sin: [b, n, d]
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    return x * cos + rotate_half(x, d) * sin


def layer_mask(
    q_pos: torch.Tensor, k_pos: torch.Tensor, causal: bool, window: int | None
) -> torch.Tensor | None:
    """Visibility [b, 1, q, k] for one layer, or None when every key is visible.

    Same rule as the reference: causal layers see keys at positions <= their own; windowed
    layers see keys less than `window` positions away (both sides when non-causal).
    """
    if not causal and window is None:
        return None
    diff = q_pos[:, :, None] - k_pos[:, None, :]  # [b, q, k]
    visible = torch.ones_like(diff, dtype=torch.bool)
    if causal:
        visible &= diff >= 0
    if window is not None:
        visible &= diff < window
        if not causal:
            visible &= -diff < window
    return visible[:, None]


class DraftAttention(nn.Module):
    def __init__(self, config: DraftConfig):
        super().__init__()
        arch = config.arch
        self.heads = arch.num_attention_heads
        self.kv_heads = arch.num_key_value_heads
        self.head_dim = arch.head_dim or arch.hidden_size // arch.num_attention_heads
        bias = arch.attention_bias
        self.q_proj = nn.Linear(arch.hidden_size, self.heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(arch.hidden_size, self.kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(arch.hidden_size, self.kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.heads * self.head_dim, arch.hidden_size, bias=bias)
        self.q_norm = Qwen3RMSNorm(self.head_dim, eps=arch.rms_norm_eps)
        self.k_norm = Qwen3RMSNorm(self.head_dim, eps=arch.rms_norm_eps)

    def _kv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> LayerKV:
        b, n, _ = x.shape
        k = self.k_norm(self.k_proj(x).view(b, n, self.kv_heads, self.head_dim)).transpose(1, 2)
        v = self.v_proj(x).view(b, n, self.kv_heads, self.head_dim).transpose(1, 2)
        return apply_rope(k, cos, sin, self.head_dim), v

    def context_kv(self, context: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> LayerKV:
        """KV injection: this layer's keys/values for projected target features."""
        return self._kv(context, cos, sin)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        context: LayerKV,
        mask: torch.Tensor | None,
    ) -> torch.Tensor:
        b, n, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(b, n, self.heads, self.head_dim)).transpose(1, 2)
        q = apply_rope(q, cos, sin, self.head_dim)
        k_blk, v_blk = self._kv(x, cos, sin)
        k = torch.cat([context[0], k_blk], dim=2)  # [b, kv_heads, ctx + n, d]
        v = torch.cat([context[1], v_blk], dim=2)
        groups = self.heads // self.kv_heads
        k = k.repeat_interleave(groups, dim=1)  # GQA spelled out: portable to every exporter
        v = v.repeat_interleave(groups, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.head_dim**-0.5)
        return self.o_proj(out.transpose(1, 2).reshape(b, n, -1))


class DraftLayer(nn.Module):
    def __init__(self, config: DraftConfig):
        super().__init__()
        arch = config.arch
        self.self_attn = DraftAttention(config)
        self.mlp = Qwen3MLP(arch)
        self.input_layernorm = Qwen3RMSNorm(arch.hidden_size, eps=arch.rms_norm_eps)
        self.post_attention_layernorm = Qwen3RMSNorm(arch.hidden_size, eps=arch.rms_norm_eps)
        if config.method == "dflash2":  # convolutions over the block around both sublayers
            self.attention_conv = GroupedDynamicConv(arch.hidden_size, config.conv_kernel_size, config.conv_group_size)
            self.mlp_conv = GroupedDynamicConv(arch.hidden_size, config.conv_kernel_size, config.conv_group_size)

    def forward(self, x, cos, sin, context: LayerKV, mask) -> torch.Tensor:
        def attend(h):
            return self.self_attn(h, cos, sin, context, mask)

        h = self.input_layernorm(x)
        h = x + (self.attention_conv.around(attend, h) if hasattr(self, "attention_conv") else attend(h))
        m = self.post_attention_layernorm(h)
        return h + (self.mlp_conv.around(self.mlp, m) if hasattr(self, "mlp_conv") else self.mlp(m))


class DFlashDrafter(nn.Module):
    """Parameter names match z-lab checkpoints: layers.*, fc, hidden_norm, norm."""

    def __init__(self, config: DraftConfig):
        super().__init__()
        self.config = config
        arch = config.arch
        taps = len(config.target_layer_ids)
        self.layers = nn.ModuleList(DraftLayer(config) for _ in range(arch.num_hidden_layers))
        self.fc = nn.Linear(taps * arch.hidden_size, arch.hidden_size, bias=False)
        self.hidden_norm = Qwen3RMSNorm(arch.hidden_size, eps=arch.rms_norm_eps)
        self.norm = Qwen3RMSNorm(arch.hidden_size, eps=arch.rms_norm_eps)
        self.rotary = Qwen3RotaryEmbedding(arch)  # inv_freq is a non-persistent buffer
        # Token ids it may propose (models/draft_vocab.py); None: the whole vocabulary. Not a
        # buffer: z-lab's state dict has no such entry, so it travels in its own file.
        self.draft_vocab: torch.Tensor | None = None
        if config.method == "dflash2":
            self.candidate_selector = CandidateSelector(config.vocab_size, arch.hidden_size, config.selector_rank,
                                                        config.selector_top_k, config.block_size - 1)

    def rope(self, positions: torch.Tensor, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.rotary(like, positions)

    def inject_context(self, features: torch.Tensor, positions: torch.Tensor) -> list[LayerKV]:
        """features [b, n, taps*H] at `positions` [b, n] -> per-layer context K/V."""
        context = self.hidden_norm(self.fc(features))
        cos, sin = self.rope(positions, context)
        return [layer.self_attn.context_kv(context, cos, sin) for layer in self.layers]

    def block_hidden(
        self,
        block_embeds: torch.Tensor,
        positions: torch.Tensor,
        context: list[LayerKV],
        context_positions: torch.Tensor,
        visible: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Non-causal pass of block tokens over cached context K/V -> final-normed hidden.

        block_embeds [b, n, H] at `positions` [b, n]; context K/V sit at `context_positions`
        [b, ctx]. `visible` [b, 1, n, ctx + n] optionally narrows attention further (training
        packs many blocks into one pass and uses it to keep them apart).
        """
        x = block_embeds * self.config.input_embedding_scale
        cos, sin = self.rope(positions, x)
        key_positions = torch.cat([context_positions, positions], dim=1)
        for index, layer in enumerate(self.layers):
            mask = layer_mask(
                positions,
                key_positions,
                self.config.layer_is_causal(index),
                self.config.layer_window(index),
            )
            if visible is not None:
                mask = visible if mask is None else mask & visible
            x = layer(x, cos, sin, context[index], mask)
        return self.norm(x)

    def head(self, lm_head: nn.Module) -> DraftHead:
        """The output layer over the target's LM head (the drafter has none of its own),
        restricted to `draft_vocab` when the drafter has one."""
        return DraftHead(lm_head, self.draft_vocab, self.config.output_multiplier, self.config.final_logit_softcapping,
                         getattr(self, "candidate_selector", None))

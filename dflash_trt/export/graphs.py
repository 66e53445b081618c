"""The three exported graphs as torch modules with flat tensor I/O (DESIGN §4).

    target.onnx         input_ids [b, s], past_lengths [b], logits_from [], past K/V per layer
                        -> logits [b, s - logits_from, V], features [b, s, taps*H], present K/V per layer
    draft_context.onnx  features [b, n, taps*H], positions [b, n] -> context K/V per draft layer
    draft_block.onnx    block_ids [b, B], context_lengths [b], context K/V per draft layer
                        -> draft_tokens [b, B-1] (target ids)

The block pass returns token ids; its logits (over the drafter's draft vocabulary, or the target's)
end in the graph's ArgMax. The slots flavour also returns what an executor drawing drafts from the
drafter's distribution reads (LLM(draft_rule="drafter")): the logits as `draft_logits` (float32), or a
DFlash2 drafter's selector tables (`selector_scores`, `selector_columns`). They are tensors the ArgMax or
the selector's walk reads anyway; an executor that does not bind them never receives a copy.

K/V tensors are [b, kv_heads, tokens, head_dim], K after RoPE. Caches grow by concatenation
(present = past ++ new) and rows are valid up to their length: `past_lengths` / `context_lengths`
mask the rest, so a batch can hold sequences of different lengths and the host rolls a cache back
by slicing. No Python control flow depends on tensor values, so one trace serves every shape.
"""

from __future__ import annotations

import torch
from torch import nn

from dflash_trt.errors import DFlashError
from dflash_trt.export.moe import export_mlp
from dflash_trt.models.drafter import DFlashDrafter, rotate_half
from dflash_trt.models.target import HYBRID_RECURRENT, TargetModel

# qwen3_moe: its sparse MoE MLPs trace through moe.RoutedMoE (the experts the tokens picked);
# the hybrid families (Gated DeltaNet + gated attention) through hybrid_graphs.HybridTargetGraph
EXPORTABLE_TARGETS = frozenset({"llama", "mistral", "qwen2", "qwen3", "qwen3_moe"}) | HYBRID_RECURRENT


def in_tap_order(tapped: dict[int, torch.Tensor], taps: tuple[int, ...]) -> list[torch.Tensor]:
    """Each tapped layer's hidden states in the drafter's `target_layer_ids` order, a repeated layer
    repeated: the drafter's fc reads len(taps) * H columns in that order."""
    return [tapped[k] for k in taps]


def export_refusal(model_type: str) -> str | None:
    """Why a target family has no exported graphs yet (one line), or None: checked from config.json
    before any weights load, and by `build --dry-run` in its plan."""
    if model_type in EXPORTABLE_TARGETS:
        return None
    names = ", ".join(sorted(EXPORTABLE_TARGETS))
    return f"export: target model_type '{model_type}' has no ONNX graph yet (exportable: {names})"


def kv_names(prefix: str, layers: int) -> list[str]:
    return [f"{prefix}_{kind}_{i}" for i in range(layers) for kind in ("key", "value")]


def _layer_window(config, index: int) -> int | None:
    types = getattr(config, "layer_types", None)
    if types is None:  # Mistral, Qwen3-MoE: one window (or none) for every layer, as HF's attention
        return getattr(config, "sliding_window", None)
    if types[index] == "sliding_attention":
        return config.sliding_window
    return None


def project_qkv(layer, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    """A decoder layer's attention inputs: q [b, heads, s, d] and k [b, kv_heads, s, d] after the
    per-head norms (Qwen3) and RoPE, and v [b, s, kv_heads * d] as projected."""
    d = layer.self_attn.head_dim
    q, k, v = project_qkv_unrotated(layer, x)
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    q, k = q.transpose(1, 2), k.transpose(1, 2)
    return q * cos + rotate_half(q, d) * sin, k * cos + rotate_half(k, d) * sin, v


def project_qkv_packed(layer, x: torch.Tensor):
    """q [b, s, heads*d] and k [b, s, kv_heads*d] after the per-head norms (Qwen3), before RoPE, and
    v [b, s, kv_heads*d]: the layout GroupQueryAttention takes. Without per-head norms the heads are
    never split (each split and join is a Reshape and its shape arithmetic in the graph)."""
    attn = layer.self_attn
    if not hasattr(attn, "q_norm"):
        h = layer.input_layernorm(x)
        return attn.q_proj(h), attn.k_proj(h), attn.v_proj(h)
    b, s, _ = x.shape
    q, k, v = project_qkv_unrotated(layer, x)
    return q.reshape(b, s, -1), k.reshape(b, s, -1), v


def project_qkv_unrotated(layer, x: torch.Tensor):
    """q [b, s, heads, d] and k [b, s, kv_heads, d] after the per-head norms (Qwen3), before RoPE, and
    v [b, s, kv_heads * d]."""
    attn = layer.self_attn
    b, s, _ = x.shape
    d = attn.head_dim
    h = layer.input_layernorm(x)
    q = attn.q_proj(h).view(b, s, -1, d)
    k = attn.k_proj(h).view(b, s, -1, d)
    if hasattr(attn, "q_norm"):  # Qwen3: per-head RMSNorm before RoPE
        q, k = attn.q_norm(q), attn.k_norm(k)
    return q, k, attn.v_proj(h)


def causal_mask(positions: torch.Tensor, past_lengths: torch.Tensor, p: int):
    """Queries at `positions` [b, s] over a past of `p` slots (row b valid below past_lengths[b])
    and the s new keys -> (diff [b, s, p + s]: query minus key position, causal [b, s, p + s]: the key
    is valid and not after the query)."""
    b = positions.shape[0]
    past_index = torch.arange(p, device=positions.device)[None].expand(b, p)
    key_positions = torch.cat([past_index, positions], dim=1)  # [b, p + s]
    key_valid = torch.cat([past_index < past_lengths[:, None], torch.ones_like(positions, dtype=torch.bool)], dim=1)
    diff = positions[:, :, None] - key_positions[:, None, :]
    return diff, key_valid[:, None, :] & (diff >= 0)


class TargetGraph(nn.Module):
    """Prefill and verify over an explicit KV cache, reusing the HF modules' weights and RoPE."""

    def __init__(self, target: TargetModel, taps: tuple[int, ...]):
        super().__init__()
        refusal = export_refusal(target.model_type)
        if refusal:
            raise DFlashError(refusal)
        if target.is_stateful:
            raise DFlashError(f"export: '{target.model_type}' has recurrent layers: its graph is HybridTargetGraph")
        self.model = target.model.model
        self.lm_head = target.lm_head
        self.config = target.config
        self.taps = taps
        # the MLP each layer traces: a sparse MoE block's static-shape twin, dense MLPs as they are
        self.mlps = nn.ModuleList(export_mlp(layer.mlp) for layer in self.model.layers)
        last = target.num_layers - 1
        # HF reports the last layer's output after the final norm; keep the torch backend's view.
        self.normed_taps = {k for k in taps if k == last}

    def forward(self, input_ids: torch.Tensor, past_lengths: torch.Tensor, logits_from: torch.Tensor,
                *past: torch.Tensor):
        s = input_ids.shape[1]
        x = self.model.embed_tokens(input_ids)
        positions = past_lengths[:, None] + torch.arange(s, device=input_ids.device)[None]  # [b, s]
        cos, sin = self.model.rotary_emb(x, positions)
        diff, causal = causal_mask(positions, past_lengths, past[0].shape[2])
        features, present = {}, []
        for index, layer in enumerate(self.model.layers):
            window = _layer_window(self.config, index)
            mask = causal if window is None else causal & (diff < window)
            x, kv = self._layer(layer, self.mlps[index], x, cos, sin, past[2 * index], past[2 * index + 1],
                                mask[:, None])
            present += kv
            if index in self.taps:
                features[index] = self.model.norm(x) if index in self.normed_taps else x
        # A prefill needs only the last position's logits: skip the LM head (the largest matmul) elsewhere.
        x = x.narrow(1, logits_from, s - logits_from)
        logits = self.lm_head(self.model.norm(x)).float()
        return (logits, torch.cat(in_tap_order(features, self.taps), dim=-1), *present)

    @staticmethod
    def _layer(layer, mlp, x, cos, sin, past_k, past_v, mask):
        attn = layer.self_attn
        b, s, _ = x.shape
        q, k, v = project_qkv(layer, x, cos, sin)
        v = v.view(b, s, -1, attn.head_dim).transpose(1, 2)
        k_all = torch.cat([past_k, k], dim=2)  # [b, kv_heads, p + s, d]
        v_all = torch.cat([past_v, v], dim=2)
        groups = q.shape[1] // k.shape[1]
        out = nn.functional.scaled_dot_product_attention(
            q, k_all.repeat_interleave(groups, dim=1), v_all.repeat_interleave(groups, dim=1),
            attn_mask=mask, scale=attn.scaling,
        )
        x = x + attn.o_proj(out.transpose(1, 2).reshape(b, s, -1))
        x = x + mlp(layer.post_attention_layernorm(x))
        return x, (k_all, v_all)


class DraftContextGraph(nn.Module):
    """KV injection: newly committed target features -> the draft layers' context K/V."""

    def __init__(self, drafter: DFlashDrafter):
        super().__init__()
        self.drafter = drafter

    def forward(self, features: torch.Tensor, positions: torch.Tensor):
        kv = self.drafter.inject_context(features, positions)
        return tuple(t for pair in kv for t in pair)


class DraftBlockGraph(nn.Module):
    """The non-causal block pass: [bonus, MASK...] over the cached context -> B-1 draft tokens."""

    keep_logits = False  # (tokens, logits) for the export's numerics check; exported: tokens only
    export_logits = False  # (tokens, float32 logits) as the exported graph's two outputs (the slots flavour)

    def __init__(self, drafter: DFlashDrafter, target: TargetModel, head: nn.Module | None = None):
        super().__init__()
        self.drafter = drafter
        self.embed_tokens = target.model.get_input_embeddings()  # the drafter borrows the target's
        # a draft vocabulary's head copies rows of the target's: a caller that has one passes it
        self.head = head if head is not None else drafter.head(target.lm_head)

    def forward(self, block_ids: torch.Tensor, context_lengths: torch.Tensor, *context: torch.Tensor):
        b, n = block_ids.shape
        c = context[0].shape[2]
        positions = context_lengths[:, None] + torch.arange(n, device=block_ids.device)[None]
        context_index = torch.arange(c, device=block_ids.device)[None].expand(b, c)
        visible = torch.cat([context_index < context_lengths[:, None], torch.ones_like(block_ids, dtype=torch.bool)], dim=1)
        pairs = [(context[2 * i], context[2 * i + 1]) for i in range(len(context) // 2)]
        hidden = self.drafter.block_hidden(
            nn.functional.embedding(block_ids, self.embed_tokens.weight), positions, pairs, context_index,
            visible[:, None, None, :],
        )
        return block_outputs(self, hidden[:, 1:], block_ids[:, 0])  # slot 0 is the bonus, not a draft


def block_outputs(module: nn.Module, hidden: torch.Tensor, anchor: torch.Tensor):
    """What a draft block module returns from its drafted rows' hidden states: the tokens its head
    drafts after `anchor`, with what an executor drawing drafts reads where it exports them (a DFlash
    drafter's float32 logits; a DFlash2 drafter's selector scores [b, n, k, k] in float32 and candidate
    columns [b, n, k]), or with its logits where a numerics check keeps them."""
    if module.export_logits and module.head.selector is not None:
        _, tokens, columns, scores = module.head(hidden, anchor, tables=True)
        n = hidden.shape[1]  # a traced selector's tables cover the drafter's whole block: the block's own first
        return tokens, scores.narrow(1, 0, n).float(), columns.narrow(1, 0, n)
    logits, tokens = module.head(hidden, anchor)
    if module.export_logits:
        return tokens, logits.float()
    return (tokens, logits) if module.keep_logits else tokens

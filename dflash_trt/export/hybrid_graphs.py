"""target.onnx for the hybrid families (Qwen3-Next, Qwen3.5 dense and MoE): Gated DeltaNet layers
with a causal-conv state and a recurrent state, and every few layers a gated full attention.

    inputs   input_ids [b, s], past_lengths [b], logits_from [],
             past K/V per full-attention layer (as contract 1: grown by concatenation),
             conv_state_<i> [b, conv_dim, K-1] and recurrent_state_<i> [b, Hv, Dk, Dv] (float32)
             per linear-attention layer i
    outputs  logits [b, s - logits_from, V], features [b, s, taps*H], present K/V,
             conv_window_<i> [b, conv_dim, K-1 + s - logits_from]: the conv inputs from position
                 logits_from - (K-1) on, so the conv state after keeping `keep` tokens is its
                 columns [keep - logits_from, keep - logits_from + K-1)
             recurrent_states_<i> [b, s - logits_from, Hv, Dk, Dv] float32: the state after each
                 position from logits_from on; after keeping `keep` tokens the host takes index
                 keep - logits_from - 1 (or keeps its input state when that is -1)

So a verify (logits_from 0) yields every state a partial acceptance may roll back to, and the host
never re-feeds tokens; a prefill (logits_from s - 1) yields only the last. Every row's s tokens
must be real (no padding inside `input_ids`): the recurrence has no mask.
"""

from __future__ import annotations

import torch
from torch import nn

from dflash_trt.errors import DFlashError
from dflash_trt.export.delta_rule import gated_delta_rule, gated_delta_rule_at
from dflash_trt.export.graphs import causal_mask, in_tap_order
from dflash_trt.export.moe import export_mlp
from dflash_trt.models.drafter import rotate_half
from dflash_trt.models.target import TargetModel


def layer_indices(config, kind: str) -> list[int]:
    """Indices of the layers of `kind` ("linear_attention" or "full_attention")."""
    return [i for i, t in enumerate(config.layer_types) if t == kind]


def linear_attention_shapes(config) -> dict[str, int]:
    """What the host needs to allocate a linear-attention layer's states (bundle.json keeps it)."""
    key_dim = config.linear_num_key_heads * config.linear_key_head_dim
    return {
        "conv_dim": 2 * key_dim + config.linear_num_value_heads * config.linear_value_head_dim,
        "conv_kernel": config.linear_conv_kernel_dim,
        "num_key_heads": config.linear_num_key_heads,
        "num_value_heads": config.linear_num_value_heads,
        "key_head_dim": config.linear_key_head_dim,
        "value_head_dim": config.linear_value_head_dim,
    }


def delta_input_width(shapes: dict[str, int]) -> int:
    """Floats per position of a slot graph's delta_inputs (linear_attention_at): raw key, value, g, beta."""
    return (shapes["num_key_heads"] * shapes["key_head_dim"]
            + shapes["num_value_heads"] * (shapes["value_head_dim"] + 2))


def text_rope(rotary: nn.Module, x: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin at positions [b, s]. Qwen3.5's RoPE is multimodal: it takes a (3, b, s) grid, every row the
    text position here; some transformers releases index it as 3-D and reject the [b, s] form."""
    if hasattr(rotary, "mrope_section"):
        positions = positions[None].expand(3, -1, -1)
    return rotary(x, positions)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE on the first cos.shape[-1] dims of each head (partial rotary), the rest passed through."""
    r = cos.shape[-1]
    x_rot, x_pass = x[..., :r], x[..., r:]
    return torch.cat([x_rot * cos + rotate_half(x_rot, r) * sin, x_pass], dim=-1)


def gated_qk(attn, h, cos, sin):
    """Qwen3-Next / Qwen3.5 full attention's inputs: q_proj yields the query and an output gate ->
    q [b, heads, s, d] and k [b, kv_heads, s, d] after the per-head norms and (partial) RoPE, and
    the gate's sigmoid [b, s, heads * d]."""
    b, s, _ = h.shape
    d = attn.head_dim
    q, gate = torch.chunk(attn.q_proj(h).view(b, s, -1, 2 * d), 2, dim=-1)
    q = attn.q_norm(q).transpose(1, 2)
    k = attn.k_norm(attn.k_proj(h).view(b, s, -1, d)).transpose(1, 2)
    cos, sin = cos[:, None], sin[:, None]
    return rotate(q, cos, sin), rotate(k, cos, sin), torch.sigmoid(gate.reshape(b, s, -1))


def gated_attention(attn, h, cos, sin, past_k, past_v, mask):
    """Gated full attention over the past K/V (grown by concatenation, contract 1)."""
    b, s, _ = h.shape
    q, k, gate = gated_qk(attn, h, cos, sin)
    v = attn.v_proj(h).view(b, s, -1, attn.head_dim).transpose(1, 2)
    k_all, v_all = torch.cat([past_k, k], dim=2), torch.cat([past_v, v], dim=2)
    groups = q.shape[1] // k.shape[1]
    out = nn.functional.scaled_dot_product_attention(
        q, k_all.repeat_interleave(groups, dim=1), v_all.repeat_interleave(groups, dim=1),
        attn_mask=mask, scale=attn.scaling,
    )
    return attn.o_proj(out.transpose(1, 2).reshape(b, s, -1) * gate), k_all, v_all


def _projections(mod, h):
    """-> conv input [b, s, 2*key_dim + value_dim] (q, k, v), z [b, s, Hv, Dv], b and a [b, s, Hv]."""
    b, s, _ = h.shape
    if hasattr(mod, "in_proj_qkv"):  # Qwen3.5: one projection each
        return mod.in_proj_qkv(h), mod.in_proj_z(h).view(b, s, -1, mod.head_v_dim), mod.in_proj_b(h), mod.in_proj_a(h)
    # Qwen3-Next: q, k, v, z and b, a interleaved per key-head group; HF's own reordering
    q, k, v, z, beta_in, a = mod.fix_query_key_value_ordering(mod.in_proj_qkvz(h), mod.in_proj_ba(h))
    return torch.cat([x.reshape(b, s, -1) for x in (q, k, v)], dim=-1), z, beta_in, a


def _depthwise_conv(window: torch.Tensor, conv: nn.Conv1d, s: int) -> torch.Tensor:
    """HF's causal depthwise conv1d over [b, C, K-1+s] (no padding: the state is the past) as K
    shifted multiply-adds: ONNX Conv has no bfloat16 type, and K is 4."""
    weight = conv.weight[:, 0]  # [C, K]
    x = window.to(weight.dtype)
    out = sum(x.narrow(2, k, s) * weight[:, k, None] for k in range(weight.shape[1]))
    return out if conv.bias is None else out + conv.bias[:, None]


def _rule_inputs(mod, h, conv_state):
    """A Gated DeltaNet layer up to its recurrence -> (conv window [b, C, K-1+s], z, query, key,
    value, g, beta): the conv runs over the state (the past K-1 inputs) and the s new ones."""
    b, s, _ = h.shape
    mixed, z, beta_in, a = _projections(mod, h)
    window = torch.cat([conv_state, mixed.transpose(1, 2).to(conv_state.dtype)], dim=2)
    conv = nn.functional.silu(_depthwise_conv(window, mod.conv1d, s)).to(h.dtype).transpose(1, 2)  # [b, s, C]
    query, key, value = torch.split(conv, [mod.key_dim, mod.key_dim, mod.value_dim], dim=-1)
    query = query.reshape(b, s, -1, mod.head_k_dim)
    key = key.reshape(b, s, -1, mod.head_k_dim)
    value = value.reshape(b, s, -1, mod.head_v_dim)
    g = -mod.A_log.float().exp() * nn.functional.softplus(a.float() + mod.dt_bias)
    return window, z, query, key, value, g, beta_in.sigmoid()


def _rule_output(mod, out, z):
    b, s = z.shape[:2]  # not out's: an opaque op's output shape would be traced as a constant
    out = mod.norm(out.reshape(-1, mod.head_v_dim), z.reshape(-1, mod.head_v_dim)).reshape(b, s, -1)
    return mod.out_proj(out)


def linear_attention(mod, h, conv_state, recurrent_state, logits_from):
    """One Gated DeltaNet layer over s tokens after its states -> (out, conv_window, recurrent_states)."""
    window, z, query, key, value, g, beta = _rule_inputs(mod, h, conv_state)
    out, states = gated_delta_rule(query, key, value, g, beta, recurrent_state, logits_from)
    return _rule_output(mod, out, z), window.narrow(2, logits_from, window.shape[2] - logits_from), states


def linear_attention_at(mod, h, conv_state, recurrent_state, position):
    """Graph contract 2's form: the states after position [b] of each row -> (out, conv state
    [b, C, K-1], recurrent state [b, Hv, Dk, Dv], and what each of the s positions fed the layer:
    conv inputs [b, C, s] (the window's new columns) and delta inputs [b, s, Hk*Dk + Hv*Dv + 2*Hv]
    float32 (raw key, value, g, beta), from which a runtime rebuilds the states after any earlier
    position (csrc/state_rebuild.h) without keeping one per position."""
    window, z, query, key, value, g, beta = _rule_inputs(mod, h, conv_state)
    out, states = gated_delta_rule_at(query, key, value, g, beta, recurrent_state, position[:, None])
    b, channels, width = conv_state.shape
    # after position p the conv state holds the window's columns p + 1 .. p + K - 1
    columns = position[:, None] + 1 + torch.arange(width, device=position.device)[None]  # [b, K-1]
    conv = window.gather(2, columns[:, None, :].expand(b, channels, width))
    delta = torch.cat([key.float().flatten(2), value.float().flatten(2), g.float(), beta.float()], dim=-1)
    return _rule_output(mod, out, z), conv, states[:, 0], window.narrow(2, width, window.shape[2] - width), delta


class HybridTargetGraph(nn.Module):
    """Prefill and verify of a hybrid target over explicit K/V caches and linear-attention states."""

    def __init__(self, target: TargetModel, taps: tuple[int, ...]):
        super().__init__()
        if not target.is_stateful:
            raise DFlashError(f"export: '{target.model_type}' is not a hybrid target")
        self.model = target.model.model
        self.lm_head = target.lm_head
        self.taps = taps
        self.attention = layer_indices(target.config, "full_attention")
        self.linear = layer_indices(target.config, "linear_attention")
        if not self.attention:
            raise DFlashError("export: a hybrid target without full-attention layers has no ONNX graph yet")
        self.mlps = nn.ModuleList(export_mlp(layer.mlp) for layer in self.model.layers)
        self.normed_taps = {k for k in taps if k == target.num_layers - 1}  # as TargetGraph

    def by_layer(self, caches):
        """The graph's cache inputs -> ({attention layer: (K, V)}, {linear layer: (conv, recurrent)})."""
        first_state = 2 * len(self.attention)
        kv = {i: caches[2 * n: 2 * n + 2] for n, i in enumerate(self.attention)}
        states = {i: caches[first_state + 2 * n: first_state + 2 * n + 2] for n, i in enumerate(self.linear)}
        return kv, states

    def forward(self, input_ids: torch.Tensor, past_lengths: torch.Tensor, logits_from: torch.Tensor,
                *caches: torch.Tensor):
        s = input_ids.shape[1]
        kv, states = self.by_layer(caches)
        x = self.model.embed_tokens(input_ids)
        positions = past_lengths[:, None] + torch.arange(s, device=input_ids.device)[None]  # [b, s]
        cos, sin = text_rope(self.model.rotary_emb, x, positions)
        mask = causal_mask(positions, past_lengths, caches[0].shape[2])[1][:, None]
        features, present, new_states = {}, [], []
        for index, layer in enumerate(self.model.layers):
            h = layer.input_layernorm(x)
            if index in kv:
                out, k_all, v_all = gated_attention(layer.self_attn, h, cos, sin, *kv[index], mask)
                present += [k_all, v_all]
            else:
                out, window, recurrent = linear_attention(layer.linear_attn, h, *states[index], logits_from)
                new_states += [window, recurrent]
            x = x + out
            x = x + self.mlps[index](layer.post_attention_layernorm(x))
            if index in self.taps:
                features[index] = self.model.norm(x) if index in self.normed_taps else x
        x = x.narrow(1, logits_from, s - logits_from)
        logits = self.lm_head(self.model.norm(x)).float()
        return (logits, torch.cat(in_tap_order(features, self.taps), dim=-1), *present, *new_states)

    def prefill_caches(self, ids: torch.Tensor) -> list[torch.Tensor]:
        """The caches a prefill of `ids` [b, s] leaves, as the next call's inputs (K/V, then each
        linear layer's conv and recurrent state): what the host's commit of all s tokens keeps."""
        b, s = ids.shape
        config, shapes = self.model.config, linear_attention_shapes(self.model.config)
        dtype = self.model.embed_tokens.weight.dtype
        kv = [torch.zeros(b, config.num_key_value_heads, 0, config.head_dim, dtype=dtype)] * (2 * len(self.attention))
        states = [torch.zeros(b, shapes["conv_dim"], shapes["conv_kernel"] - 1, dtype=dtype),
                  torch.zeros(b, shapes["num_value_heads"], shapes["key_head_dim"], shapes["value_head_dim"])]
        _, _, *caches = self(ids, torch.zeros(b, dtype=torch.long), torch.tensor(s - 1), *kv, *states * len(self.linear))
        present, new = caches[: len(kv)], caches[len(kv):]
        # keep all s tokens: one past logits_from (s - 1), so window columns [1, K) and state index 0
        return present + [t[:, :, 1:] if n % 2 == 0 else t[:, 0] for n, t in enumerate(new)]


def hybrid_target_spec(config, vocab: int, features: int, dtype: str) -> dict:
    """target.onnx's I/O for a hybrid target (module docstring)."""
    def io(name, type_, shape):
        return {"name": name, "dtype": type_, "shape": shape}

    kv = lambda when, size: [io(f"{when}_{kind}_{i}", dtype, ["batch", config.num_key_value_heads, size, config.head_dim])  # noqa: E731
                             for i in layer_indices(config, "full_attention") for kind in ("key", "value")]
    shapes = linear_attention_shapes(config)
    state = [shapes["num_value_heads"], shapes["key_head_dim"], shapes["value_head_dim"]]
    width = shapes["conv_kernel"] - 1
    linear = layer_indices(config, "linear_attention")
    return {
        "inputs": [io("input_ids", "int64", ["batch", "new"]), io("past_lengths", "int64", ["batch"]),
                   io("logits_from", "int64", [])] + kv("past", "past")
        + [x for i in linear for x in (io(f"conv_state_{i}", dtype, ["batch", shapes["conv_dim"], width]),
                                       io(f"recurrent_state_{i}", "float32", ["batch", *state]))],
        "outputs": [io("logits", "float32", ["batch", "new-logits_from", vocab]),
                    io("features", dtype, ["batch", "new", features])] + kv("present", "past+new")
        + [x for i in linear for x in (io(f"conv_window_{i}", dtype, ["batch", shapes["conv_dim"], f"new-logits_from+{width}"]),
                                       io(f"recurrent_states_{i}", "float32", ["batch", "new-logits_from", *state]))],
    }

"""The gated delta rule (Gated DeltaNet's recurrence) over a whole sequence, as exported graphs run it.

One scripted loop over the tokens: the TorchScript exporter turns it into an ONNX Loop, so one
trace serves every sequence length (a traced Python loop would fix the length). The same function
is the reference the `dflash::GatedDeltaRule` kernels must match (plugins/gated_delta_rule/).

Per (row, value head h), with the key head h // (Hv / Hk), state S [Dk, Dv] in float32:
    S <- S * exp(g_t);  delta = beta_t * (v_t - S^T k_t);  S <- S + k_t delta^T;  o_t = S^T q_t
after q and k are L2-normalised (eps 1e-6) and q is scaled by Dk^-1/2, as HF's Qwen3-Next and
Qwen3.5 layers call their kernels (use_qk_l2norm_in_kernel=True). The recurrence is HF's
`torch_recurrent_gated_delta_rule`; HF's prefill uses the chunked form of the same math.

Rollback after a partial acceptance needs the state after each kept position, so the loop also
returns the state after every position from `states_from` on: a verify asks for all of them, a
prefill (states_from = s - 1) only for the last, so a long prompt never materialises s states.
"""

from __future__ import annotations

import torch


@torch.jit.script
def _normalised(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, g: torch.Tensor, beta: torch.Tensor):
    """The recurrence's float32 operands: q and k per value head, L2-normalised, q scaled by Dk^-1/2."""
    groups = value.shape[2] // key.shape[2]
    q = query.float().repeat_interleave(groups, dim=2)
    k = key.float().repeat_interleave(groups, dim=2)
    q = q * torch.rsqrt((q * q).sum(-1, keepdim=True) + 1e-6) / (q.shape[-1] ** 0.5)
    k = k * torch.rsqrt((k * k).sum(-1, keepdim=True) + 1e-6)
    return q, k, value.float(), g.float(), beta.float()


@torch.jit.script
def _step(state: torch.Tensor, q_t: torch.Tensor, k_t: torch.Tensor, v_t: torch.Tensor, g_t: torch.Tensor,
          beta_t: torch.Tensor):
    """One token: (state after it, its output [b, Hv, Dv])."""
    state = state * torch.exp(g_t)[:, :, None, None]
    delta = (v_t - (state * k_t[:, :, :, None]).sum(2)) * beta_t[:, :, None]
    state = state + k_t[:, :, :, None] * delta[:, :, None, :]
    return state, (state * q_t[:, :, :, None]).sum(2)


@torch.jit.script
def delta_rule_scan(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, g: torch.Tensor,
                    beta: torch.Tensor, state: torch.Tensor, states_from: torch.Tensor):
    """query, key [b, s, Hk, Dk]; value [b, s, Hv, Dv]; g, beta [b, s, Hv]; state [b, Hv, Dk, Dv]
    float32; states_from [] int64 -> (out [b, s, Hv, Dv] in value's dtype,
    states [b, s - states_from, Hv, Dk, Dv] float32: the state after each position >= states_from)."""
    q, k, v, g, beta = _normalised(query, key, value, g, beta)
    first = int(states_from)
    outs: list[torch.Tensor] = []
    states: list[torch.Tensor] = []
    for t in range(q.shape[1]):
        state, out = _step(state, q[:, t], k[:, t], v[:, t], g[:, t], beta[:, t])
        outs.append(out)
        if t >= first:
            states.append(state)
    return torch.stack(outs, 1).to(value.dtype), torch.stack(states, 1)


@torch.library.custom_op("dflash::delta_rule", mutates_args=())
def gated_delta_rule(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, g: torch.Tensor,
                     beta: torch.Tensor, state: torch.Tensor, states_from: torch.Tensor
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """delta_rule_scan as one opaque op: a trace records one `dflash::GatedDeltaRule` node per call,
    which the plugin flavour keeps and the portable flavour lowers (delta_rule_loop.py)."""
    out, states = delta_rule_scan(query, key, value, g, beta, state, states_from)
    return out, states


@gated_delta_rule.register_fake
def _(query, key, value, g, beta, state, states_from):
    # states' length (s - states_from) depends on a value a fake cannot read: s is its bound. The
    # TorchScript exporter runs the real op, so no exported shape comes from here.
    b, s, heads, _ = value.shape
    return value.new_empty(value.shape), state.new_empty(b, s, heads, state.shape[2], state.shape[3])


def _symbolic(g, query, key, value, gate, beta, state, states_from):
    # TensorRT's ONNX parser hands input 6 (states_from) to the plugin as a shape input, so the
    # plugin can size `states` from its value (plugins/gated_delta_rule/README.md); onnxruntime
    # ignores the attribute.
    out, states = g.op("dflash::GatedDeltaRule", query, key, value, gate, beta, state, states_from, outputs=2,
                       tensorrt_plugin_shape_input_indices_i=[6])
    out.setType(value.type().with_sizes(None))
    states.setType(state.type().with_sizes(None))
    return out, states




@torch.jit.script
def delta_rule_scan_at(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, g: torch.Tensor,
                       beta: torch.Tensor, state: torch.Tensor, positions: torch.Tensor):
    """delta_rule_scan with the states kept at chosen positions per row (graph contract 2, whose rows
    are ragged): positions [b, r] int64 -> (out [b, s, Hv, Dv], states [b, r, Hv, Dk, Dv] float32,
    states[b, j] the state after position positions[b, j]). Only r states per row are held, as the
    lowered graph holds them: a long prefill never materialises a state per position."""
    q, k, v, g, beta = _normalised(query, key, value, g, beta)
    kept = state[:, None].expand(-1, positions.shape[1], -1, -1, -1)
    outs: list[torch.Tensor] = []
    for t in range(q.shape[1]):
        state, out = _step(state, q[:, t], k[:, t], v[:, t], g[:, t], beta[:, t])
        outs.append(out)
        kept = torch.where((positions == t)[:, :, None, None, None], state[:, None], kept)
    return torch.stack(outs, 1).to(value.dtype), kept


@torch.library.custom_op("dflash::delta_rule_at", mutates_args=())
def gated_delta_rule_at(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, g: torch.Tensor,
                        beta: torch.Tensor, state: torch.Tensor, positions: torch.Tensor
                        ) -> tuple[torch.Tensor, torch.Tensor]:
    """delta_rule_scan_at as one opaque op (`dflash::GatedDeltaRuleAt`), which export always lowers
    (delta_rule_loop.py): the slots flavour runs on onnxruntime's standard ops."""
    out, states = delta_rule_scan_at(query, key, value, g, beta, state, positions)
    return out, states


@gated_delta_rule_at.register_fake
def _(query, key, value, g, beta, state, positions):
    b, r = positions.shape
    return value.new_empty(value.shape), state.new_empty(b, r, *state.shape[1:])


def _symbolic_at(g, query, key, value, gate, beta, state, positions):
    out, states = g.op("dflash::GatedDeltaRuleAt", query, key, value, gate, beta, state, positions, outputs=2)
    out.setType(value.type().with_sizes(None))
    states.setType(state.type().with_sizes(None))
    return out, states


def register_delta_rule_symbolic(opset: int) -> None:
    torch.onnx.register_custom_op_symbolic("dflash::delta_rule", _symbolic, opset)
    torch.onnx.register_custom_op_symbolic("dflash::delta_rule_at", _symbolic_at, opset)

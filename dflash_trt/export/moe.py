"""Export-time mixture-of-experts MLP: HF's sparse MoE blocks (Qwen3-MoE, Qwen3-Next, Qwen3.5-MoE)
as static-shape tensor ops that trace to one ONNX graph for every batch and length.

HF's block loops over the experts some token picked and gathers those tokens (shapes that depend
on the routing), which a trace cannot capture. Here every expert runs on every token and a dense
[tokens, experts] routing matrix, zero outside each token's top-k, weighs their outputs: the same
result as HF's up to round-off, with static shapes. This costs ALL experts' compute and weight
reads on every token (experts / top-k times a sparse MoE's: 16x for 128 experts, top 8). Gathering
each token's k experts (a grouped GEMM) or a MoE plugin op is future work; this form is the
portable reference such a kernel must match.
"""

from __future__ import annotations

import torch
from torch import nn

from dflash_trt.errors import DFlashError


def is_sparse_moe(mlp: nn.Module) -> bool:
    return hasattr(mlp, "gate") and hasattr(mlp, "experts") and hasattr(mlp.experts, "gate_up_proj")


class DenseRoutedMoE(nn.Module):
    """The same computation as HF's sparse MoE block, over all experts at once.

    Holds the HF block (its parameters, not copies): the user's model is unchanged and the bundle's
    dtype cast reaches these weights as it reaches the attention's."""

    def __init__(self, block: nn.Module):
        super().__init__()
        experts = block.experts
        layout = {name: getattr(experts, name, want) for name, want in
                  (("is_concatenated", True), ("is_transposed", False), ("has_bias", False), ("has_gate", True))}
        if layout != {"is_concatenated": True, "is_transposed": False, "has_bias": False, "has_gate": True}:
            raise DFlashError(f"export: MoE experts with layout {layout} have no ONNX graph yet "
                              "(exportable: concatenated [gate; up], not transposed, no bias)")
        self.block = block
        self.top_k = block.gate.top_k
        # Qwen3.5-MoE's router has no flag: it always renormalises the top-k probabilities
        self.norm_topk_prob = getattr(block.gate, "norm_topk_prob", True)

    def routing(self, x: torch.Tensor) -> torch.Tensor:
        """x [T, H] -> [T, E]: each token's top-k probabilities (renormalised if the config says
        so), zero elsewhere. The selection is a top-k scattered into place, never a `probs >= k-th
        value` threshold (which would take every expert tied at the k-th place): exactly k experts,
        and in PyTorch exactly torch.topk's, so this module equals HF's block even on ties. In the
        graph it is ONNX TopK, which takes the lowest index among equal values; torch.topk on CPU
        has no such rule (measured: top-2 of [.1, .3, .3, .3] is [2, 3]), so on a bit-exact tie at the
        k-th place the graph may route to another expert of equal weight than HF eager does."""
        logits = nn.functional.linear(x, self.block.gate.weight)  # [T, E]
        probs = torch.softmax(logits, dim=-1, dtype=torch.float)
        top, index = torch.topk(probs, self.top_k, dim=-1)  # [T, k]
        if self.norm_topk_prob:
            top = top / top.sum(dim=-1, keepdim=True)
        # scattered in float32 (ONNX opset 17's ConstantOfShape has no bfloat16), then cast as HF casts
        return torch.zeros_like(probs).scatter(1, index, top).to(logits.dtype)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        shape = hidden.shape
        x = hidden.reshape(-1, shape[-1])  # [T, H]
        weights = self.routing(x)[:, :, None]  # [T, E, 1]
        experts = self.block.experts
        e, two_i, h = experts.gate_up_proj.shape
        # one GEMM for every expert's gate and up: [T, H] x [H, E*2I] -> [T, E, 2I]
        gate_up = (x @ experts.gate_up_proj.reshape(e * two_i, h).t()).view(-1, e, two_i)
        gate, up = gate_up.chunk(2, dim=-1)
        act = experts.act_fn(gate) * up  # [T, E, I]
        # Weigh before the down projection (linear, so equal to HF's weigh-after up to round-off).
        # `where`, not a product alone: an expert the token did not pick may overflow in half
        # precision, and inf * 0 would put NaN where HF never computed anything.
        act = torch.where(weights != 0, act * weights, 0.0)
        # one GEMM sums over experts: [T, E*I] x [E*I, H]; down_proj is [E, H, I]
        down = experts.down_proj.permute(1, 0, 2).reshape(h, -1)
        out = act.reshape(x.shape[0], -1) @ down.t()  # [T, H]
        if hasattr(self.block, "shared_expert"):  # Qwen3-Next / Qwen3.5-MoE: an always-on expert, gated
            out = out + torch.sigmoid(self.block.shared_expert_gate(x)) * self.block.shared_expert(x)
        return out.reshape(shape)


def export_mlp(mlp: nn.Module) -> nn.Module:
    """The module to trace in place of a decoder layer's MLP: dense MLPs as they are."""
    return DenseRoutedMoE(mlp) if is_sparse_moe(mlp) else mlp

"""Export-time mixture-of-experts MLP: HF's sparse MoE blocks (Qwen3-MoE, Qwen3-Next, Qwen3.5-MoE)
as graphs that read only the experts the tokens route to, for every batch and length.

HF's block loops over the experts some token picked and gathers each one's tokens: a Python loop
whose trip count and shapes depend on the routing, which a trace cannot capture. Two exact forms:

- `slots` (the onnxruntime flavour): one `com.microsoft::MoE` node per layer (moe_ops.py),
  onnxruntime's own grouped kernel: each token through its own top-k experts only.
- `plugin`: one `dflash::MoE` node per layer (moe_ops.py, plugins/moe/README.md): our op library's
  kernel on onnxruntime, our CUDA kernel as a TensorRT plugin and in the torch backend on a GPU;
  each picked expert's weights read once per call.
- Every other flavour, in standard ops (moe_routing.py) (TensorRT and TensorRT-RTX parse them): find the experts the
  call's tokens picked (`used`: U = min(tokens x top-k, E) ids, a TopK over a [E] picked mask;
  where tokens share experts, unpicked ones fill the rest at zero weight), gather those experts'
  weights, and run every token of the call through each of them, weighing each (token, expert)
  pair by the token's routing probability (zero where the token did not pick it). Weight reads
  scale with U, not E: a decode step reads top-k experts, a 16-token verify at most 16 x top-k. The
  compute is tokens x U expert MLPs where HF's is tokens x top-k: the right trade while a step is
  bound by the weights it reads (decode and verify on a GPU).

Both equal HF's block up to round-off; tests hold them to it and to a dense all-experts oracle.
"""

from __future__ import annotations

import torch
from torch import nn

from dflash_trt.errors import DFlashError
from dflash_trt.export.moe_ops import moe, onnxruntime_moe
from dflash_trt.export.moe_routing import routed_experts


def is_sparse_moe(mlp: nn.Module) -> bool:
    return hasattr(mlp, "gate") and hasattr(mlp, "experts") and hasattr(mlp.experts, "gate_up_proj")


class RoutedMoE(nn.Module):
    """The same computation as HF's sparse MoE block over the experts the call's tokens picked.
    `op`: "standard" (standard ops), "onnxruntime" (onnxruntime's MoE kernel, the `slots` flavour) or
    "dflash" (our `dflash::MoE`: the `plugin` flavour, and our CUDA kernel in the torch backend).

    Holds the HF block (its parameters, not copies): the user's model is unchanged and the bundle's
    dtype cast reaches these weights as it reaches the attention's."""

    op = "standard"

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

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        shape = hidden.shape
        x = hidden.reshape(-1, shape[-1])  # [T, H]
        router_logits = nn.functional.linear(x, self.block.gate.weight)  # [T, E]
        experts = self.block.experts
        if self.op != "standard":
            fused = onnxruntime_moe if self.op == "onnxruntime" else moe
            out = fused(x, router_logits, experts.gate_up_proj, experts.down_proj, self.top_k, self.norm_topk_prob)
        else:
            out = routed_experts(x, router_logits, experts.gate_up_proj, experts.down_proj, experts.act_fn,
                                 self.top_k, self.norm_topk_prob)
        if hasattr(self.block, "shared_expert"):  # Qwen3-Next / Qwen3.5-MoE: an always-on expert, gated
            out = out + torch.sigmoid(self.block.shared_expert_gate(x)) * self.block.shared_expert(x)
        return out.reshape(shape)


def export_mlp(mlp: nn.Module) -> nn.Module:
    """The module to trace in place of a decoder layer's MLP: dense MLPs as they are."""
    return RoutedMoE(mlp) if is_sparse_moe(mlp) else mlp


def fused_moe_refusal(graph: nn.Module) -> str | None:
    """Why the routed MoE layers of `graph` cannot run as one fused op; None when they can."""
    for module in graph.modules():
        if isinstance(module, RoutedMoE):
            act = type(module.block.experts.act_fn).__name__
            if act not in ("SiLU", "SiLUActivation"):
                return f"the fused MoE ops gate with SiLU; these experts use {act}"
    return None


def use_moe_op(graph: nn.Module, op: str) -> None:
    """Every routed MoE layer of `graph` runs as one fused op, "onnxruntime" (the `slots` flavour) or
    "dflash" (the `plugin` flavour, the torch backend's CUDA kernel); one line, before any trace, for
    experts the op cannot run."""
    refusal = fused_moe_refusal(graph)
    if refusal:
        raise DFlashError(f"export: {refusal}")
    for module in graph.modules():
        if isinstance(module, RoutedMoE):
            module.op = op

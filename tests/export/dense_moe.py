"""The oracle for export/moe.py's RoutedMoE: every expert on every token, weighed by a dense
[tokens, experts] routing matrix that is zero outside each token's top-k. Static shapes, the same
result as HF's sparse block up to round-off, and E / top-k times its work: a reference, not a graph
anyone should deploy."""

import torch

from dflash_trt.export.moe import RoutedMoE
from dflash_trt.export.moe_routing import route


class DenseRoutedMoE(RoutedMoE):
    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        shape = hidden.shape
        x = hidden.reshape(-1, shape[-1])  # [T, H]
        router_logits = torch.nn.functional.linear(x, self.block.gate.weight)
        weights = route(router_logits, self.top_k, self.norm_topk_prob)[:, :, None]  # [T, E, 1]
        experts = self.block.experts
        e, two_i, h = experts.gate_up_proj.shape
        gate_up = (x @ experts.gate_up_proj.reshape(e * two_i, h).t()).view(-1, e, two_i)  # [T, E, 2I]
        gate, up = gate_up.chunk(2, dim=-1)
        act = torch.where(weights != 0, experts.act_fn(gate) * up * weights, 0.0)  # [T, E, I]
        down = experts.down_proj.permute(1, 0, 2).reshape(h, -1)  # [H, E*I]
        out = act.reshape(x.shape[0], -1) @ down.t()  # [T, H]: one GEMM sums over the experts
        if hasattr(self.block, "shared_expert"):
            out = out + torch.sigmoid(self.block.shared_expert_gate(x)) * self.block.shared_expert(x)
        return out.reshape(shape)

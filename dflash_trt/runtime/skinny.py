"""Faster CPU matmuls for the few rows a small verify or draft step feeds.

`F.linear` on a CPU runs 1 row as a matrix-vector product, but 2-4 rows go to a GEMM that costs
about twice the weights' one read. Decoding on a CPU is bound by reading the weights, so verifying
4 tokens should cost about what 1 does. Measured on our 2-core AVX2 VM (MKL), SmolLM2-135M's 210
layer matrices once each, 1 / 2 / 4 / 8 rows: F.linear 30 / 59 / 58 / 48 ms, `weight @ x.T` 31 /
34 / 36 / 54 ms; its 49152-row LM head: 8.5 / 19.6 / 21.0 / 18.5 ms against 9.7 / 7.9 / 8.6 / 15.5.
From 5 rows on the GEMM catches up on the layers, so only 2-4 rows take the other product.
"""

from __future__ import annotations

import torch
from torch import nn

SKINNY_ROWS = range(2, 5)


class SkinnyLinear(nn.Linear):
    """nn.Linear whose CPU inference forward of 2-4 rows multiplies as weight @ x.T: the same
    product summed in another order, so results agree to float rounding."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # called ~240 times a decoding step: the checks stay cheap (x.is_cpu, not x.device.type)
        rows = x.numel() // self.in_features
        if rows not in SKINNY_ROWS or not x.is_cpu or torch.is_grad_enabled():
            return super().forward(x)
        out = torch.mm(self.weight, x.reshape(rows, self.in_features).t()).t().contiguous()
        if self.bias is not None:
            out += self.bias
        return out.view(*x.shape[:-1], self.out_features)


def use_skinny_linears(model: nn.Module) -> int:
    """Switch every plain nn.Linear in `model` to SkinnyLinear in place (same parameters, same
    state dict); returns how many. For the torch runtime on a CPU only: exporters trace F.linear."""
    count = 0
    for module in model.modules():
        if type(module) is nn.Linear:
            module.__class__ = SkinnyLinear
            count += 1
    return count

"""The faster CPU matmul for the few rows a small verify or draft step feeds, chosen by measuring.

Decoding on a CPU is bound by reading the weights, so verifying 4 tokens should cost about what 1
does, but which product gets there depends on the CPU and its BLAS. On our 2-core AMD EPYC VM (AVX2,
MKL) `F.linear` ran 2-4 rows as a GEMM costing about twice the weights' one read and `weight @ x.T`
did not (SmolLM2-135M's 49152-row LM head, 1 / 2 / 4 rows: 8.5 / 19.6 / 21.0 ms against 9.7 / 7.9 /
8.6); on the same VM type landing on an Intel Xeon (AVX-512) it was the other way round (4.0 / 7.9
ms against 13.1 / 13.9 at 2 / 4 rows), and the fixed choice made a verify of 4 cost 3.5x a plain step.
So each weight shape takes `weight @ x.T` for a row count only where that product measured faster here.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

import torch
from torch import nn
from torch.nn import functional as F

SKINNY_ROWS = range(2, 5)  # the row counts measured: from 5 rows on the GEMM holds its own
MARGIN = 0.9  # the other product must take under 90 % of F.linear's time: a tie keeps F.linear
_chosen: dict[tuple, frozenset[int]] = {}  # (out, in, dtype) -> its rows, measured once per process


class SkinnyLinear(nn.Linear):
    """nn.Linear whose CPU inference forward of `skinny_rows` rows multiplies as weight @ x.T: the same
    product summed in another order, so results agree to float rounding."""

    skinny_rows: frozenset[int] = frozenset()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # called ~240 times a decoding step: the checks stay cheap (x.is_cpu, not x.device.type)
        rows = x.numel() // self.in_features
        if rows not in self.skinny_rows or not x.is_cpu or torch.is_grad_enabled():
            return super().forward(x)
        out = torch.mm(self.weight, x.reshape(rows, self.in_features).t()).t().contiguous()
        if self.bias is not None:
            out += self.bias
        return out.view(*x.shape[:-1], self.out_features)


def _seconds(product: Callable[[], torch.Tensor]) -> float:
    """The least of a few timed calls, after an untimed one (one timed call where a call is slow)."""
    product()
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        product()
        best = min(best, time.perf_counter() - start)
        if best > 0.05:
            break
    return best


def faster_rows(weight: torch.Tensor, rows: Iterable[int] = SKINNY_ROWS,
                seconds: Callable[[Callable[[], torch.Tensor]], float] = _seconds) -> frozenset[int]:
    """The row counts for which weight @ x.T runs faster than F.linear on this machine (measured once
    per weight shape and dtype; `seconds` times a call)."""
    key = (*weight.shape, weight.dtype)
    if key not in _chosen:
        found = set()
        generator = torch.Generator().manual_seed(0)  # the global stream stays the caller's
        with torch.inference_mode():
            for n in rows:
                x = torch.randn(n, weight.shape[1], generator=generator).to(weight.dtype)
                if seconds(lambda: torch.mm(weight, x.t())) < MARGIN * seconds(lambda: F.linear(x, weight)):
                    found.add(n)
        _chosen[key] = frozenset(found)
    return _chosen[key]


def use_skinny_linears(model: nn.Module, rows: Iterable[int] | None = None) -> int:
    """Switch every plain nn.Linear in `model` to SkinnyLinear in place (same parameters, same state
    dict), each taking the other product for the rows it measured faster at (`rows`: these, unmeasured);
    returns how many. For the torch runtime on a CPU only: exporters trace F.linear; on a GPU no rows
    take it."""
    count = 0
    for module in model.modules():
        if type(module) is nn.Linear:
            module.__class__ = SkinnyLinear
            on_cpu = module.weight.device.type == "cpu"
            module.skinny_rows = frozenset(rows) if rows is not None else (
                faster_rows(module.weight.detach()) if on_cpu else frozenset())
            count += 1
    return count

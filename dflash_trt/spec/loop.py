"""The reference DFlash loop: the oracle every backend (torch, ONNX Runtime, TensorRT) is tested against.

Each step: draft a block in one drafter pass, verify it in one target pass, keep the accepted
prefix plus one target token, roll the target cache back to what was kept, and hand the kept
positions' features to the drafter (KV injection). Stopping is the caller's business: these
generators run until the caller stops iterating.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol

import torch

from dflash_trt.spec.acceptance import accept
from dflash_trt.spec.sampling import Sampler


class TargetSession(Protocol):
    """One request's view of the target: a KV cache that grows on `commit`."""

    def prefill(self, prompt: list[int]) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Run and commit the prompt -> (last-position logits [V], tapped features [P, F] or None)."""

    def forward(self, ids: list[int]) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Feed ids after the committed prefix -> (logits [n, V], tapped features [n, F] or None)."""

    def commit(self, keep: int) -> None:
        """Keep the first `keep` tokens of the last forward in the cache; drop the rest."""


class DraftSession(Protocol):
    """One request's view of the drafter: a context K/V cache fed by target features."""

    def draft(self, features: torch.Tensor, bonus: int, block_size: int) -> list[int]:
        """Inject features [n, F] (the next n committed positions), then draft block_size-1 tokens after `bonus`."""


@dataclass
class Step:
    tokens: list[int]  # committed this step, in order
    accepted: int | None = None  # drafts accepted (None: not a verify step)
    draft_s: float = 0.0
    verify_s: float = 0.0


def speculative_decode(
    target: TargetSession, drafter: DraftSession, prompt: list[int], block_size: int, sampler: Sampler
) -> Iterator[Step]:
    if sampler.params.adjusts_logits or sampler.params.structured_output is not None:
        raise ValueError("the reference speculative loop does not adjust logits (autoregressive_decode does)")
    logits, features = target.prefill(prompt)
    bonus = sampler.sample(logits)
    yield Step([bonus])
    while True:
        t0 = time.perf_counter()
        drafts = drafter.draft(features, bonus, block_size)  # block = [bonus, MASK...] -> B-1 tokens
        t1 = time.perf_counter()
        logits, features = target.forward([bonus, *drafts])  # verify all B positions at once
        n, bonus = accept(drafts, logits, sampler)  # n drafts kept; `bonus` leads the next block
        target.commit(n + 1)  # block slots 0..n stay in the cache
        features = features[: n + 1]  # ...and their features feed the drafter next step
        yield Step([*drafts[:n], bonus], n, t1 - t0, time.perf_counter() - t1)


def autoregressive_decode(target: TargetSession, prompt: list[int], sampler: Sampler) -> Iterator[Step]:
    """The baseline: one target forward per token, on the same backend."""
    if sampler.params.structured_output is not None:
        raise ValueError("the reference loops do not constrain output (the core does: csrc/constraint.h)")
    logits, _ = target.prefill(prompt)
    token = sampler.sample(logits)
    outputs = [token]
    yield Step([token])
    while True:
        t0 = time.perf_counter()
        logits, _ = target.forward([token])
        target.commit(1)
        token = sampler.sample(logits[-1], outputs)
        outputs.append(token)
        yield Step([token], verify_s=time.perf_counter() - t0)

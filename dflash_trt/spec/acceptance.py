"""Acceptance rules: which drafted tokens the target keeps, and the token that follows them.

Both rules return (n, next_token): the first n drafts are accepted and `next_token` is the
target's own token at the first position it did not accept (the bonus when all are accepted).
Every committed token is therefore one the target would have produced itself.
"""

from __future__ import annotations

import torch

from dflash_trt.spec.sampling import Sampler, target_probs


def accept_greedy(drafts: list[int], logits: torch.Tensor) -> tuple[int, int]:
    """Longest prefix of drafts equal to the target's argmax. logits [len(drafts)+1, V]."""
    choice = logits.argmax(dim=-1).tolist()
    n = 0
    while n < len(drafts) and drafts[n] == choice[n]:
        n += 1
    return n, choice[n]


def accept_point_mass(drafts: list[int], logits: torch.Tensor, sampler: Sampler) -> tuple[int, int]:
    """Speculative rejection sampling with the draft as a point mass (q(d) = 1).

    Accept d with probability min(1, p(d)/q(d)) = p(d); on rejection sample from
    norm(max(p - q, 0)) = p with d removed, renormalised. Exact for any draft (Leviathan et al.).
    """
    probs = target_probs(logits, sampler.params)  # [len(drafts)+1, V]
    for j, draft in enumerate(drafts):
        p = probs[j]
        if sampler.uniform() < float(p[draft]):
            continue
        residual = p.clone()
        residual[draft] = 0
        return j, sampler.draw(residual / residual.sum())
    return len(drafts), sampler.draw(probs[len(drafts)])


def accept(drafts: list[int], logits: torch.Tensor, sampler: Sampler) -> tuple[int, int]:
    if sampler.params.greedy:
        return accept_greedy(drafts, logits)
    return accept_point_mass(drafts, logits, sampler)

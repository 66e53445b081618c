"""Distribution checks shared by the acceptance tests of the Python rule (tests/spec) and the C++ core
(tests/core): count what a rule emits over many draws, and chi-square the counts against a target."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from scipy.stats import chisquare


def emitted(accept_once: Callable[[int], tuple[int, int]], drafts: list[int], vocab: int,
            draws: int) -> tuple[np.ndarray, np.ndarray]:
    """Counts of the first emitted token, and of the second given the first equals drafts[0].
    `accept_once(i)` runs draw i of the rule -> (drafts accepted, the token after them)."""
    first, second = np.zeros(vocab), np.zeros(vocab)
    for draw in range(draws):
        n, nxt = accept_once(draw)
        tokens = [*drafts[:n], nxt]
        first[tokens[0]] += 1
        if tokens[0] == drafts[0] and len(tokens) > 1:
            second[tokens[1]] += 1
    return first, second


def fits(counts: np.ndarray, probs) -> float:
    """Chi-square p-value of `counts` against `probs` (numpy or torch); none outside the support."""
    probs = np.asarray(probs, dtype=np.float64)
    support = probs > 0
    assert counts[~support].sum() == 0, "sampled a token the filters removed"
    expected = probs[support] / probs[support].sum() * counts.sum()
    return chisquare(counts[support], expected).pvalue

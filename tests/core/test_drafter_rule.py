"""The drafter-distribution rule (csrc/acceptance.cpp: draw_draft, accept_drafter) as the slot executor
runs it, through `_core.drafter_step`: drafts drawn from the drafter's q, kept with min(1, p/q), a
rejection drawn from (p - q)+. Every emitted token follows the target's distribution exactly
(chi-square, and a check that the test rejects a rule that resamples from p instead of the residual);
drafts follow q; a step is a pure function of its key."""

import numpy as np
import pytest
import torch
from acceptance_checks import fits

from dflash_trt.errors import DFlashError
from dflash_trt.spec.sampling import SamplingParams, target_probs

VOCAB = 7
DRAWS = 6000
PARAMS = [
    {"temperature": 1.0, "seed": 1},
    {"temperature": 0.7, "top_k": 4, "seed": 2},
    {"temperature": 1.3, "top_p": 0.8, "seed": 3},
    {"temperature": 1.0, "top_k": 5, "top_p": 0.9, "seed": 4},
]


def _rows(seed: int, drafts: int = 2, vocab: int = VOCAB, draft_vocab: int = VOCAB):
    gen = torch.Generator().manual_seed(seed)
    target = torch.randn(drafts + 1, vocab, generator=gen) * 1.5
    drafter = torch.randn(drafts, draft_vocab, generator=gen) * 1.5  # another distribution than the target's
    return target, drafter


def _emitted(core, target, drafter, params, draft_vocab=()):
    """Counts of the first emitted token, of the second where the first draft was kept, and of the
    first draft drawn, over DRAWS independent keys (one request id each)."""
    first, second, drafted = (np.zeros(target.shape[1]) for _ in range(3))
    rows, draft_rows = target.numpy(), drafter.numpy()
    for request in range(DRAWS):
        drafts, n, nxt = core.drafter_step(rows, draft_rows, params, request, 11, list(draft_vocab))
        tokens = [*drafts[:n], nxt]
        first[tokens[0]] += 1
        drafted[drafts[0]] += 1
        if n >= 1:
            second[tokens[1]] += 1
    return first, second, drafted


@pytest.mark.parametrize("kwargs", PARAMS, ids=["T1", "T0.7-k4", "T1.3-p0.8", "k4-p0.9"])
def test_the_drafter_rule_emits_the_target_distribution_exactly(core, kwargs):
    target, drafter = _rows(sum(map(ord, str(kwargs))))
    params = SamplingParams(**kwargs)
    p, q = target_probs(target, params), target_probs(drafter, params)
    first, second, drafted = _emitted(core, target, drafter, core.SamplingParams(**kwargs))
    assert fits(first, p[0]) > 1e-3
    assert second.sum() > 300 and fits(second, p[1]) > 1e-3
    assert fits(drafted, q[0]) > 1e-3  # drafts are the drafter's draws, under the same cuts


def test_a_draft_vocabulary_maps_q_onto_the_target_ids(core):
    """The drafter proposes 4 of the 7 ids: q is 0 on the rest, which only the residual emits."""
    vocab_ids = [0, 2, 3, 6]
    target, drafter = _rows(21, draft_vocab=len(vocab_ids))
    kwargs = {"temperature": 1.0, "seed": 5}
    p = target_probs(target, SamplingParams(**kwargs))
    first, second, drafted = _emitted(core, target, drafter, core.SamplingParams(**kwargs), vocab_ids)
    assert drafted[[1, 4, 5]].sum() == 0
    assert first[[1, 4, 5]].sum() > 0  # emitted by rejections only
    assert fits(first, p[0]) > 1e-3
    assert second.sum() > 300 and fits(second, p[1]) > 1e-3


def test_the_distribution_test_catches_resampling_from_p(core):
    """Drawing a rejection from p rather than (p - q)+ over-weights what q under-weights; the counts
    of the real rule fit p and those of that biased rule, computed exactly here, do not."""
    target, drafter = _rows(31, drafts=1)
    kwargs = {"temperature": 1.0, "seed": 6}
    p = target_probs(target, SamplingParams(**kwargs))[0].double().numpy()
    q = target_probs(drafter, SamplingParams(**kwargs))[0].double().numpy()
    kept = np.minimum(p, q)  # P(draft d drawn and kept) = q(d) min(1, p(d)/q(d))
    biased = kept + (1 - kept.sum()) * p
    first, _, _ = _emitted(core, target, drafter, core.SamplingParams(**kwargs))
    assert fits(first, p) > 1e-3
    assert fits(first, biased) < 1e-6


def test_a_step_is_a_function_of_its_key(core):
    target, drafter = _rows(41, drafts=4)
    params = core.SamplingParams(temperature=0.9, top_p=0.95, seed=12)
    rows, draft_rows = target.numpy(), drafter.numpy()
    steps = [core.drafter_step(rows, draft_rows, params, request, 5, []) for request in range(50)]
    assert steps == [core.drafter_step(rows, draft_rows, params, request, 5, []) for request in range(50)]
    assert len({tuple(s[0]) for s in steps}) > 1  # other keys draw other drafts
    moved = [core.drafter_step(rows, draft_rows, params, request, 6, []) for request in range(50)]
    assert moved != steps  # the position is part of the key


def test_drafts_are_drawn_only_at_t_above_0(core):
    target, drafter = _rows(51, drafts=3)
    with pytest.raises(DFlashError, match="at temperature > 0"):  # greedy drafts are the graph's argmax
        core.drafter_step(target.numpy(), drafter.numpy(), core.SamplingParams(), 0, 0, [])


def test_bad_shapes_are_one_line_errors(core):
    target, drafter = _rows(61, drafts=2)
    params = core.SamplingParams(temperature=1.0)
    with pytest.raises(DFlashError, match="draft_logits must have one column per draft_vocab id"):
        core.drafter_step(target.numpy(), drafter.numpy(), params, 0, 0, [1, 2])
    with pytest.raises(DFlashError, match="logits must have shape"):
        core.drafter_step(target.numpy(), drafter[:1].numpy(), params, 0, 0, [])

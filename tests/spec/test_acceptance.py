"""Acceptance rules. T>0: the emitted tokens follow the target distribution exactly (chi-square),
and the same test rejects a deliberately biased rule, so it can fail."""

import pytest
import torch
from acceptance_checks import emitted as count_emitted
from acceptance_checks import fits

from dflash_trt.spec.acceptance import accept_greedy, accept_point_mass
from dflash_trt.spec.sampling import Sampler, SamplingParams, target_probs

VOCAB = 6
DRAWS = 5000


def test_greedy_accepts_the_matching_prefix_and_adds_the_target_token():
    logits = torch.full((4, VOCAB), -1.0)
    for position, token in enumerate([2, 5, 1, 3]):
        logits[position, token] = 1.0
    assert accept_greedy([2, 5, 1], logits) == (3, 3)  # all accepted, bonus from the last row
    assert accept_greedy([2, 4, 1], logits) == (1, 5)  # first mismatch at slot 1: target's token
    assert accept_greedy([0, 5, 1], logits) == (0, 2)
    assert accept_greedy([], logits[:1]) == (0, 2)


def biased_accept(drafts, logits, sampler):
    """Wrong on purpose: on rejection, resamples from p WITHOUT removing the rejected draft."""
    probs = target_probs(logits, sampler.params)
    for j, draft in enumerate(drafts):
        if sampler.uniform() < float(probs[j, draft]):
            continue
        return j, sampler.draw(probs[j])
    return len(drafts), sampler.draw(probs[-1])


def emitted(rule, drafts, logits, params, draws):
    """Counts of the first emitted token, and of the second given the first equals drafts[0]."""
    sampler = Sampler(params)
    return count_emitted(lambda _: rule(drafts, logits, sampler), drafts, VOCAB, draws)


PARAMS = [
    SamplingParams(temperature=1.0, seed=1),
    SamplingParams(temperature=0.7, top_k=3, seed=2),
    SamplingParams(temperature=1.3, top_p=0.8, seed=3),
    SamplingParams(temperature=1.0, top_k=4, top_p=0.9, seed=4),
]


@pytest.mark.parametrize("params", PARAMS, ids=["T1", "T0.7-k3", "T1.3-p0.8", "k4-p0.9"])
@pytest.mark.parametrize("draft_rank", [0, 2], ids=["draft-is-mode", "draft-is-third"])
def test_point_mass_rejection_sampling_is_exact(params, draft_rank):
    gen = torch.Generator().manual_seed(draft_rank)
    logits = torch.randn(3, VOCAB, generator=gen) * 1.5
    probs = target_probs(logits, params)
    d0 = int(probs[0].argsort(descending=True)[draft_rank])
    d1 = int(probs[1].argmax())
    first, second = emitted(accept_point_mass, [d0, d1], logits, params, DRAWS)
    assert fits(first, probs[0]) > 1e-3
    assert second.sum() > 300 and fits(second, probs[1]) > 1e-3


def test_the_distribution_test_catches_a_biased_rule():
    params = PARAMS[0]
    logits = torch.randn(3, VOCAB, generator=torch.Generator().manual_seed(5))
    probs = target_probs(logits, params)
    drafts = [int(probs[0].argsort()[2]), 0]
    first, _ = emitted(biased_accept, drafts, logits, params, DRAWS)
    assert fits(first, probs[0]) < 1e-6
    first, _ = emitted(accept_point_mass, drafts, logits, params, DRAWS)
    assert fits(first, probs[0]) > 1e-3


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Thousands of tiny ops: one thread avoids oversubscription when other jobs share the CPU."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)

"""Acceptance (csrc/acceptance.cpp). Greedy equals the Python oracle; point-mass speculative sampling
(sample, then compare) emits the target distribution exactly (chi-square, with a check that the
test can reject a biased rule) and each token is the target's own draw at its position; a request's
tokens depend only on its own key, never on other requests."""

import numpy as np
import pytest
import torch
from acceptance_checks import emitted as count_emitted
from acceptance_checks import fits

from dflash_trt.errors import DFlashError
from dflash_trt.spec.acceptance import accept_greedy
from dflash_trt.spec.sampling import SamplingParams, target_probs

VOCAB = 6
DRAWS = 5000


def test_greedy_equals_the_python_oracle_on_many_random_cases(core):
    gen = torch.Generator().manual_seed(0)
    for case in range(2000):
        vocab = int(torch.randint(1, 40, (), generator=gen))
        drafted = int(torch.randint(0, 8, (), generator=gen))
        if case % 3 == 0:  # integer logits: many ties, where argmax must take the first index
            logits = torch.randint(-2, 3, (drafted + 1, vocab), generator=gen).float()
        else:
            logits = torch.randn(drafted + 1, vocab, generator=gen)
        # Drafts follow the argmax for a random prefix, then go astray, so every n gets exercised.
        drafts = logits[:-1].argmax(-1).tolist()
        cut = int(torch.randint(0, drafted + 1, (), generator=gen))
        for j in range(cut, drafted):
            drafts[j] = int(torch.randint(0, vocab, (), generator=gen))
        assert core.accept_greedy(drafts, logits.numpy()) == accept_greedy(drafts, logits), (case, drafts)


def test_greedy_accept_through_the_dispatcher(core):
    logits = torch.full((4, VOCAB), -1.0)
    for position, token in enumerate([2, 5, 1, 3]):
        logits[position, token] = 1.0
    greedy = core.SamplingParams()
    assert core.accept([2, 5, 1], logits.numpy(), greedy, 0, 0) == (3, 3)
    assert core.accept([2, 4, 1], logits.numpy(), greedy, 0, 0) == (1, 5)
    assert core.accept([], logits[:1].numpy(), greedy, 0, 0) == (0, 2)


def emitted(core, drafts, logits, params, draws):
    """Counts of the first emitted token, and of the second given the first equals drafts[0].
    Each draw is its own request id, so the draws are independent keys of the counter RNG."""
    rows = logits.numpy()
    return count_emitted(lambda request: core.accept(drafts, rows, params, request, 17), drafts, VOCAB, draws)


PARAMS = [
    {"temperature": 1.0, "seed": 1},
    {"temperature": 0.7, "top_k": 3, "seed": 2},
    {"temperature": 1.3, "top_p": 0.8, "seed": 3},
    {"temperature": 1.0, "top_k": 4, "top_p": 0.9, "seed": 4},
]


@pytest.mark.parametrize("kwargs", PARAMS, ids=["T1", "T0.7-k3", "T1.3-p0.8", "k4-p0.9"])
@pytest.mark.parametrize("draft_rank", [0, 2], ids=["draft-is-mode", "draft-is-third"])
def test_point_mass_rejection_sampling_is_exact(core, kwargs, draft_rank):
    logits = torch.randn(3, VOCAB, generator=torch.Generator().manual_seed(draft_rank)) * 1.5
    probs = target_probs(logits, SamplingParams(**kwargs))
    d0 = int(probs[0].argsort(descending=True)[draft_rank])
    d1 = int(probs[1].argmax())
    first, second = emitted(core, [d0, d1], logits, core.SamplingParams(**kwargs), DRAWS)
    assert fits(first, probs[0]) > 1e-3
    assert second.sum() > 300 and fits(second, probs[1]) > 1e-3


def test_the_distribution_test_catches_a_biased_rule(core):
    """Resampling from p without removing the rejected draft over-weights the draft: the counts of
    the real rule must fit p and must NOT fit that biased mixture."""
    params = {"temperature": 1.0, "seed": 1}
    logits = torch.randn(3, VOCAB, generator=torch.Generator().manual_seed(5))
    p = target_probs(logits, SamplingParams(**params))[0].double().numpy()
    draft = int(np.argsort(p)[2])
    biased = (1 - p[draft]) * p
    biased[draft] += p[draft]
    first, _ = emitted(core, [draft, 0], logits, core.SamplingParams(**params), DRAWS)
    assert fits(first, p) > 1e-3
    assert fits(first, biased) < 1e-6


def test_all_accepted_draws_the_bonus_from_the_last_row(core):
    logits = torch.full((3, VOCAB), -30.0)
    logits[0, 1] = logits[1, 4] = 30.0  # p(draft) == 1: always accepted
    logits[2] = torch.randn(VOCAB, generator=torch.Generator().manual_seed(9))
    params = {"temperature": 1.0, "seed": 8}
    counts = np.zeros(VOCAB)
    for request in range(DRAWS):
        n, bonus = core.accept([1, 4], logits.numpy(), core.SamplingParams(**params), request, 3)
        assert n == 2
        counts[bonus] += 1
    assert fits(counts, target_probs(logits[2], SamplingParams(**params)).numpy()) > 1e-3


def test_each_committed_token_is_the_targets_own_draw_at_its_position(core):
    """Sample, then compare: whatever was drafted, the token emitted at a position is the one `sample`
    draws there, so a request's tokens do not depend on its drafts or its block size."""
    gen = torch.Generator().manual_seed(11)
    params = core.SamplingParams(temperature=1.1, top_k=5, top_p=0.9, seed=77)
    accepted_some = rejected_some = False
    for case in range(300):
        drafted = int(torch.randint(0, 6, (), generator=gen))
        logits = (torch.randn(drafted + 1, VOCAB, generator=gen) * 2).numpy()
        own = [core.sample(logits[j], params, case, 40 + j) for j in range(drafted + 1)]
        # drafts follow the target's draws for a random prefix, then are random
        cut = int(torch.randint(0, drafted + 1, (), generator=gen))
        drafts = own[:cut] + torch.randint(0, VOCAB, (drafted - cut,), generator=gen).tolist()
        n, nxt = core.accept(drafts, logits, params, case, 40)
        assert [*drafts[:n], nxt] == own[: n + 1], case
        accepted_some |= n > 0
        rejected_some |= n < drafted
    assert accepted_some and rejected_some


def test_a_requests_tokens_do_not_depend_on_other_requests(core):
    """The same request decided alone, then interleaved with other requests in another order,
    commits the same tokens: its randomness is keyed by (seed, request, position) only."""
    gen = torch.Generator().manual_seed(3)
    params = core.SamplingParams(temperature=0.9, top_p=0.95, seed=42)
    steps = [(torch.randint(0, 20, (3,), generator=gen).tolist(), torch.randn(4, 20, generator=gen).numpy())
             for _ in range(50)]

    def run(request, interleave):
        out = []
        for position, (drafts, logits) in enumerate(steps):
            for other in interleave:
                core.accept(drafts, logits, params, other, position)
            out.append(core.accept(drafts, logits, params, request, position * 4))
        return out

    alone = run(7, [])
    assert run(7, [1, 2, 3]) == alone
    assert run(7, [9]) == alone
    assert run(8, []) != alone, "another request id must draw different numbers"


def test_bad_inputs_are_one_line_dflash_errors(core):
    params = core.SamplingParams(temperature=1.0)
    with pytest.raises(DFlashError, match=r"shape \[3, vocab\]"):
        core.accept([1, 2], np.zeros((2, 5), np.float32), params, 0, 0)
    with pytest.raises(DFlashError, match="outside the target vocabulary of 5") as err:
        core.accept([1, 7], np.zeros((3, 5), np.float32), params, 0, 0)
    assert "\n" not in str(err.value)

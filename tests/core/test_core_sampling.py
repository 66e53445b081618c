"""Target distribution (csrc/sampling.cpp) against the Python oracle dflash_trt.spec.sampling.target_probs."""

import numpy as np
import pytest
import torch

from dflash_trt.errors import DFlashError
from dflash_trt.spec.sampling import SamplingParams, target_probs

CASES = [
    # (temperature, top_k, top_p, vocab)
    (1.0, 0, 1.0, 50),
    (0.7, 5, 1.0, 50),
    (1.3, 0, 0.8, 50),
    (0.9, 8, 0.85, 300),
    (0.05, 0, 1.0, 40),  # nearly greedy: one token carries almost all the mass
    (10.0, 0, 0.95, 40),  # nearly flat: the nucleus keeps most of the vocabulary
    (1.0, 1, 1.0, 30),  # top-k = 1: a point mass
    (1.0, 29, 1.0, 30),  # top-k = vocab - 1
    (1.0, 30, 1.0, 30),  # top-k = vocab: no cut
    (1.0, 500, 1.0, 30),  # top-k > vocab: no cut
    (1.0, 0, 1e-4, 30),  # top-p tiny: only the first token stays
    (0.8, 3, 0.5, 1000),
    (1.0, 0, 1.0, 1),  # one-token vocabulary
]


@pytest.mark.parametrize("temperature, top_k, top_p, vocab", CASES)
def test_target_probs_equal_the_python_oracle(core, temperature, top_k, top_p, vocab):
    logits = torch.randn(5, vocab, generator=torch.Generator().manual_seed(vocab + top_k)) * 3
    params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p)
    expected = target_probs(logits, params)
    ours = torch.from_numpy(core.target_probs(logits.numpy(), core.SamplingParams(
        temperature=temperature, top_k=top_k, top_p=top_p)))
    assert torch.equal(ours > 0, expected > 0), "different tokens survive the filters"
    torch.testing.assert_close(ours, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("top_k", [1, 2, 3, 4])
def test_top_k_keeps_every_token_tied_at_the_boundary(core, top_k):
    """Integer logits with many ties: every score equal to the k-th largest stays, as in the oracle."""
    logits = torch.tensor([[3.0, 1.0, 3.0, 2.0, 2.0, 2.0, 0.0, 1.0]])
    expected = target_probs(logits, SamplingParams(temperature=1.0, top_k=top_k))
    ours = torch.from_numpy(core.target_probs(logits.numpy(), core.SamplingParams(temperature=1.0, top_k=top_k)))
    torch.testing.assert_close(ours, expected, rtol=1e-5, atol=1e-6)


def test_the_comparison_can_fail(core):
    """A different filter gives a detectably different row, so the parity tests above have teeth."""
    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(0))
    expected = target_probs(logits, SamplingParams(temperature=1.0, top_p=0.9))
    ours = torch.from_numpy(core.target_probs(logits.numpy(), core.SamplingParams(temperature=1.0, top_p=0.8)))
    assert not torch.equal(ours > 0, expected > 0)


def test_sample_is_argmax_at_temperature_zero_and_stays_in_the_support_otherwise(core):
    gen = torch.Generator().manual_seed(1)
    greedy = core.SamplingParams()
    params = core.SamplingParams(temperature=1.0, top_k=3, seed=4)
    for request in range(200):
        row = torch.randn(20, generator=gen)
        assert core.sample(row.numpy(), greedy, request, 0) == int(row.argmax())
        allowed = set(row.topk(3).indices.tolist())
        assert core.sample(row.numpy(), params, request, 5) in allowed


NO_TOKEN = -2  # decide.h's kNoToken: a row whose logits give no token


@pytest.mark.parametrize("temperature", [1e-40, 1e-45])
@pytest.mark.parametrize("cuts", [{}, {"top_k": 3}, {"top_p": 0.9}])
def test_a_temperature_whose_scores_overflow_is_the_argmax_limit(core, temperature, cuts):
    """logits / T past float32's range (inf, and inf - inf is NaN): the distribution's limit as T -> 0+,
    the largest logits alone, tied ones sharing."""
    logits = torch.randn(6, 40, generator=torch.Generator().manual_seed(2)) * 3
    logits[5, [4, 9]] = 50.0  # a tie at the top
    params = core.SamplingParams(temperature=temperature, **cuts)
    probs = torch.from_numpy(core.target_probs(logits.numpy(), params))
    expected = torch.zeros_like(logits)
    expected[torch.arange(5), logits[:5].argmax(dim=1)] = 1.0
    expected[5, [4, 9]] = 0.5
    torch.testing.assert_close(probs, expected)
    for request in range(20):
        assert core.sample(logits[0].numpy(), params, request, 3) == int(logits[0].argmax())
        assert core.block_accept([], logits[:1].numpy(), params, request, 3, 4) == (0, int(logits[0].argmax()))
    assert {core.sample(logits[5].numpy(), params, request, 3) for request in range(40)} == {4, 9}


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_a_row_with_a_nan_logit_gives_no_token(core, temperature):
    """A NaN logit (a float16 overflow, corrupt weights) is no token the model meant: not torch.argmax's
    first NaN, nor a draw from NaN probabilities. The verify ends there with NO_TOKEN, which fails the
    request (the scheduler's rule)."""
    logits = torch.randn(2, 30, generator=torch.Generator().manual_seed(4))
    logits[1, 11] = float("nan")
    params = core.SamplingParams(temperature=temperature, seed=1)
    assert core.sample(logits[1].numpy(), params, 0, 0) == NO_TOKEN
    assert core.sample(logits[0].numpy(), params, 0, 0) >= 0
    draft = core.sample(logits[0].numpy(), params, 0, 0)  # the target's own token at position 0: kept
    assert core.accept([draft], logits.numpy(), params, 0, 0) == (1, NO_TOKEN)
    assert core.block_accept([draft], logits.numpy(), params, 0, 0, 4) == (1, NO_TOKEN)


@pytest.mark.parametrize("kwargs, field", [
    ({"temperature": -0.1}, "temperature"),
    ({"top_p": 0.0}, "top_p"),
    ({"top_p": 1.5}, "top_p"),
    ({"top_k": -1}, "top_k"),
])
def test_bad_params_are_one_line_dflash_errors(core, kwargs, field):
    with pytest.raises(DFlashError, match=f"SamplingParams.{field}") as err:
        core.SamplingParams(**kwargs)
    assert "\n" not in str(err.value)


def test_target_probs_refuses_greedy_params_and_bad_shapes(core):
    with pytest.raises(DFlashError, match="temperature > 0"):
        core.target_probs(np.zeros((1, 4), np.float32), core.SamplingParams())
    with pytest.raises(DFlashError, match=r"shape \[rows, vocab\]"):
        core.target_probs(np.zeros(4, np.float32), core.SamplingParams(temperature=1.0))


@pytest.mark.parametrize("size", [0, 1, 2, 3, 7, 64, 100, 1000, 4097])
def test_the_decision_kernels_sort_orders_by_probability_then_token_id(core, size):
    # decide.h's device sort (bitonic, sizes not powers of two too), compiled for the host: probabilities
    # on a coarse grid, so ties are many
    probs = np.round(np.random.default_rng(size).random(size) * 8) / 8
    want = sorted(range(size), key=lambda i: (-probs[i], i))
    assert core.device_sort_order(probs.astype(np.float32).tolist()) == want


CATEGORICAL_DRAW = 1  # csrc/rng.h: the uniform that picks a token


def inverse_cdf_over_fixed_chunks(probs: np.ndarray, u: float, chunks: int = 512) -> int:
    """decide.h's draw rule, written again from its comment: double sums over the fixed partition (chunk c
    = [V c / 512, V (c + 1) / 512), each summed in index order, then the chunks in order); the first chunk
    whose running total passes u x total, walked token by token (zeros skipped) until it passes."""
    vocab = len(probs)
    bounds = [vocab * c // chunks for c in range(chunks + 1)]
    sums = []
    for c in range(chunks):
        total = 0.0
        for p in probs[bounds[c]:bounds[c + 1]]:
            total += float(p)
        sums.append(total)
    grand = 0.0
    for total in sums:
        grand += total
    target, before, token = u * grand, 0.0, -1
    for c in range(chunks):
        if before + sums[c] > target:
            running = before
            for i in range(bounds[c], bounds[c + 1]):
                if probs[i] <= 0:
                    continue
                running += float(probs[i])
                token = i
                if running > target:
                    break
            return token
        before += sums[c]
    return int(np.flatnonzero(probs > 0)[-1])


@pytest.mark.parametrize("vocab", [5000, 151936])
def test_a_draw_is_the_inverse_cdf_over_the_fixed_chunks(core, vocab):
    """Chunks of many tokens (a small vocabulary has at most one token a chunk, which no other test reaches)."""
    rng = np.random.default_rng(vocab)
    for k in range(6):
        row = (rng.standard_normal(vocab) * 2).astype(np.float32)
        params = core.SamplingParams(temperature=1.0, top_p=0.9 if k % 2 else 1.0, seed=k)
        probs = core.target_probs(row[None], params)[0]
        want = inverse_cdf_over_fixed_chunks(probs, core.uniform(k, 3, 7 + k, CATEGORICAL_DRAW))
        assert core.sample(row, params, 3, 7 + k) == want

"""Penalties in the core (repetition, frequency, presence: csrc/penalties.h), against the Python
reference (spec/sampling.py `penalize`, written apart): the host rule and the GPU kernel's strided form
give the reference's logits bit for bit at every position of a verify block; decoding with penalties
on the onnxruntime executor equals the reference loop's penalized autoregressive decoding (greedy,
with DFlash and plainly, drafts accepted); and a seeded T>0 request gives the same tokens with DFlash
as plainly, alone as in a batch (each verify position is penalized by the drafts before it)."""

from collections import Counter

import numpy as np
import pytest
import torch
from factories import make_drafter, make_target

from dflash_trt import SamplingParams
from dflash_trt.export.bundle import export_bundle
from dflash_trt.models.checkpoints import load_drafter, load_target
from dflash_trt.runtime.torch_backend import TorchTargetSession
from dflash_trt.spec.loop import autoregressive_decode
from dflash_trt.spec.sampling import Sampler, penalize
from dflash_trt.spec.stopping import StopChecker

PENALTIES = [dict(repetition_penalty=1.3), dict(frequency_penalty=0.7), dict(presence_penalty=1.5),
             dict(repetition_penalty=0.8, frequency_penalty=-0.4, presence_penalty=0.6)]
# min_tokens bans the stop tokens (3 and 45 here) while the output is shorter; logit_bias adds
ADJUSTMENTS = PENALTIES + [dict(logit_bias={4: 5.0, 45: -2.5, 11: 100.0}), dict(min_tokens=11),
                           dict(min_tokens=13, logit_bias={3: 7.0}, presence_penalty=1.0, repetition_penalty=1.2),
                           dict(min_p=0.05, temperature=0.7), dict(min_p=0.2, temperature=1.3, frequency_penalty=0.5),
                           dict(min_p=1.0, temperature=0.5)]  # only the largest stays
STOP = (3, 45)


@pytest.mark.parametrize("threads", [1, 7, 256])  # 1: the host rule; more: the kernel's strides
@pytest.mark.parametrize("adjust", ADJUSTMENTS, ids=lambda p: ",".join(p))
def test_every_verify_position_is_adjusted_as_the_reference_says(core, adjust, threads):
    rng = np.random.default_rng(len(adjust) + threads)
    vocab = 50
    prompt = [int(t) for t in rng.integers(10, 30, 12)]
    outputs = [int(t) for t in rng.integers(4, 20, 9)]
    # the bonus, then drafts: one in the output, one the history lacks (twice), one only the prompt has
    block = [outputs[-1], outputs[2], 45, 45, max(set(prompt) - set(outputs)), 46]
    logits = (rng.standard_normal((len(block), vocab)) * 3).astype(np.float32)
    params = SamplingParams(max_tokens=32, **adjust)
    counts, bias = Counter(outputs), dict(params.logit_bias)
    stop = set(STOP) if params.min_tokens else set()
    history = [(t, counts[t], t in prompt, t in stop, bias.get(t, 0.0))
               for t in sorted(set(prompt) | set(outputs) | set(bias) | stop)]
    ban = max(0, params.min_tokens - len(outputs))  # position k decides output token len(outputs) + k
    native = core.SamplingParams(**{k: v for k, v in adjust.items() if k not in ("logit_bias", "min_tokens")})
    got = core.penalized_logits(logits, history, block, native, ban, threads)
    for k in range(len(block)):  # position k follows the output and the drafts block[1..k]
        expected = penalize(torch.from_numpy(logits[k]), prompt, outputs + block[1:k + 1], params, STOP).numpy()
        np.testing.assert_array_equal(got[k], expected)
    assert not np.array_equal(got, logits)
    if params.min_p:  # a cut: most tokens go, the largest stays
        assert all(np.isneginf(row).sum() > vocab // 2 and np.isfinite(row.max()) for row in got)
    if params.min_tokens:  # banned while the output is short, then free
        assert np.isneginf(got[:ban, list(STOP)]).all() and np.isfinite(got[ban:, list(STOP)]).all()


@pytest.fixture(scope="module")
def pair(ort, tmp_path_factory):
    """(slots bundle, TargetModel) over 6 tokens (MASK is 5): drafts get accepted, and penalties steer a
    reply among few tokens."""
    root = tmp_path_factory.mktemp("penalties")
    target_dir = make_target(root / "target", "qwen3", seed=5, tokenizer=False, vocab_size=6)
    draft_dir = make_drafter(root / "draft", seed=5, block_size=4, target_layer_ids=[1, 2], mask_token_id=5)
    target, _ = load_target(str(target_dir))
    bundle = export_bundle(target, load_drafter(draft_dir), None, root / "bundle", flavour="slots", check=False)
    return bundle, target


def decode(core, ort, bundle, prompts, max_block, constraints=None, **params):
    """Each prompt's tokens (and the drafts accepted in all), added at once to a fresh scheduler;
    `constraints`: each request's (csrc/constraint.h) or None."""
    executor = ort.ort_executor(bundle, max_batch=3, capacity=64)
    sched = core.Scheduler(executor, core.SchedulerConfig(max_batch=3, capacity=64, block_size=4, engine_seed=0))
    if "logit_bias" in params:
        params = {**params, "logit_bias": list(params["logit_bias"].items())}
    ids = [sched.add_request(p, core.RequestParams(ignore_eos=True, max_block=max_block, constraint=c, **params))
           for p, c in zip(prompts, constraints or [None] * len(prompts), strict=True)]
    tokens, accepted = {i: [] for i in ids}, 0
    while sched.has_work:
        for out in sched.step():
            tokens[out["request"]] += out["new_tokens"]
            if out["finish_reason"]:
                accepted += out["metrics"]["num_accepted_tokens"]
    return [tokens[i] for i in ids], accepted


PROMPTS = [[1, 2, 3, 4, 0, 1], [3, 3, 1], [4, 0, 2, 2, 1, 3, 0]]


def autoregressive(target, prompt, params):
    """The reference loop's greedy reply, adjusted and stopped by `params` (no EOS: ignore_eos)."""
    stop = StopChecker(params, (), None)
    sampler = Sampler(params, prompt, tuple(params.stop_token_ids))
    for step in autoregressive_decode(TorchTargetSession(target, ()), prompt, sampler):
        if stop.add(step.tokens):
            return stop.token_ids


@pytest.mark.parametrize("adjust", PENALTIES + [dict(logit_bias={0: -100.0, 3: 0.5})], ids=lambda p: ",".join(p))
def test_greedy_decoding_with_penalties_equals_the_penalized_autoregressive_reference(core, ort, pair, adjust):
    bundle, target = pair
    expected = [autoregressive(target, prompt, SamplingParams(max_tokens=16, ignore_eos=True, **adjust))
                for prompt in PROMPTS]
    unpenalized, _ = decode(core, ort, bundle, PROMPTS, 0, max_tokens=16)
    assert unpenalized != expected  # the penalties change these replies
    dflash, accepted = decode(core, ort, bundle, PROMPTS, 0, max_tokens=16, **adjust)
    plain, _ = decode(core, ort, bundle, PROMPTS, 1, max_tokens=16, **adjust)
    assert dflash == expected and plain == expected
    assert accepted > 0  # drafts were verified against penalized positions, and kept


def test_min_tokens_holds_a_stop_token_back_until_then(core, ort, pair):
    """A stop token the greedy reply emits early: with min_tokens 10 it cannot come before the 11th
    token (banned at the verify positions before it), and the replies equal the reference loop's."""
    bundle, target = pair
    free, _ = decode(core, ort, bundle, PROMPTS, 0, max_tokens=16)
    stop = free[0][1]  # the first reply's second token
    stopped, _ = decode(core, ort, bundle, PROMPTS, 0, max_tokens=16, stop_token_ids=[stop])
    assert len(stopped[0]) <= 2  # without min_tokens it ends the first reply at once
    params = SamplingParams(max_tokens=16, ignore_eos=True, stop_token_ids=(stop,), min_tokens=10)
    expected = [autoregressive(target, prompt, params) for prompt in PROMPTS]
    for max_block in (0, 1):
        held, _ = decode(core, ort, bundle, PROMPTS, max_block, max_tokens=16, stop_token_ids=[stop], min_tokens=10)
        assert held == expected
        assert all(stop not in reply[:10] and len(reply) >= 10 for reply in held)


@pytest.mark.parametrize("penalties", PENALTIES + [dict(min_p=0.3)], ids=lambda p: ",".join(p))
def test_a_seeded_sampled_request_with_penalties_is_the_same_with_dflash_plainly_and_in_a_batch(core, ort, pair,
                                                                                               penalties):
    bundle, _ = pair
    sampled = dict(max_tokens=20, temperature=0.9, top_p=0.95, seed=3, **penalties)
    alone, _ = decode(core, ort, bundle, PROMPTS[:1], 0, **sampled)
    batched, accepted = decode(core, ort, bundle, PROMPTS, 0, **sampled)
    plain, _ = decode(core, ort, bundle, PROMPTS, 1, **sampled)
    assert batched[0] == alone[0] and batched == plain
    assert accepted > 0

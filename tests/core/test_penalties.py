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

PENALTIES = [dict(repetition_penalty=1.3), dict(frequency_penalty=0.7), dict(presence_penalty=1.5),
             dict(repetition_penalty=0.8, frequency_penalty=-0.4, presence_penalty=0.6)]


@pytest.mark.parametrize("threads", [1, 7, 256])  # 1: the host rule; more: the kernel's strides
@pytest.mark.parametrize("penalties", PENALTIES, ids=lambda p: ",".join(p))
def test_every_verify_position_is_penalized_as_the_reference_says(core, penalties, threads):
    rng = np.random.default_rng(len(penalties) + threads)
    vocab = 50
    prompt = [int(t) for t in rng.integers(10, 30, 12)]
    outputs = [int(t) for t in rng.integers(0, 20, 9)]
    # the bonus, then drafts: one in the output, one the history lacks (twice), one only the prompt has
    block = [outputs[-1], outputs[2], 45, 45, max(set(prompt) - set(outputs)), 46]
    logits = (rng.standard_normal((len(block), vocab)) * 3).astype(np.float32)
    counts = Counter(outputs)
    history = [(t, counts[t], t in prompt) for t in sorted(set(prompt) | set(outputs))]
    got = core.penalized_logits(logits, history, block, core.SamplingParams(**penalties), threads)
    params = SamplingParams(**penalties)
    for k in range(len(block)):  # position k follows the output and the drafts block[1..k]
        expected = penalize(torch.from_numpy(logits[k]), prompt, outputs + block[1:k + 1], params).numpy()
        np.testing.assert_array_equal(got[k], expected)
        assert not np.array_equal(got[k], logits[k])


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


def decode(core, ort, bundle, prompts, max_block, **params):
    """Each prompt's tokens (and the drafts accepted in all), added at once to a fresh scheduler."""
    executor = ort.ort_executor(bundle, max_batch=3, capacity=64)
    sched = core.Scheduler(executor, core.SchedulerConfig(max_batch=3, capacity=64, block_size=4, engine_seed=0))
    ids = [sched.add_request(p, core.RequestParams(ignore_eos=True, max_block=max_block, **params)) for p in prompts]
    tokens, accepted = {i: [] for i in ids}, 0
    while sched.has_work:
        for out in sched.step():
            tokens[out["request"]] += out["new_tokens"]
            if out["finish_reason"]:
                accepted += out["metrics"]["num_accepted_tokens"]
    return [tokens[i] for i in ids], accepted


PROMPTS = [[1, 2, 3, 4, 0, 1], [3, 3, 1], [4, 0, 2, 2, 1, 3, 0]]


@pytest.mark.parametrize("penalties", PENALTIES, ids=lambda p: ",".join(p))
def test_greedy_decoding_with_penalties_equals_the_penalized_autoregressive_reference(core, ort, pair, penalties):
    bundle, target = pair
    params = SamplingParams(max_tokens=16, ignore_eos=True, **penalties)
    expected = []
    for prompt in PROMPTS:
        tokens = []
        for step in autoregressive_decode(TorchTargetSession(target, ()), prompt, Sampler(params, prompt)):
            tokens += step.tokens
            if len(tokens) >= 16:
                break
        expected.append(tokens[:16])
    unpenalized, _ = decode(core, ort, bundle, PROMPTS, 0, max_tokens=16)
    assert unpenalized != expected  # the penalties change these replies
    dflash, accepted = decode(core, ort, bundle, PROMPTS, 0, max_tokens=16, **penalties)
    plain, _ = decode(core, ort, bundle, PROMPTS, 1, max_tokens=16, **penalties)
    assert dflash == expected and plain == expected
    assert accepted > 0  # drafts were verified against penalized positions, and kept


@pytest.mark.parametrize("penalties", PENALTIES, ids=lambda p: ",".join(p))
def test_a_seeded_sampled_request_with_penalties_is_the_same_with_dflash_plainly_and_in_a_batch(core, ort, pair,
                                                                                               penalties):
    bundle, _ = pair
    sampled = dict(max_tokens=20, temperature=0.9, top_p=0.95, seed=3, **penalties)
    alone, _ = decode(core, ort, bundle, PROMPTS[:1], 0, **sampled)
    batched, accepted = decode(core, ort, bundle, PROMPTS, 0, **sampled)
    plain, _ = decode(core, ort, bundle, PROMPTS, 1, **sampled)
    assert batched[0] == alone[0] and batched == plain
    assert accepted > 0

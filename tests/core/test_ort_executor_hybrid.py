"""The C++ onnxruntime executor over slots bundles of hybrid targets (Qwen3.5, Qwen3-Next: Gated
DeltaNet layers with conv / recurrent states per slot beside full-attention K/V slots), against the
torch reference: greedy output equals autoregressive decoding, acceptance per step equals the Python
speculative loop's, a slot freed by an abort starts its next request from zero states, and phase
logits equal the torch target's through split Runs and a commit that keeps nothing."""

import numpy as np
import pytest
from factories import export_tiny_slots_bundle, make_drafter, make_target
from reference import reference_output
from scheduler_checks import decode_together, python_loop

from dflash_trt import LLM, SamplingParams
from dflash_trt.errors import DFlashError
from dflash_trt.export.bundle import export_bundle
from dflash_trt.models.checkpoints import load_drafter, load_target
from dflash_trt.runtime.torch_backend import TorchTargetSession

FAMILIES = ["qwen3_5_text", "qwen3_next"]
PROMPTS = ["abc", [5, 6, 7], "hello there", [1] * 9, "x", [3, 1, 4, 1, 5, 9, 2, 6]]


@pytest.fixture(scope="module", params=FAMILIES)
def hybrid(ort, request, tmp_path_factory):
    """(slots bundle, torch LLM over the same pair) for a tiny byte-tokenizer hybrid target."""
    family = request.param
    root = tmp_path_factory.mktemp(family)
    bundle = export_tiny_slots_bundle(root, family=family)
    return bundle, LLM(str(root / family), str(root / f"{family}-draft"), block_size=4, backend="torch")


@pytest.fixture(scope="module", params=FAMILIES)
def small_vocab(ort, request, tmp_path_factory):
    """(slots bundle, TargetModel, DFlashDrafter): a hybrid target over 6 tokens (MASK is 5), so
    greedy drafts are often accepted and commit rolls the states back to every kept length."""
    root = tmp_path_factory.mktemp(f"{request.param}-small")
    target_dir = make_target(root / "target", request.param, seed=5, tokenizer=False, vocab_size=6)
    draft_dir = make_drafter(root / "draft", seed=5, block_size=4, target_layer_ids=[1, 2], mask_token_id=5)
    target, _ = load_target(str(target_dir))
    drafter = load_drafter(draft_dir)
    bundle = export_bundle(target, drafter, None, root / "bundle", flavour="slots", check=False)
    return bundle, target, drafter


def test_the_config_splits_layers_as_the_bundle_records(ort, hybrid):
    bundle, _ = hybrid
    config = ort.executor_config(bundle, max_batch=2, capacity=32)
    # factories.linear_attention: linear, full, linear, full; 2 key heads x 16, 4 value heads x 16
    assert (list(config.attention_layers), list(config.linear_layers)) == ([1, 3], [0, 2])
    assert (config.conv_dim, config.conv_kernel) == (2 * 2 * 16 + 4 * 16, 4)
    assert (config.linear_value_heads, config.linear_key_head_dim, config.linear_value_head_dim) == (4, 16, 16)
    config.validate()


def test_validate_refuses_a_bad_layer_split_in_one_line(core, ort, hybrid):
    bundle, _ = hybrid
    cases = [
        ("linear_layers", [0], "layer 2 is in 0 of attention_layers and linear_layers"),
        ("linear_layers", [0, 1, 2], "layer 1 is in 2 of attention_layers and linear_layers"),
        ("attention_layers", [3, 1], "must be ascending layer indices"),
        ("linear_layers", [0, 2, 4], "must be ascending layer indices below target_layers"),
        ("conv_kernel", 1, "conv_kernel must be >= 2"),
        ("linear_value_heads", 0, "linear_value_heads must be >= 1"),
    ]
    for name, value, message in cases:
        config = ort.executor_config(bundle, max_batch=2, capacity=32)
        setattr(config, name, value)
        with pytest.raises(DFlashError, match=message) as err:
            core.OrtExecutor(config)
        assert "\n" not in str(err.value)


@pytest.mark.parametrize("block_size", [1, 2, 4])
def test_greedy_equals_autoregressive_decoding(hybrid, block_size):
    """Prompts of different lengths, batched 4 at a time, through LLM.from_bundle (block pinned; 1:
    plain decoding through the core) equal each prompt's autoregressive output on the torch target."""
    bundle, ref = hybrid
    llm = LLM.from_bundle(bundle, block_size=max(block_size, 2), max_batch=4, capacity=64)
    assert llm.backend == "onnxruntime"
    params = SamplingParams(max_tokens=12, ignore_eos=True)
    outs = llm.generate(PROMPTS, params, speculative=block_size > 1)
    for prompt, out in zip(PROMPTS, outs, strict=True):
        want = reference_output(ref, prompt, params)
        assert out.token_ids == want.token_ids, prompt


def scheduler(core, ort, bundle, max_batch, block_size, capacity=64):
    executor = ort.ort_executor(bundle, max_batch=max_batch, capacity=capacity)
    config = core.SchedulerConfig(max_batch=max_batch, capacity=capacity, block_size=block_size, engine_seed=0)
    return core.Scheduler(executor, config), executor


@pytest.mark.parametrize("block_size", [2, 4])
def test_acceptance_per_step_equals_the_python_loop(core, ort, small_vocab, block_size):
    """Same drafts accepted at every step: the states commit keeps are the ones after the last kept
    position (partial and zero acceptance both occur), for three rows batched."""
    bundle, target, drafter = small_vocab
    prompts, max_tokens = [[1, 2, 3], [4, 0, 4, 0, 1, 1, 2], [3]], 24
    sched, _ = scheduler(core, ort, bundle, 3, block_size)
    tokens, accepted = decode_together(core, sched, prompts, max_tokens, block_size)
    everything = []
    for ours, accepts, prompt in zip(tokens, accepted, prompts, strict=True):
        ref_tokens, ref_accepted = python_loop(target, drafter, prompt, max_tokens, block_size)
        assert ours == ref_tokens == python_loop(target, drafter, prompt, max_tokens, 1)[0]
        assert accepts == ref_accepted[: len(accepts)] and len(accepts) >= 4
        everything += accepts
    # rejections (kept 1) and accepted drafts (kept >= 2: a state past the block's first position) both happened
    assert 0 in everything and max(everything) >= 1


def test_a_slot_freed_by_an_abort_starts_from_zero_states(core, ort, small_vocab):
    """Slot 1's request is aborted mid-decode; the next request takes slot 1 and decodes as it does
    alone (its prefill zeroes the states the aborted one left), beside two rows still running."""
    bundle, target, drafter = small_vocab
    prompts = [[1, 2, 3, 4], [4, 4, 0, 1, 2, 3], [2, 0]]
    sched, executor = scheduler(core, ort, bundle, 3, block_size=4)
    params = core.RequestParams(max_tokens=16, ignore_eos=True)
    ids = [sched.add_request(p, params) for p in prompts]
    tokens = {i: [] for i in ids}
    for _ in range(3):
        for out in sched.step():
            tokens[out["request"]] += out["new_tokens"]
    assert sched.abort(ids[1]) and executor.committed(1) == 0
    late_prompt = [3, 1]
    late = sched.add_request(late_prompt, params)
    assert sched.slots.request(1) == late
    tokens[late] = []
    while sched.has_work:
        for out in sched.step():
            tokens[out["request"]] += out["new_tokens"]
    for i, prompt in [(ids[0], prompts[0]), (ids[2], prompts[2]), (late, late_prompt)]:
        assert tokens[i] == python_loop(target, drafter, prompt, 16, 1)[0], prompt


def test_phase_logits_equal_the_torch_target_through_split_runs_and_rollback(ort, small_vocab):
    """The phases one by one on rows 0 and 2 (places 0 and 1; slot 1 unused) of 12-token slots: verifies
    split into two Runs while row 0 is near capacity (each row's states come out of its own Run), a
    commit keeps 0 of row 0's block (its states stay the prefill's) and 3 of row 2's, then 2 and 1,
    and every logits row equals the torch target's."""
    bundle, target, _ = small_vocab
    executor = ort.ort_executor(bundle, max_batch=3, capacity=12)
    prompts = [[1, 2, 3, 4, 0, 1, 2, 3, 4], [2, 3]]
    # (blocks, kept, target Runs): 9 + 4 > 12 and 11 + 2 > 12 split the phase, 9 + 2 does not
    phases = [([[1, 2], [0, 1, 2, 3]], [0, 3], 2), ([[3, 3], [4]], [2, 1], 1), ([[1], [2, 0]], None, 2)]
    sessions = [TorchTargetSession(target, ()) for _ in prompts]
    for session, ours, prompt in zip(sessions, executor.prefill_logits([0, 2], prompts), prompts, strict=True):
        np.testing.assert_allclose(ours, session.prefill(prompt)[0][None].numpy(), rtol=1e-4, atol=1e-4)
    for blocks, kept, runs_per_phase in phases:
        runs = executor.target_runs
        for session, ours, block in zip(sessions, executor.verify_logits([0, 2], blocks), blocks, strict=True):
            np.testing.assert_allclose(ours, session.forward(block)[0].numpy(), rtol=1e-4, atol=1e-4)
        assert executor.target_runs - runs == runs_per_phase
        if kept is not None:
            executor.commit([0, 2], kept)
            for session, keep in zip(sessions, kept, strict=True):
                session.commit(keep)
    assert [executor.committed(r) for r in range(3)] == [11, 0, 6]

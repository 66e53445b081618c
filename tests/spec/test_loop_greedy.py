"""Lossless, greedy: speculative output equals autoregressive output token for token, for several
families, block sizes, drafters and stop conditions; and our loop matches the authors' loop."""

import pytest
import torch
from factories import OracleDraftBlock, OracleDraftSession

from dflash_trt import LLM, SamplingParams
from dflash_trt.export import graphs
from dflash_trt.runtime.torch_backend import TorchTargetSession
from dflash_trt.spec.loop import autoregressive_decode, speculative_decode
from dflash_trt.spec.sampling import Sampler
from dflash_trt.spec.stopping import StopChecker

PROMPTS = ["hello there", [17, 3, 250, 99, 4, 4, 61]]


@pytest.fixture(scope="module")
def llms(tiny_pairs):
    return {family: LLM(str(t), str(d), backend="torch") for family, (t, d) in tiny_pairs.items()}


def run(llm, prompt, params, speculative, block_size=None):
    llm.block_size = block_size or llm.block_size
    return llm.generate(prompt, params, speculative=speculative)[0]


@pytest.mark.parametrize(
    "family, block_size",
    [("llama", 2), ("llama", 8), ("qwen3", 4), ("qwen3", 16), ("qwen3_moe", 4)],
)
def test_random_drafter_greedy_equals_autoregressive(llms, family, block_size):
    llm = llms[family]
    params = SamplingParams(max_tokens=24, ignore_eos=True)
    for prompt in PROMPTS:
        ar = run(llm, prompt, params, False)
        spec = run(llm, prompt, params, True, block_size)
        assert spec.token_ids == ar.token_ids and spec.text == ar.text
        assert len(spec.token_ids) == 24 and spec.finish_reason == "length"
        assert all(1 <= tau <= block_size for tau in spec.metrics.acceptance_lengths)


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_our_autoregressive_equals_hf_generate(llms, family):
    llm = llms[family]
    ids = PROMPTS[1]
    with torch.no_grad():
        hf = llm.target.model.generate(torch.tensor([ids]), max_new_tokens=20, do_sample=False, min_new_tokens=20)
    ours = run(llm, ids, SamplingParams(max_tokens=20, ignore_eos=True), False)
    assert ours.token_ids == hf[0, len(ids):].tolist()


def oracle_generate(target, prompt, block_size, corrupt, max_tokens, seed=0):
    """Drive the reference loop with a drafter that is usually right: exercises long acceptances."""
    sampler = Sampler(SamplingParams(max_tokens=max_tokens))
    session = TorchTargetSession(target, (0,))
    drafter = OracleDraftSession(target.model, prompt, corrupt, seed)
    tokens, taus = [], []
    for step in speculative_decode(session, drafter, prompt, block_size, sampler):
        tokens += step.tokens
        if step.accepted is not None:
            taus.append(step.accepted + 1)
        if len(tokens) >= max_tokens:
            return tokens[:max_tokens], taus


def ar_generate(target, prompt, max_tokens):
    steps = autoregressive_decode(TorchTargetSession(target, ()), prompt, Sampler(SamplingParams()))
    return [next(steps).tokens[0] for _ in range(max_tokens)]


ORACLE_CASES = [(2, 0.3), (4, 0.0), (8, 0.15), (16, 0.05)]


@pytest.mark.parametrize(
    "family, block_size, corrupt",
    [("llama", *c) for c in ORACLE_CASES] + [("qwen3", *c) for c in ORACLE_CASES] + [("qwen3_moe", 8, 0.15)],
)
def test_oracle_drafter_greedy_equals_autoregressive(llms, family, block_size, corrupt):
    target = llms[family].target
    prompt = PROMPTS[1]
    spec, taus = oracle_generate(target, prompt, block_size, corrupt, 40)
    assert spec == ar_generate(target, prompt, 40)
    if corrupt == 0.0:
        assert all(tau == block_size for tau in taus[:-1])  # a perfect drafter is always accepted
    else:
        assert max(taus) > 1 and min(taus) < block_size  # both accept and reject paths ran


def test_hybrid_target_greedy_equals_autoregressive(hybrid_target):
    from dflash_trt.models.checkpoints import load_target

    target, _ = load_target(str(hybrid_target))
    prompt = [5, 6, 7, 8, 9, 10]
    expected = ar_generate(target, prompt, 16)
    for block_size, corrupt in [(4, 0.2), (8, 0.1)]:
        spec, taus = oracle_generate(target, prompt, block_size, corrupt, 16)
        assert spec == expected
        assert max(taus) > 1 and min(taus) < block_size


def test_stop_conditions_cut_both_paths_at_the_same_token(llms):
    llm = llms["qwen3"]
    base = run(llm, PROMPTS[0], SamplingParams(max_tokens=30, ignore_eos=True), False)
    stop_token = base.token_ids[9]
    first = base.token_ids.index(stop_token)
    stop_text = base.text[12:15]
    cases = [
        (SamplingParams(max_tokens=30, stop_token_ids=[stop_token], ignore_eos=True), "stop"),
        (SamplingParams(max_tokens=30, stop=[stop_text], ignore_eos=True), "stop"),
        (SamplingParams(max_tokens=7, ignore_eos=True), "length"),
        (SamplingParams(max_tokens=1, ignore_eos=True), "length"),
    ]
    for block_size in (4, 16):
        for params, reason in cases:
            ar = run(llm, PROMPTS[0], params, False)
            spec = run(llm, PROMPTS[0], params, True, block_size)
            assert (spec.token_ids, spec.text, spec.finish_reason) == (ar.token_ids, ar.text, reason)
    ar = run(llm, PROMPTS[0], cases[0][0], False)
    assert ar.token_ids == base.token_ids[: first + 1]  # the stop token is kept in token_ids
    ar = run(llm, PROMPTS[0], cases[1][0], False)
    assert stop_text not in ar.text and base.text.startswith(ar.text)


def test_eos_stops_generation(llms):
    llm = llms["llama"]
    base = run(llm, PROMPTS[1], SamplingParams(max_tokens=20, ignore_eos=True), False)
    checker = StopChecker(SamplingParams(max_tokens=20), eos_token_ids=(base.token_ids[4],), text_steps=None)
    assert checker.add(base.token_ids[:3]) is False
    assert checker.add(base.token_ids[3:]) is True
    assert checker.token_ids == base.token_ids[: base.token_ids.index(base.token_ids[4]) + 1]
    assert llm.eos_token_ids == (llm.tokenizer.eos_token_id,)


def test_greedy_matches_the_authors_loop_token_and_step_for_step(tiny_pairs, llms, monkeypatch):
    """Same drafter weights in the reference `dflash_generate`: same tokens AND same τ per step."""
    reference = pytest.importorskip("dflash.model", reason="test oracle: pip install --no-deps dflash==0.1.0")
    import json
    import time

    monkeypatch.setattr(reference, "_cuda_time", time.perf_counter)  # its stats timer syncs CUDA

    from safetensors.torch import load_file
    from transformers import Qwen3Config

    target_dir, draft_dir = tiny_pairs["qwen3"]
    raw = json.loads((draft_dir / "config.json").read_text())
    ref_drafter = reference.DFlashDraftModel(Qwen3Config(**raw, num_target_layers=4)).eval()
    ref_drafter.load_state_dict(load_file(draft_dir / "model.safetensors"), strict=False)
    llm = llms["qwen3"]
    prompt = PROMPTS[1]
    for block_size in (4, 8):
        stats = reference.dflash_generate(
            ref_drafter, llm.target.model, torch.tensor([prompt]), max_new_tokens=30,
            stop_token_ids=None, block_size=block_size, return_stats=True,
        )
        ours = run(llm, prompt, SamplingParams(max_tokens=30, ignore_eos=True), True, block_size)
        assert ours.token_ids == stats.output_ids[0, len(prompt):].tolist()
        # the reference truncates its last step at max_new_tokens; compare the full steps
        n = len(stats.acceptance_lengths) - 1
        assert ours.metrics.acceptance_lengths[:n] == stats.acceptance_lengths[:n]


@pytest.mark.parametrize("family, block_size", [("llama", 4), ("qwen3", 8)])
def test_eos_and_stops_inside_accepted_blocks_end_both_paths_alike(llms, family, block_size, monkeypatch):
    """With a mostly-right drafter, EOS, stop tokens and stop strings land inside multi-token steps;
    the committed text must still end exactly where autoregressive decoding ends."""
    llm = llms[family]
    prompt = PROMPTS[1]
    base = run(llm, prompt, SamplingParams(max_tokens=40, ignore_eos=True), False)
    # the core's torch executor drafts with a block graph that knows the greedy continuation
    oracle = OracleDraftBlock(prompt + base.token_ids, llm.vocab_size, 0.1)
    monkeypatch.setattr(graphs, "DraftBlockGraph", lambda drafter, target, head: oracle)
    monkeypatch.setattr(llm, "_core", None)  # a new runner: its executor opens the oracle
    eos = base.token_ids[9]
    end = base.token_ids.index(eos) + 1
    monkeypatch.setattr(llm, "eos_token_ids", (eos,))
    cases = [
        SamplingParams(max_tokens=40),  # EOS
        SamplingParams(max_tokens=40, ignore_eos=True, stop_token_ids=[base.token_ids[12]]),
        SamplingParams(max_tokens=40, ignore_eos=True, stop=[llm.tokenizer.decode(base.token_ids[14:16])]),
        SamplingParams(max_tokens=11, ignore_eos=True),
    ]
    for params in cases:
        ar = run(llm, prompt, params, False)
        spec = run(llm, prompt, params, True, block_size)
        assert (spec.token_ids, spec.text, spec.finish_reason) == (ar.token_ids, ar.text, ar.finish_reason)
        assert max(spec.metrics.acceptance_lengths) > 1  # it stopped inside multi-token steps
    assert run(llm, prompt, cases[0], True, block_size).token_ids == base.token_ids[:end]

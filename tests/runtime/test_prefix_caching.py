"""Prefix caching through the Python entry points (LLM, BatchRunner): a conversation's next turn and
prompts sharing a system prompt prefill only what no finished request's KV slot held, report it as
`metrics.cached_tokens`, and give the tokens they give without it (greedy: the autoregressive
reference; seeded T>0: the same draws), on the torch backend's slot executor."""

import pytest
from reference import reference_output

from dflash_trt import LLM, DFlashError, SamplingParams
from dflash_trt.runtime.batch_runner import BatchRunner

pytest.importorskip("dflash_trt._core", reason="dflash_trt._core is not built: run `bash scripts/setup.sh`")

SYSTEM = [7, 3, 9, 12, 40, 41, 42, 43, 44, 45, 46, 47]  # a shared head of token ids
QUESTIONS = [[50, 51], [60, 61, 62], [70], [80, 81, 82, 83]]


@pytest.fixture(scope="module")
def llms(tiny_pairs):
    target, draft = map(str, tiny_pairs["qwen3"])
    return {on: LLM(target, draft, max_batch=2, backend="torch", prefix_caching=on) for on in (True, False)}


def test_the_next_turn_reuses_the_first_turns_positions_and_decodes_as_without(llms):
    params = SamplingParams(max_tokens=10, ignore_eos=True)
    first = llms[True].generate("hello there", params)[0]
    assert first.metrics.cached_tokens == 0
    turn = first.prompt_token_ids + first.token_ids + [33, 34]
    out = llms[True].generate(turn, params)[0]
    # every position the first request committed: its prompt and its reply but the last token (never fed)
    assert out.metrics.cached_tokens == len(first.prompt_token_ids) + len(first.token_ids) - 1
    assert out.token_ids == reference_output(llms[True], turn, params, speculative=True).token_ids
    plain = llms[False].generate(turn, params)[0]
    assert plain.metrics.cached_tokens == 0 and plain.token_ids == out.token_ids


def test_prompts_sharing_a_system_prompt_reuse_it_and_sample_as_without(llms):
    """Four prompts through two slots: the last two take slots whose requests held the system prompt.
    Seeded T>0 draws are keyed by position, so the reused prefix changes no token."""
    prompts = [SYSTEM + q for q in QUESTIONS]
    for params in (SamplingParams(max_tokens=8, ignore_eos=True),
                   SamplingParams(max_tokens=8, temperature=0.9, top_p=0.9, seed=3, ignore_eos=True)):
        cached = [llms[True].generate(p, params)[0] for p in prompts]  # one after another: each finds the last
        batched = llms[True].generate(prompts, params)
        fresh = llms[False].generate(prompts, params)
        for a, b, c in zip(cached, batched, fresh, strict=True):
            assert a.token_ids == b.token_ids == c.token_ids
        assert all(o.metrics.cached_tokens >= len(SYSTEM) for o in cached[1:])
        assert sum(o.metrics.cached_tokens for o in batched) >= 2 * len(SYSTEM)
        assert all(o.metrics.cached_tokens == 0 for o in fresh)


def test_the_runner_counts_what_prefix_caching_spared(llms):
    runner = BatchRunner(llms[True], max_batch=1)
    assert runner.scheduler.stats()["verify_cost"]  # calibrated at load, on rows of no request's: none kept
    assert runner.executor.retained(0) == 0
    params = SamplingParams(max_tokens=4, ignore_eos=True)
    outs = runner.run([SYSTEM + q for q in QUESTIONS], params)
    stats = runner.stats()
    assert stats["prefix_cache_hits_total"] == sum(o.metrics.cached_tokens for o in outs) >= 3 * len(SYSTEM)
    assert stats["prompt_tokens_total"] == sum(len(SYSTEM + q) for q in QUESTIONS)
    assert outs[1].metrics.to_dict()["cached_tokens"] == outs[1].metrics.cached_tokens > 0


def test_prefix_caching_must_be_a_bool(tiny_pairs):
    target, draft = map(str, tiny_pairs["qwen3"])
    with pytest.raises(DFlashError, match="prefix_caching must be True or False, got 'yes'"):
        LLM(target, draft, backend="torch", prefix_caching="yes")


def test_a_cache_salt_reuses_only_positions_of_its_own_salt(llms):
    """vLLM's cache_salt: a prompt finds what an earlier request of the same salt left (or a running one
    holds), never another salt's or the unsalted share's; the tokens stay the same either way."""
    runner = BatchRunner(llms[True], max_batch=3)  # a slot each for the unsalted share and two salts
    params = SamplingParams(max_tokens=4, ignore_eos=True)

    def cached(prompt, salt=None):
        request = runner.add(prompt, params, cache_salt=salt)
        while request.finish_reason is None:
            runner.step()
        return runner.output(request)

    prompt = SYSTEM + QUESTIONS[0]
    first = cached(prompt)  # unsalted, into a slot
    others = [cached(prompt, "tenant-a"), cached(prompt, "tenant-b")]
    assert [o.metrics.cached_tokens for o in others] == [0, 0]
    again = [cached(prompt, "tenant-b"), cached(prompt)]  # each finds its own salt's slot
    assert all(o.metrics.cached_tokens == len(prompt) - 1 for o in again)
    assert {tuple(o.token_ids) for o in [first, *others, *again]} == {tuple(first.token_ids)}
    # from a running request: the long one holds the system prompt while the others are admitted
    runner.add(SYSTEM + [90], SamplingParams(max_tokens=60, ignore_eos=True), cache_salt="tenant-c")
    runner.step()
    assert cached(SYSTEM + QUESTIONS[1], "tenant-d").metrics.cached_tokens < len(SYSTEM)
    assert cached(SYSTEM + QUESTIONS[2], "tenant-c").metrics.cached_tokens >= len(SYSTEM)
    with pytest.raises(DFlashError, match="cache_salt must be a non-empty string, got ''"):
        runner.add(prompt, params, cache_salt="")


def test_llm_reset_prefix_cache_makes_a_repeated_prompt_prefill_whole(llms):
    params = SamplingParams(max_tokens=4, ignore_eos=True)
    prompt = SYSTEM + QUESTIONS[1]
    first = llms[True].generate(prompt, params)[0]
    assert llms[True].generate(prompt, params)[0].metrics.cached_tokens > 0
    llms[True].reset_prefix_cache()
    again = llms[True].generate(prompt, params)[0]
    assert again.metrics.cached_tokens == 0 and again.token_ids == first.token_ids


def test_a_reset_prefix_cache_drops_what_finished_requests_kept(llms):
    """Engine.reset_prefix_cache (what the server's /reset_prefix_cache runs, between two steps): the
    same prompt again prefills whole, and decodes as before."""
    from dflash_trt.runtime.engine import Engine

    engine = Engine(llms[True], max_batch=2)
    params = SamplingParams(max_tokens=6, ignore_eos=True)
    try:
        first = engine.generate([SYSTEM + QUESTIONS[0]], params)[0]
        again = engine.generate([SYSTEM + QUESTIONS[0]], params)[0]
        assert first.metrics.cached_tokens == 0 and again.metrics.cached_tokens == len(SYSTEM) + 1
        engine.reset_prefix_cache()
        reset = engine.generate([SYSTEM + QUESTIONS[0]], params)[0]
        assert reset.metrics.cached_tokens == 0 and reset.token_ids == first.token_ids == again.token_ids
    finally:
        engine.shutdown()
    with pytest.raises(DFlashError, match="shutting down"):
        engine.reset_prefix_cache()

"""SamplingParams.prompt_logprobs: each prompt token's log-probability (after the first) and the top-n
tokens' under the target's raw logits at the position before it, from the prefill's logits (every
position's, csrc/slot_executor.cpp score_prompts). Checked against the HF target run over the prompt
(torch.log_softmax in float64): whole and chunked prefills, beside other requests, past the prefix
cache, with penalties (which must not touch them), on dense, sliding-window and hybrid targets."""

import pytest
import torch
from factories import tiny_slots_pair

from dflash_trt import LLM, SamplingParams
from dflash_trt.errors import DFlashError


def oracle(llm, prompt: list[int]) -> torch.Tensor:
    """log_softmax of the target's logits at positions 0 .. len - 2 [len(prompt) - 1, vocab]."""
    with torch.no_grad():
        logits = llm.target.model(torch.tensor([prompt])).logits[0].double()
    return torch.log_softmax(logits[:-1], dim=-1)


def check(out, reference: torch.Tensor, top: int) -> None:
    """None first; then per token its own entry, then the top ones in order (the dict holds it once)."""
    prompt = out.prompt_token_ids
    assert out.prompt_logprobs is not None and len(out.prompt_logprobs) == len(prompt)
    assert out.prompt_logprobs[0] is None
    for j, (token, entries) in enumerate(zip(prompt[1:], out.prompt_logprobs[1:], strict=True)):
        want = reference[j].topk(top).indices.tolist() if top else []
        assert list(entries) == [token] + [t for t in want if t != token]
        for t in entries:
            assert abs(entries[t] - reference[j, t].item()) < 2e-4


PROMPT = [1, 2, 3, 4, 0, 2, 5, 1, 3]


@pytest.fixture(scope="module")
def small(small_vocab_pair):
    return LLM(*map(str, small_vocab_pair), backend="torch", block_size=4)


@pytest.mark.parametrize("speculative", [True, False])
@pytest.mark.parametrize("top", [0, 3])
def test_prompt_logprobs_equal_the_targets_log_softmax(small, speculative, top):
    params = SamplingParams(max_tokens=6, prompt_logprobs=top, ignore_eos=True)
    out = small.generate([PROMPT], params, speculative=speculative)[0]
    check(out, oracle(small, PROMPT), top)
    plain = small.generate([PROMPT], SamplingParams(max_tokens=6, ignore_eos=True), speculative=speculative)[0]
    assert out.token_ids == plain.token_ids and plain.prompt_logprobs is None


@pytest.mark.parametrize("chunk", [1, 2, 4])
def test_a_chunked_prefill_scores_each_chunks_last_position_by_the_next_chunks_first_token(small_vocab_pair, chunk):
    llm = LLM(*map(str, small_vocab_pair), backend="torch", block_size=4, prefill_chunk=chunk)
    # penalties change the decided position's logits in place: the scores come before them
    params = SamplingParams(max_tokens=5, prompt_logprobs=2, ignore_eos=True, repetition_penalty=1.8,
                            temperature=0.8, seed=4)
    out = llm.generate([PROMPT], params)[0]
    check(out, oracle(llm, PROMPT), 2)
    unscored = llm.generate([PROMPT], SamplingParams(**{**params.__dict__, "prompt_logprobs": None}))[0]
    assert out.token_ids == unscored.token_ids


def test_beside_other_requests_and_past_the_prefix_cache(small):
    """A prompt the cache holds is prefilled again when scored (cached_tokens 0); its neighbours'
    tokens are what they are alone."""
    params = SamplingParams(max_tokens=8, ignore_eos=True, temperature=0.9, seed=2)
    prompts = [PROMPT, PROMPT[:5] + [1, 1], [4, 4, 3]]
    alone = small.generate(prompts, params)
    scored = SamplingParams(**{**params.__dict__, "prompt_logprobs": 1})
    outs = small.generate(prompts, [params, scored, params])
    assert [o.token_ids for o in outs] == [o.token_ids for o in alone]
    check(outs[1], oracle(small, prompts[1]), 1)
    assert outs[0].prompt_logprobs is None and outs[2].prompt_logprobs is None
    again = small.generate([PROMPT], [scored])[0]  # the cache holds PROMPT by now
    assert again.metrics.cached_tokens == 0
    check(again, oracle(small, PROMPT), 1)
    assert small.generate([PROMPT], [params])[0].metrics.cached_tokens > 0  # the cache is there


def test_a_prompt_longer_than_a_scored_chunk_is_scored_whole(small):
    """A scored prompt is prefilled at most 256 tokens a step (csrc/scheduler.h kScoredChunk)."""
    prompt = torch.randint(0, 5, (300,), generator=torch.Generator().manual_seed(1)).tolist()
    out = small.generate([prompt], SamplingParams(max_tokens=3, prompt_logprobs=1, ignore_eos=True))[0]
    check(out, oracle(small, prompt), 1)


def test_a_truncated_prompt_is_its_last_tokens(small):
    """vLLM's truncate_prompt_tokens: the request is its prompt's last n tokens, scored as such."""
    params = SamplingParams(max_tokens=6, ignore_eos=True, truncate_prompt_tokens=4, prompt_logprobs=1)
    out = small.generate([PROMPT], params)[0]
    assert out.prompt_token_ids == PROMPT[-4:]
    check(out, oracle(small, PROMPT[-4:]), 1)
    assert out.token_ids == small.generate([PROMPT[-4:]], SamplingParams(max_tokens=6, ignore_eos=True))[0].token_ids
    for bad in (0, -1, 1.5):
        with pytest.raises(DFlashError, match="SamplingParams.truncate_prompt_tokens must be an integer"):
            SamplingParams(truncate_prompt_tokens=bad)


def test_a_one_token_prompt_scores_nothing(small):
    out = small.generate([[3]], SamplingParams(max_tokens=2, prompt_logprobs=2))[0]
    assert out.prompt_logprobs == [None]


def test_streamed_outputs_carry_them_from_the_first(small):
    outs = list(small.stream(PROMPT, SamplingParams(max_tokens=4, prompt_logprobs=0, ignore_eos=True)))
    assert all(len(o.prompt_logprobs) == len(PROMPT) for o in outs)
    check(outs[-1], oracle(small, PROMPT), 0)


@pytest.mark.parametrize("kind", ["dense", "sliding-window", "hybrid"])
def test_a_slots_bundle_on_onnxruntime_scores_chunked_prompts(tmp_path, kind):
    """The host path of an exported bundle; a hybrid target's states after a scored chunk are those
    after its last token (its tokens equal an unscored run's)."""
    from dflash_trt.runtime.native import native_core

    if not native_core().HAS_ORT_EXECUTOR:
        pytest.skip("dflash_trt._core was built without the onnxruntime executor")
    bundle, target, draft = tiny_slots_pair(tmp_path, kind)
    llm = LLM.from_bundle(str(bundle), prefill_chunk=3)
    reference = LLM(target, draft, backend="torch")
    prompt = [5, 9, 2, 6, 7, 1, 8, 3]
    params = SamplingParams(max_tokens=8, ignore_eos=True)
    out = llm.generate([prompt], SamplingParams(**{**params.__dict__, "prompt_logprobs": 2}))[0]
    check(out, oracle(reference, prompt), 2)
    assert out.token_ids == llm.generate([prompt], params)[0].token_ids


def test_bad_prompt_logprobs_are_one_line_errors():
    for bad in (-1, 21, 2.5, True):
        with pytest.raises(DFlashError, match="SamplingParams.prompt_logprobs must be an integer in"):
            SamplingParams(prompt_logprobs=bad)

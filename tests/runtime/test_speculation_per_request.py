"""SamplingParams.num_speculative_tokens: speculation per request (at most k drafts a step; 0: plain
decoding), where vLLM sets it for the whole engine. Lossless whatever k: a greedy reply is the
autoregressive one, a seeded one the same tokens, alone or batched with other k."""

import pytest

from dflash_trt import LLM, SamplingParams
from dflash_trt.errors import DFlashError

PROMPTS = [[1, 2, 3, 4], [4, 3, 2], [0, 1, 0, 1, 2]]


@pytest.fixture(scope="module")
def llm(small_vocab_pair):
    return LLM(*map(str, small_vocab_pair), block_size=4, backend="torch")  # drafts often accepted


def test_each_k_caps_the_drafts_and_greedy_stays_autoregressive(llm):
    plain = llm.generate(PROMPTS, SamplingParams(max_tokens=24, ignore_eos=True), speculative=False)
    longest = {}
    for k in (0, 1, 2, None):
        outs = llm.generate(PROMPTS, SamplingParams(max_tokens=24, ignore_eos=True, num_speculative_tokens=k))
        assert [o.token_ids for o in outs] == [o.token_ids for o in plain], k
        taus = [tau for o in outs for tau in o.metrics.acceptance_lengths]
        longest[k] = max(taus, default=0)
    assert longest[0] == 0, "k = 0: plain decoding, no verify steps"
    assert longest[1] == 2 and longest[2] == 3, "accepted up to the cap"
    assert longest[None] == 4, "uncapped: the engine's block (4)"


def test_a_seeded_reply_is_the_same_tokens_whatever_k_alone_or_batched_with_other_k(llm):
    sampled = {k: SamplingParams(max_tokens=20, temperature=0.9, seed=5, ignore_eos=True, num_speculative_tokens=k)
               for k in (0, 1, None)}
    alone = {k: llm.generate(PROMPTS[:1], params)[0].token_ids for k, params in sampled.items()}
    assert alone[0] == alone[1] == alone[None]
    batch = llm.generate(PROMPTS[:1] * 3, list(sampled.values()))
    assert [o.token_ids for o in batch] == [alone[0]] * 3


@pytest.mark.parametrize("k", [-1, 1.5, True])
def test_a_k_it_cannot_take_is_refused_naming_the_field(k):
    with pytest.raises(DFlashError, match="num_speculative_tokens must be an integer in"):
        SamplingParams(num_speculative_tokens=k)

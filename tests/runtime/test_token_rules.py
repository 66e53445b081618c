"""vLLM's allowed_token_ids and bad_words (runtime/token_rules.py) through the LLM's one core path: greedy
replies equal an autoregressive loop written here (the torch target's argmax over the tokens the rules
allow after the output so far), with DFlash and plainly; the rules' masks follow the drafts; with a
grammar, both apply."""

import pytest
import torch

from dflash_trt import LLM, SamplingParams
from dflash_trt.errors import DFlashError
from dflash_trt.runtime.torch_backend import TorchTargetSession
from dflash_trt.runtime.token_rules import AllOf, TokenRules


def ruled_greedy(llm, prompt: list[int], max_tokens: int, allowed=None, bad=()) -> list[int]:
    """The target alone, each step's argmax over `allowed` (None: all) less each bad sequence's last token
    where the output ends with the rest of it."""
    session = TorchTargetSession(llm.target, ())
    logits, _ = session.prefill(list(prompt))
    out = []
    while len(out) < max_tokens:
        row = logits.float().clone()
        if allowed is not None:
            keep = torch.zeros_like(row, dtype=torch.bool)
            keep[list(allowed)] = True
            row[~keep] = -torch.inf
        for seq in bad:
            if len(seq) == 1 or tuple(out[len(out) - len(seq) + 1:]) == tuple(seq[:-1]):
                row[seq[-1]] = -torch.inf
        token = int(row.argmax())
        out.append(token)
        if token in llm.eos_token_ids:
            break
        logits, _ = session.forward([token])
        session.commit(1)
        logits = logits[-1]
    return out


@pytest.fixture(scope="module")
def small(small_vocab_pair):
    return LLM(*map(str, small_vocab_pair), backend="torch", block_size=4)


@pytest.fixture(scope="module")
def llm(tiny_pairs):
    target, draft = tiny_pairs["llama"]
    return LLM(str(target), str(draft), block_size=4, max_batch=4, backend="torch")


@pytest.mark.parametrize("allowed", [(1, 3), (0, 2, 4), (0, 1, 2, 4)])
def test_allowed_token_ids_are_the_only_tokens_and_greedy_equals_the_ruled_loop(small, allowed):
    prompt = [1, 2, 3, 4, 0, 2]
    want = ruled_greedy(small, prompt, 12, allowed=allowed)
    params = SamplingParams(max_tokens=12, allowed_token_ids=list(allowed), ignore_eos=True)
    out = small.generate([prompt], params)[0]
    assert out.token_ids == want and small.generate([prompt], params, speculative=False)[0].token_ids == want
    assert set(out.token_ids) <= set(allowed)
    free = small.generate([prompt], SamplingParams(max_tokens=12, ignore_eos=True))[0]
    assert free.token_ids != want  # the rule changed the reply: it was not a no-op here
    if len(allowed) == 4:
        assert out.metrics.mean_acceptance_length > 1  # drafts the rule allows are kept


def test_bad_words_never_appear_and_greedy_equals_the_ruled_loop(llm):
    prompt = llm.encode("hello there")
    free = llm.generate([prompt], SamplingParams(max_tokens=24))[0].token_ids

    def spellings(word: str) -> list[tuple[int, ...]]:  # vLLM's: the word alone and after a space
        return [tuple(llm.tokenizer.encode(text, add_special_tokens=False)) for text in (word, " " + word)]

    # a word the free reply spells with one token, and one it spells with two (banned after the first)
    pieces = [(free[i:i + n], llm.tokenizer.decode(free[i:i + n]).strip()) for n in (1, 2)
              for i in range(len(free) - n)]
    one = next(w for ids, w in pieces if len(ids) == 1 and w and tuple(ids) in spellings(w))
    two = next(w for ids, w in pieces if len(ids) == 2 and w and tuple(ids) in spellings(w))
    bad = list(dict.fromkeys(spellings(one) + spellings(two)))
    want = ruled_greedy(llm, prompt, 24, bad=bad)
    params = SamplingParams(max_tokens=24, bad_words=[one, two])
    out = llm.generate([prompt], params)[0]
    assert out.token_ids == want and llm.generate([prompt], params, speculative=False)[0].token_ids == want
    assert want != free


def test_the_rules_masks_follow_the_drafts():
    rules = TokenRules(40, None, [(7,), (3, 5), (1, 2, 9)])
    k, masks, drafts = rules.masks([3, 5, 1, 2, 9])

    def allows(row, token):
        return bool(masks[row][token // 32] >> (token % 32) & 1)

    assert k == 1 and drafts == [3, 5, 1, 2, 9] and masks.shape == (2, 2)  # 5 after 3 is banned
    assert not allows(0, 7) and allows(0, 5) and not allows(1, 5) and allows(1, 39)
    rules.advance([1, 2])  # committed: 9 is banned next
    k, masks, _ = rules.masks([9])
    assert k == 0 and not allows(0, 9)
    rules = TokenRules(40, (4, 33), [])
    k, masks, _ = rules.masks([33, 4, 5])
    assert k == 2 and [t for t in range(40) if allows(0, t)] == [4, 33]


def test_with_a_grammar_both_apply(llm):
    pytest.importorskip("llguidance")
    x = llm.tokenizer.convert_tokens_to_ids("x")
    params = SamplingParams(max_tokens=20, structured_output={"regex": "[a-c]{2,5}(x|yz)"}, bad_words=["x"])
    constraint = llm.constraint(params)
    assert isinstance(constraint, AllOf)
    _, masks, _ = constraint.masks([])
    assert not masks[0][x // 32] >> (x % 32) & 1
    out = llm.generate("abc", params)[0]
    assert "x" not in out.text and out.token_ids == llm.generate("abc", params, speculative=False)[0].token_ids


def test_refusals_are_one_line():
    for value in ([], [-1], ["a"], 3):
        with pytest.raises(DFlashError, match="SamplingParams.allowed_token_ids must be a non-empty list"):
            SamplingParams(allowed_token_ids=value)
    for value in ([""], [" "], "x", [1]):
        with pytest.raises(DFlashError, match="SamplingParams.bad_words must be a list of non-blank strings"):
            SamplingParams(bad_words=value)


def test_what_the_target_cannot_honour_is_refused_before_any_work(small):
    with pytest.raises(DFlashError, match="allowed_token_ids names token 6, outside the target's vocabulary"):
        small.generate([[1, 2]], SamplingParams(allowed_token_ids=[1, 6]))
    with pytest.raises(DFlashError, match="bad_words need a tokenizer"):
        small.generate([[1, 2]], SamplingParams(bad_words=["x"]))

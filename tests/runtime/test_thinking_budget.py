"""vLLM's thinking_token_budget (runtime/token_rules.py ThinkingBudget): the rule's masks on hand-made
token sequences, and through the LLM's core path greedy replies equal to greedy decoding written here
(the free reply up to the budget, then "</think>", then the free reply after it), DFlash and plainly."""

import numpy as np
import pytest

from dflash_trt import LLM, SamplingParams
from dflash_trt.errors import DFlashError
from dflash_trt.runtime.token_rules import ThinkingBudget
from dflash_trt.runtime.torch_backend import TorchTargetSession

START, END = (1, 2), (3, 4)  # a block's markers, two tokens each, in a vocabulary of 8


def allowed(mask: np.ndarray) -> list[int]:
    return [t for t in range(8) if mask[t // 32] >> np.uint32(t % 32) & 1]


EVERY, ONLY_3, ONLY_4 = list(range(8)), [3], [4]


def test_an_open_block_is_closed_once_its_budget_is_spent():
    rule = ThinkingBudget(8, START, END, 2, prompt_ids=[5, 1, 2])  # the prompt opened a block
    k, masks, drafts = rule.masks([6, 7, 6, 0], may_replace=True)
    # two tokens inside, then </think> forced: the third draft becomes its first token, the fourth its second
    assert (k, drafts) == (4, [6, 7, 3, 4]) and [allowed(m) for m in masks] == [EVERY, EVERY, ONLY_3, ONLY_4, EVERY]
    k, masks, drafts = rule.masks([6, 7, 6], may_replace=False)  # kept as drawn: refused where forced
    assert (k, drafts) == (2, [6, 7, 6]) and [allowed(m) for m in masks] == [EVERY, EVERY, ONLY_3]
    rule.advance([6, 7])
    assert [allowed(m) for m in rule.masks([])[1]] == [ONLY_3]
    rule.advance([3])  # the end's rest is forced after the part the output holds
    assert [allowed(m) for m in rule.masks([])[1]] == [ONLY_4]
    rule.advance([4, 1, 2, 6, 6, 6])  # the block ended: a later one is not limited
    assert [allowed(m) for m in rule.masks([])[1]] == [EVERY]


def test_a_block_that_ends_within_its_budget_forces_nothing():
    rule = ThinkingBudget(8, START, END, 3, prompt_ids=[1, 2])
    rule.advance([6, 3, 4])
    assert [allowed(m) for m in rule.masks([6, 6, 6, 6])[1]] == [EVERY] * 5


def test_a_block_the_output_opens_is_counted_from_its_start():
    rule = ThinkingBudget(8, START, END, 1, prompt_ids=[1, 2, 5, 3, 4])  # the prompt's block is closed
    k, masks, drafts = rule.masks([6, 1, 2, 7, 0], may_replace=True)
    assert (k, drafts) == (5, [6, 1, 2, 7, 3])
    assert [allowed(m) for m in masks] == [EVERY, EVERY, EVERY, EVERY, ONLY_3, ONLY_4]


def test_a_zero_budget_closes_the_block_at_once():
    rule = ThinkingBudget(8, START, END, 0, prompt_ids=[1, 2])
    assert [allowed(m) for m in rule.masks([5], may_replace=True)[1]] == [ONLY_3, ONLY_4]


def free_greedy(llm, prompt: list[int], count: int) -> list[int]:
    """The target alone, `count` argmax tokens (no stop)."""
    session = TorchTargetSession(llm.target, ())
    logits, _ = session.prefill(list(prompt))
    out = []
    while len(out) < count:
        out.append(int(logits.float().argmax()))
        logits, _ = session.forward([out[-1]])
        session.commit(1)
        logits = logits[-1]
    return out


@pytest.fixture(scope="module")
def llm(tiny_pairs):
    target, draft = tiny_pairs["qwen3"]
    return LLM(str(target), str(draft), block_size=4, max_batch=4, backend="torch")


@pytest.mark.parametrize("budget", [0, 5])
def test_greedy_replies_think_for_the_budget_then_close_the_block(llm, budget):
    """A prompt that opens a block (byte tokens: "</think>" is 8 of them): the reply is the free reply's
    first `budget` tokens, "</think>", then the free reply to all of that."""
    prompt = llm.tokenizer.encode("why? <think>\n", add_special_tokens=False)
    end = llm.tokenizer.encode("</think>", add_special_tokens=False)
    head = free_greedy(llm, prompt, budget)
    want = head + end + free_greedy(llm, prompt + head + end, 24 - budget - len(end))
    assert free_greedy(llm, prompt, 24) != want  # the budget changed the reply
    params = SamplingParams(max_tokens=24, ignore_eos=True, thinking_token_budget=budget)
    assert llm.generate([prompt], params)[0].token_ids == want
    assert llm.generate([prompt], params, speculative=False)[0].token_ids == want
    closed = llm.tokenizer.encode("why? <think>\nno</think>\n", add_special_tokens=False)  # nothing to limit
    free = SamplingParams(max_tokens=24, ignore_eos=True)
    assert llm.generate([closed], params)[0].token_ids == llm.generate([closed], free)[0].token_ids


def test_a_seeded_sampled_reply_under_a_budget_is_the_same_in_a_batch(llm):
    prompt = llm.tokenizer.encode("tell me <think>\n", add_special_tokens=False)
    params = SamplingParams(max_tokens=20, temperature=1.0, seed=5, ignore_eos=True, thinking_token_budget=3)
    alone = llm.generate([prompt], params)[0].token_ids
    end = llm.tokenizer.encode("</think>", add_special_tokens=False)
    assert alone[3:3 + len(end)] == end  # closed at the budget
    batch = llm.generate([prompt, [5, 6, 7], prompt], [params, SamplingParams(max_tokens=8), params])
    assert batch[0].token_ids == batch[2].token_ids == alone


def test_a_thinking_budget_is_checked_in_one_line():
    with pytest.raises(DFlashError, match=r"thinking_token_budget must be an integer in \[0, 2\*\*31\) or None"):
        SamplingParams(thinking_token_budget=-1)

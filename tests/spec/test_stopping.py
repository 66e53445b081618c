"""StopChecker: stop tokens, stop strings found one token at a time in the growing text, and the cost of
text per token (it must not grow with the output)."""

from __future__ import annotations

import pytest

from dflash_trt import LLM
from dflash_trt.models.tokenizers import TextStream
from dflash_trt.spec.sampling import SamplingParams
from dflash_trt.spec.stopping import StopChecker


class Pieces:
    """Token t's text is pieces[t]."""

    def __init__(self, pieces: dict[int, str]):
        self.pieces = pieces

    def step(self, token: int) -> str:
        return self.pieces[token]


PIECES = Pieces({0: "xa", 1: "b", 2: "cz", 3: "q", 4: "", 5: "abcabc"})


def checker(stop: list[str], max_tokens: int = 50) -> StopChecker:
    return StopChecker(SamplingParams(max_tokens=max_tokens, stop=stop), eos_token_ids=(), text_steps=PIECES)


def test_a_stop_string_across_several_tokens_ends_the_request_where_it_begins():
    stop = checker(["abc"])
    assert stop.add([3, 0, 1]) is False and stop.text == "qxab"
    assert stop.add([2, 3]) is True  # found at token 2: the later token of the step is dropped
    assert (stop.token_ids, stop.text, stop.finish_reason) == ([3, 0, 1, 2], "qx", "stop")


def test_the_earliest_of_several_stop_strings_wins_whichever_is_listed_first():
    stop = checker(["cz", "bc"])
    assert stop.add([0, 1, 2]) and stop.text == "xa"


def test_a_stop_string_inside_one_tokens_text_and_an_empty_piece():
    stop = checker(["cab"])
    assert not stop.add([3, 4, 4])
    assert stop.add([5]) and stop.text == "qab"


def test_include_stop_str_in_output_keeps_the_stop_string_that_ended_it():
    stop = StopChecker(SamplingParams(stop=["zz", "abc"], include_stop_str_in_output=True), eos_token_ids=(),
                       text_steps=PIECES)
    assert stop.add([3, 0, 1, 2, 3]) and (stop.token_ids, stop.text) == ([3, 0, 1, 2], "qxabc")
    stop = StopChecker(SamplingParams(stop=["bcq", "b"], include_stop_str_in_output=True), eos_token_ids=(),
                       text_steps=PIECES)
    assert stop.add([0, 1]) and stop.text == "xab"  # the first to begin: "b"


def test_special_tokens_stay_in_the_text_when_asked(tiny_pairs):
    llm = LLM(str(tiny_pairs["qwen3"][0]), None, backend="torch")
    ids = llm.tokenizer.encode("Hi") + [llm.tokenizer.eos_token_id]
    kept = TextStream(llm.tokenizer, skip_special_tokens=False)
    assert "".join(kept.step(t) for t in ids) == llm.tokenizer.decode(ids) == "Hi" + llm.tokenizer.eos_token
    out = llm.generate([ids[:-1]], SamplingParams(max_tokens=3, logit_bias={ids[-1]: 100}, skip_special_tokens=False),
                       speculative=False)[0]
    assert out.token_ids == [ids[-1]] and out.text == llm.tokenizer.eos_token


def test_length_and_stop_tokens_without_text():
    stop = StopChecker(SamplingParams(max_tokens=3, stop_token_ids=[7]), eos_token_ids=(9,), text_steps=None)
    assert stop.add([1, 7, 2]) and (stop.token_ids, stop.finish_reason, stop.text) == ([1, 7], "stop", "")
    stop = StopChecker(SamplingParams(max_tokens=3), eos_token_ids=(9,), text_steps=None)
    assert stop.add([1, 2, 3, 4]) and (stop.token_ids, stop.finish_reason) == ([1, 2, 3], "length")


def test_the_stop_reason_names_the_stop_string_or_stop_token_that_ended_it():
    """vLLM's stop_reason: the string (the first to begin), a stop token id, None for EOS or a length."""
    stop = checker(["cz", "bc"])
    assert stop.stop_reason is None and stop.add([0, 1, 2]) and stop.stop_reason == "bc"
    stop = StopChecker(SamplingParams(max_tokens=5, stop_token_ids=[7]), eos_token_ids=(9,), text_steps=None)
    assert stop.add([1, 7]) and stop.stop_reason == 7
    stop = StopChecker(SamplingParams(max_tokens=5, stop_token_ids=[7]), eos_token_ids=(9,), text_steps=None)
    assert stop.add([1, 9]) and stop.finish_reason == "stop" and stop.stop_reason is None
    stop = StopChecker(SamplingParams(max_tokens=2, stop=["x"]), eos_token_ids=(), text_steps=PIECES)
    assert stop.add([3, 1]) and stop.finish_reason == "length" and stop.stop_reason is None


def test_the_streamed_text_is_the_tokenizers_decode(tiny_pairs):
    llm = LLM(str(tiny_pairs["qwen3"][0]), None, backend="torch")
    ids = llm.tokenizer.encode("Hello, wörld! 🙂 def f(x):\n    return x")
    stream = TextStream(llm.tokenizer)
    assert "".join(stream.step(t) for t in ids) == llm.tokenizer.decode(ids, skip_special_tokens=True)


def test_a_long_output_with_a_stop_string_costs_the_same_per_token(tiny_pairs, monkeypatch):
    # Counted, not timed: the text grows by one tokenizer step per token, never by decoding all ids
    # again, and a stop string is searched for only in the newest token's text and the
    # (longest stop - 1) characters before it.
    llm = LLM(str(tiny_pairs["qwen3"][0]), None, max_batch=1, backend="torch")
    pieces, searched = [], []
    real_step, real_find = TextStream.step, StopChecker._find_stop_string

    def counted_step(self, token):
        pieces.append(real_step(self, token))
        return pieces[-1]

    def counted_find(self, before):
        searched.append(len(self._text) - max(0, before - self.longest_stop + 1))
        return real_find(self, before)

    def no_full_decode(*args, **kwargs):
        raise AssertionError("a full decode of the output")

    monkeypatch.setattr(TextStream, "step", counted_step)
    monkeypatch.setattr(StopChecker, "_find_stop_string", counted_find)
    monkeypatch.setattr(llm.tokenizer, "decode", no_full_decode)
    stop = "\x00never"
    out = llm.generate([1, 2, 3], SamplingParams(max_tokens=2048, stop=[stop], ignore_eos=True),
                       speculative=False)[0]
    assert len(out.token_ids) == 2048 and out.finish_reason == "length"
    assert len(pieces) == len(searched) == 2048 and out.text == "".join(pieces)
    assert all(span <= len(stop) - 1 + len(piece) for span, piece in zip(searched, pieces, strict=True))


@pytest.mark.parametrize("stop", [["abc"], ["zz", "abc"]])
def test_the_search_window_never_misses_a_stop_string(stop):
    # every split of "qxabcz" into tokens finds the first stop string where a full search would
    text = "qxabczzq"
    first = min(i for i in (text.find(s) for s in stop) if i >= 0)
    for cut1 in range(1, len(text)):
        for cut2 in range(cut1, len(text)):
            parts = [text[:cut1], text[cut1:cut2], text[cut2:]]
            stopper = StopChecker(SamplingParams(max_tokens=9, stop=stop), eos_token_ids=(),
                                  text_steps=Pieces(dict(enumerate(parts))))
            assert stopper.add([0, 1, 2]) and stopper.text == text[:first]

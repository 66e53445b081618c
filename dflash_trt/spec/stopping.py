"""Stop conditions, applied one token at a time so that how many tokens a step commits never matters."""

from __future__ import annotations

from typing import Protocol

from dflash_trt.spec.sampling import SamplingParams


class TextSteps(Protocol):
    """A request's detokenizer: the text one more token adds ("" while a character is incomplete)."""

    def step(self, token: int) -> str: ...


class StopChecker:
    """Collects committed tokens and their text, and says when (and why) the request is finished.

    Stop tokens (EOS and `stop_token_ids`) stay in `token_ids`, as in vLLM; stop strings are cut
    from the text, and are not looked for before min_tokens tokens (the stop tokens are banned there).
    Text grows one token at a time through `text_steps` (None: no tokenizer, no text), and a stop
    string is looked for only where the newest token's text could complete one, so each token costs
    the same however long the output is.
    """

    def __init__(self, params: SamplingParams, eos_token_ids: tuple[int, ...], text_steps: TextSteps | None):
        self.params = params
        self.stop_ids = set(params.stop_token_ids) | (set() if params.ignore_eos else set(eos_token_ids))
        assert text_steps is not None or not params.stop, "stop strings need a tokenizer"
        self.text_steps = text_steps
        self.longest_stop = max((len(s) for s in params.stop), default=0)
        self.token_ids: list[int] = []
        self.finish_reason: str | None = None  # "stop" or "length"
        self.stop_text_at: int | None = None  # text index where a stop string begins
        self.stop_text_end: int | None = None  # and where it ends
        self._text = ""

    @property
    def text(self) -> str:
        """The output text so far, cut where a stop string begins (ends, with include_stop_str_in_output)."""
        if self.stop_text_at is None:
            return self._text
        return self._text[: self.stop_text_end if self.params.include_stop_str_in_output else self.stop_text_at]

    @property
    def stop_reason(self) -> str | int | None:
        """vLLM's: the stop string or stop token id that ended the output; None for EOS, a length or while
        it runs."""
        if self.finish_reason != "stop":
            return None
        if self.stop_text_at is not None:
            return self._text[self.stop_text_at:self.stop_text_end]
        last = self.token_ids[-1]
        return last if last in self.params.stop_token_ids else None

    def add(self, tokens: list[int]) -> bool:
        """Take a step's tokens; True once finished (later tokens of the step are dropped)."""
        for token in tokens:
            self.token_ids.append(token)
            before = len(self._text)
            if self.text_steps is not None:
                self._text += self.text_steps.step(token)
            if token in self.stop_ids:
                self.finish_reason = "stop"
            elif self.params.stop and len(self.token_ids) >= self.params.min_tokens and self._find_stop_string(before):
                self.finish_reason = "stop"
            elif len(self.token_ids) >= self.params.max_tokens:
                self.finish_reason = "length"
            if self.finish_reason:
                return True
        return False

    def _find_stop_string(self, before: int) -> bool:
        # Earlier text was searched at earlier tokens: a new match ends in the newest token's text.
        start = max(0, before - self.longest_stop + 1)
        hits = [(at, at + len(s)) for at, s in ((self._text.find(s, start), s) for s in self.params.stop) if at >= 0]
        if hits:  # the first to begin; of those, the first listed
            self.stop_text_at, self.stop_text_end = min(hits, key=lambda hit: hit[0])
        return bool(hits)

"""Stop conditions, applied one token at a time so that how many tokens a step commits never matters."""

from __future__ import annotations

from collections.abc import Callable

from dflash_trt.spec.sampling import SamplingParams


class StopChecker:
    """Collects committed tokens and says when (and why) the request is finished.

    Stop tokens (EOS and `stop_token_ids`) stay in `token_ids`, as in vLLM; stop strings are cut
    from the text. `decode` turns token ids into text; it is needed only for stop strings.
    """

    def __init__(
        self,
        params: SamplingParams,
        eos_token_ids: tuple[int, ...],
        decode: Callable[[list[int]], str] | None,
    ):
        self.params = params
        self.stop_ids = set(params.stop_token_ids) | (set() if params.ignore_eos else set(eos_token_ids))
        self.decode = decode
        self.token_ids: list[int] = []
        self.finish_reason: str | None = None  # "stop" or "length"
        self.stop_text_at: int | None = None  # text index where a stop string begins

    def add(self, tokens: list[int]) -> bool:
        """Take a step's tokens; True once finished (later tokens of the step are dropped)."""
        for token in tokens:
            self.token_ids.append(token)
            if token in self.stop_ids:
                self.finish_reason = "stop"
            elif self.params.stop and self._find_stop_string():
                self.finish_reason = "stop"
            elif len(self.token_ids) >= self.params.max_tokens:
                self.finish_reason = "length"
            if self.finish_reason:
                return True
        return False

    def _find_stop_string(self) -> bool:
        assert self.decode is not None, "stop strings need a tokenizer"
        text = self.decode(self.token_ids)
        hits = [i for i in (text.find(s) for s in self.params.stop) if i >= 0]
        if hits:
            self.stop_text_at = min(hits)
        return bool(hits)

    def final_text(self, text: str) -> str:
        return text if self.stop_text_at is None else text[: self.stop_text_at]

"""A request's structured output as the core asks for it (csrc/constraint.h): llguidance's matcher over
the target's tokenizer, answering which tokens may come after the output so far and after each draft
of a verify block, and taking the tokens the core commits."""

from __future__ import annotations

import numpy as np

from dflash_trt.spec.structured import StructuredOutput


def grammar_tokenizer(tokenizer, vocab: int):
    """llguidance's view of an HF tokenizer, its masks `vocab` tokens wide (the logits', padding included)."""
    import llguidance.hf

    return llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab)


class GrammarConstraint:
    """One request's grammar state. `stop_ids`: the tokens that end the request (EOS and stop ids),
    allowed wherever the grammar may end (llguidance allows only the tokenizer's own EOS)."""

    def __init__(self, tokenizer, structured: StructuredOutput, vocab: int, stop_ids: tuple[int, ...]):
        import llguidance
        import llguidance.numpy

        self._fill = llguidance.numpy.fill_next_token_bitmask
        self.matcher = llguidance.LLMatcher(tokenizer, structured.lark())
        self.words = (vocab + 31) // 32
        self.stop_ids = np.array([t for t in stop_ids if 0 <= t < vocab], dtype=np.int64)

    def masks(self, drafts: list[int]) -> tuple[int, np.ndarray]:
        """(k, masks [k + 1, words]): k the leading drafts the grammar allows; mask j follows the output
        and drafts[:j]."""
        if self.matcher.is_error():  # it refused a committed token (none it allowed): only a stop may come
            masks = np.zeros((1, self.words), dtype=np.int32)
            self._allow_stops(masks[0])
            return 0, masks.view(np.uint32)
        k = self.matcher.validate_tokens(drafts) if drafts else 0
        masks = np.zeros((k + 1, self.words), dtype=np.int32)  # llguidance fills int32 words
        for j in range(k + 1):
            if j:
                self.matcher.consume_token(drafts[j - 1])
            self._fill(self.matcher, masks, j)
            if self.matcher.is_accepting():
                self._allow_stops(masks[j])
        if k:
            self.matcher.rollback(k)
        return k, masks.view(np.uint32)

    def _allow_stops(self, mask: np.ndarray) -> None:
        bits = (np.ones_like(self.stop_ids) << (self.stop_ids % 32)).astype(np.uint32).view(np.int32)
        np.bitwise_or.at(mask, self.stop_ids // 32, bits)

    def advance(self, tokens: list[int]) -> None:
        self.matcher.consume_tokens(tokens)

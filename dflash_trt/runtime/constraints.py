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
    allowed wherever the grammar may end (llguidance allows only the tokenizer's own EOS). `after_id`:
    the token after which the grammar starts (a reasoning model's end of thinking; before it, any token),
    or None: from the first."""

    def __init__(self, tokenizer, structured: StructuredOutput, vocab: int, stop_ids: tuple[int, ...],
                 after_id: int | None = None):
        import llguidance
        import llguidance.numpy

        self._fill = llguidance.numpy.fill_next_token_bitmask
        self.matcher = llguidance.LLMatcher(tokenizer, structured.lark())
        self.words = (vocab + 31) // 32
        self.stop_ids = np.array([t for t in stop_ids if 0 <= t < vocab], dtype=np.int64)
        self.stops = set(self.stop_ids.tolist())
        self.after_id, self.waiting = after_id, after_id is not None

    def masks(self, drafts: list[int], may_replace: bool = False) -> tuple[int, np.ndarray, list[int]]:
        """(k, masks [k + 1, words], drafts): k the leading drafts the grammar allows, mask j following
        the output and drafts[:j]. `may_replace`: a refused draft where the grammar allows one token only
        (a schema's key, a bracket) becomes that token in the drafts returned (csrc/constraint.h)."""
        drafts = list(drafts)
        masks = np.zeros((len(drafts) + 1, self.words), dtype=np.int32)  # llguidance fills int32 words
        if not self.waiting and self.matcher.is_error():  # it refused a committed token: only a stop may come
            self._allow_stops(masks[0])
            return 0, masks[:1].view(np.uint32), drafts
        k = consumed = 0  # drafts kept; of those, the ones the matcher took (rolled back at the end)
        waiting = self.waiting
        while True:
            if waiting:
                masks[k] = -1  # every token
            else:
                self._fill(self.matcher, masks, k)
                if self.matcher.is_accepting():
                    self._allow_stops(masks[k])
            if k == len(drafts):
                break
            if waiting:
                if drafts[k] in self.stops:
                    break
                waiting = drafts[k] != self.after_id
                k += 1
                continue
            if not _allows(masks[k], drafts[k]):
                only = _only(masks[k]) if may_replace else None
                if only is None:
                    break
                drafts[k] = only
            # a stop ends the reply where it is kept: no position after it is ever reached
            if drafts[k] in self.stops or not self.matcher.consume_token(drafts[k]):
                break
            k += 1
            consumed += 1
        if consumed:
            self.matcher.rollback(consumed)
        return k, masks[:k + 1].view(np.uint32), drafts

    def _allow_stops(self, mask: np.ndarray) -> None:
        bits = (np.ones_like(self.stop_ids) << (self.stop_ids % 32)).astype(np.uint32).view(np.int32)
        np.bitwise_or.at(mask, self.stop_ids // 32, bits)

    def advance(self, tokens: list[int]) -> None:
        tokens = list(tokens)
        if self.waiting and self.after_id in tokens:
            tokens = tokens[tokens.index(self.after_id) + 1:]
            self.waiting = False
        if not self.waiting and tokens:
            self.matcher.consume_tokens(tokens)


def _allows(mask: np.ndarray, token: int) -> bool:
    return 0 <= token < mask.size * 32 and bool((int(mask[token // 32]) >> (token % 32)) & 1)


def _only(mask: np.ndarray) -> int | None:
    """The one token a mask allows, or None when it allows several (or none)."""
    words = np.flatnonzero(mask)
    if words.size != 1:
        return None
    word = int(mask[words[0]]) & 0xFFFFFFFF
    return int(words[0]) * 32 + word.bit_length() - 1 if word & (word - 1) == 0 else None

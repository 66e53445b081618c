"""vLLM's allowed_token_ids, bad_words and thinking_token_budget as output constraints (csrc/constraint.h's
protocol, as a grammar's: runtime/constraints.py): the tokens they refuse get -inf before every decision,
each verify position after the drafts before it, so DFlash stays lossless under them."""

from __future__ import annotations

import numpy as np


def bad_word_sequences(tokenizer, words: tuple[str, ...]) -> list[tuple[int, ...]]:
    """Each bad word as the token sequences that spell it, as vLLM bans them: the word alone and after a
    space (the form it takes inside a text), without special tokens."""
    sequences = []
    for word in words:
        for text in (word.lstrip(), " " + word.lstrip()):
            ids = tuple(tokenizer.encode(text, add_special_tokens=False))
            if ids and ids not in sequences:
                sequences.append(ids)
    return sequences


def vocab_mask(vocab: int, allowed: tuple[int, ...] | None = None, refused: list[int] = ()) -> np.ndarray:
    """The core's mask words (bit t of word t // 32) allowing `allowed` (None: every token) less `refused`."""
    bits = np.zeros(((vocab + 31) // 32) * 32, dtype=bool)
    bits[list(allowed) if allowed is not None else slice(0, vocab)] = True
    bits[list(refused)] = False
    return np.packbits(bits, bitorder="little").view(np.uint32)


class TokenRules:
    """`allowed`: the only tokens that may come (None: every token); `bad`: token sequences the output may
    not hold (a sequence's last token is refused where the output so far ends with the rest of it; a
    one-token sequence everywhere)."""

    def __init__(self, vocab: int, allowed: tuple[int, ...] | None, bad: list[tuple[int, ...]]):
        self.base = vocab_mask(vocab, allowed, [seq[0] for seq in bad if len(seq) == 1])
        self.longer = [seq for seq in bad if len(seq) > 1]
        self.context = max((len(seq) - 1 for seq in self.longer), default=0)  # output tokens the rules read
        self.recent: list[int] = []  # the output's last `context` tokens

    def _mask(self, recent: list[int]) -> np.ndarray:
        mask = self.base.copy()
        for seq in self.longer:
            head = len(seq) - 1
            if len(recent) >= head and tuple(recent[len(recent) - head:]) == seq[:-1]:
                mask[seq[-1] // 32] &= ~np.uint32(1 << (seq[-1] % 32))
        return mask

    def masks(self, drafts: list[int], may_replace: bool = False) -> tuple[int, np.ndarray, list[int]]:
        """(k, masks [k + 1, words], drafts): k the leading drafts the rules allow, mask j following the
        output and drafts[:j]. No draft is replaced (`may_replace` is the grammar's)."""
        recent, rows, k = list(self.recent), [], 0
        while True:
            rows.append(self._mask(recent))
            if k == len(drafts) or not rows[-1][drafts[k] // 32] >> np.uint32(drafts[k] % 32) & 1:
                break
            recent.append(drafts[k])
            k += 1
        return k, np.stack(rows), list(drafts)

    def advance(self, tokens: list[int]) -> None:
        """Committed output tokens."""
        if self.context:
            self.recent = (self.recent + list(tokens))[-self.context:]


THINK, UNTHINK = "<think>", "</think>"  # a think block's markers (Qwen3, Qwen3.5, DeepSeek-R1)


def _ends_with(recent: tuple[int, ...], tail: tuple[int, ...]) -> bool:
    return len(recent) >= len(tail) and recent[len(recent) - len(tail):] == tail


class ThinkingBudget:
    """vLLM's thinking_token_budget: at most `budget` tokens inside a think block (opened by the `start`
    tokens, in the prompt or the output; closed by the `end` tokens); then `end` is forced, the rest of it
    after any part the output already ends with. Outside a block, and after the one that ends, every
    token may come. State: (phase "idle" | "thinking" | "done", tokens inside so far, recent tokens)."""

    def __init__(self, vocab: int, start: tuple[int, ...], end: tuple[int, ...], budget: int, prompt_ids: list[int]):
        self.every = vocab_mask(vocab)
        self.start, self.end, self.budget = tuple(start), tuple(end), budget
        self.window = max(len(self.start), len(self.end))
        phase = "idle"
        for at in range(len(prompt_ids)):  # whether the prompt leaves a block open
            seen = tuple(prompt_ids[max(0, at + 1 - self.window):at + 1])
            phase = "thinking" if _ends_with(seen, self.start) else "idle" if _ends_with(seen, self.end) else phase
        self.state = (phase, 0, tuple(prompt_ids[-self.window:]))

    def _step(self, state: tuple, token: int) -> tuple:
        phase, count, recent = state
        recent = (*recent, token)[-self.window:]
        if phase == "idle" and _ends_with(recent, self.start):
            return "thinking", 0, recent
        if phase == "thinking":
            return ("done", count, recent) if _ends_with(recent, self.end) else ("thinking", count + 1, recent)
        return phase, count, recent

    def _forced(self, state: tuple) -> int | None:
        """The token the budget forces next, or None."""
        phase, count, recent = state
        if phase != "thinking" or count < self.budget:
            return None
        done = next(j for j in range(len(self.end) - 1, -1, -1) if _ends_with(recent, self.end[:j]))
        return self.end[done]

    def masks(self, drafts: list[int], may_replace: bool = False) -> tuple[int, np.ndarray, list[int]]:
        """(k, masks [k + 1, words], drafts): k the leading drafts the budget allows, mask j following the
        output and drafts[:j]. With `may_replace`, a draft where the budget forces a token becomes it."""
        state, rows, k, drafts = self.state, [], 0, list(drafts)
        while True:
            forced = self._forced(state)
            if forced is None:
                rows.append(self.every)
            else:
                rows.append(np.zeros_like(self.every))
                rows[-1][forced // 32] = np.uint32(1 << (forced % 32))
            if k == len(drafts):
                break
            if forced is not None and drafts[k] != forced:
                if not may_replace:
                    break
                drafts[k] = forced
            state = self._step(state, drafts[k])
            k += 1
        return k, np.stack(rows), drafts

    def advance(self, tokens: list[int]) -> None:
        """Committed output tokens."""
        for token in tokens:
            self.state = self._step(self.state, token)


class AllOf:
    """Several constraints as one: a token must pass every one; a draft is kept while every one keeps
    it. The first may replace refused drafts (a grammar's forced token); the others judge the drafts
    it returns."""

    def __init__(self, *parts):
        self.parts = parts

    def masks(self, drafts: list[int], may_replace: bool = False) -> tuple[int, np.ndarray, list[int]]:
        k, found = len(drafts), []
        for index, part in enumerate(self.parts):
            kept, masks, drafts = part.masks(drafts, may_replace and index == 0)
            k = min(k, kept)
            found.append(masks)
        out = found[0][:k + 1].copy()
        for masks in found[1:]:
            out &= masks[:k + 1]
        return k, out, drafts

    def advance(self, tokens: list[int]) -> None:
        for part in self.parts:
            part.advance(tokens)

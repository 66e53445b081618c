"""A constraint for the core written apart from any grammar library (the protocol of csrc/constraint.h
as bindings.cpp's PyConstraint calls it): no token may be one of the `window` tokens before it (the
prompt's last ones at first). Its masks depend on the output and on each draft before a position, so a
core that masks a verify position by the wrong history decodes differently from `no_recent_greedy`."""

from __future__ import annotations

import numpy as np
import torch

from dflash_trt.runtime.torch_backend import TorchTargetSession


class NoRecent:
    def __init__(self, vocab: int, prompt: list[int], window: int = 2):
        self.words, self.window = (vocab + 31) // 32, window
        self.recent = list(prompt[-window:])
        self.calls = 0

    def _mask(self, banned: list[int]) -> np.ndarray:
        mask = np.full(self.words, 0xFFFFFFFF, dtype=np.uint32)
        for token in banned:
            mask[token // 32] &= ~np.uint32(1 << (token % 32))
        return mask

    def masks(self, drafts: list[int], may_replace: bool):  # never replaces: every mask allows several
        self.calls += 1
        history = list(self.recent)
        masks = [self._mask(history[-self.window:])]
        for draft in drafts:  # the leading drafts that keep the rule
            if draft in history[-self.window:]:
                break
            history.append(draft)
            masks.append(self._mask(history[-self.window:]))
        return len(masks) - 1, np.stack(masks), drafts

    def advance(self, tokens: list[int]) -> None:
        self.recent = (self.recent + list(tokens))[-self.window:]


def no_recent_greedy(target, prompt: list[int], max_tokens: int, window: int = 2) -> list[int]:
    """Greedy autoregressive decoding with the torch target, each step's argmax over the tokens that are
    not among the `window` before it (no EOS)."""
    session = TorchTargetSession(target, ())
    logits, _ = session.prefill(prompt)
    out, history = [], list(prompt)
    while len(out) < max_tokens:
        row = logits.float().clone()
        row[history[-window:]] = -torch.inf
        token = int(row.argmax())
        out.append(token)
        history.append(token)
        logits, _ = session.forward([token])
        session.commit(1)
        logits = logits[-1]
    return out

"""Draft vocabulary: the token ids a drafter may propose, and the output layer restricted to them.

A drafter borrows the target's LM head, and on a CPU that head (49k rows for SmolLM2) is most of a
draft step's cost. Tokens the drafter was never trained to output are rarely right anyway, so a
drafter folder may list the ids it proposes in `draft_vocab.json` (EAGLE-3 does the same with its
`d2t` table). Output stays lossless: drafts are only proposals, and the target verifies every one;
a token outside the list is simply never drafted. The file is ours, not z-lab's: other loaders
ignore it (it is not a *.safetensors file) and use the full head.
"""

from __future__ import annotations

import itertools
import json
import os
from pathlib import Path

import torch
from torch import nn

from dflash_trt.errors import DFlashError

DRAFT_VOCAB_FILE = "draft_vocab.json"


def read_draft_vocab(folder: Path, vocab_size: int | None = None) -> torch.Tensor | None:
    """The folder's draft vocabulary (sorted unique int64 ids), or None when it has none."""
    path = Path(folder) / DRAFT_VOCAB_FILE
    if not path.is_file():
        return None
    try:
        ids = json.loads(path.read_text())["token_ids"]
    except (ValueError, KeyError, TypeError) as err:
        raise DFlashError(f"{path}: not a draft vocabulary (expected {{\"token_ids\": [...]}}; {err})") from None
    if not ids or not all(isinstance(i, int) and i >= 0 for i in ids):
        raise DFlashError(f"{path}: token_ids must be a non-empty list of token ids (integers >= 0)")
    if any(a >= b for a, b in itertools.pairwise(ids)):
        raise DFlashError(f"{path}: token_ids must be sorted and unique")
    if vocab_size is not None and ids[-1] >= vocab_size:
        raise DFlashError(f"{path}: token id {ids[-1]} is outside the target's vocabulary ({vocab_size} tokens)")
    return torch.tensor(ids, dtype=torch.long)


def write_draft_vocab(folder: Path, ids: torch.Tensor, source: str) -> None:
    ids = sorted({int(i) for i in ids.flatten().tolist()})
    record = {"source": source, "size": len(ids), "token_ids": ids}
    path = Path(folder) / DRAFT_VOCAB_FILE
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(record, separators=(",", ":")) + "\n")
    os.replace(tmp, path)  # a reader sees the old list or the new one, never half of one


def response_counts(sequences: list[dict], vocab_size: int) -> torch.Tensor:
    """How often each id occurs in the responses (tokens after `prompt_len`) of corpus sequences."""
    counts = torch.zeros(vocab_size, dtype=torch.long)
    for seq in sequences:
        counts += torch.bincount(seq["tokens"][seq["prompt_len"] :].long(), minlength=vocab_size)[:vocab_size]
    return counts


def most_frequent(counts: torch.Tensor, size: int) -> torch.Tensor:
    """The `size` ids with the highest counts (ids never seen are never chosen), sorted by id.
    Ties break towards the smaller id, so the choice is a pure function of the counts."""
    seen = int((counts > 0).sum())
    if seen == 0:
        raise DFlashError("draft vocabulary: no response tokens to count")
    order = torch.sort(counts, descending=True, stable=True).indices
    return order[: min(size, seen)].sort().values


def scale_logits(logits: torch.Tensor, multiplier: float, softcap: float | None) -> torch.Tensor:
    """The drafter config's output multiplier and logit soft-capping (as the reference applies them)."""
    if multiplier != 1.0:
        logits = logits * multiplier
    return torch.tanh(logits / softcap) * softcap if softcap else logits


class DraftHead(nn.Module):
    """The drafter's output layer: the target's LM head, or its rows for the draft vocabulary.

    forward(hidden [..., H]) -> (logits [..., V'], greedy draft tokens [...] as target ids).
    """

    def __init__(self, lm_head: nn.Module, token_ids: torch.Tensor | None, multiplier: float = 1.0,
                 softcap: float | None = None, selector: nn.Module | None = None):
        super().__init__()
        self.multiplier, self.softcap = multiplier, softcap
        self.selector = selector  # DFlash2 (models/dflash2.py): tokens walked from the block's anchor
        if token_ids is None:
            self.proj = lm_head  # the target's own module: an export shares its (tied) weight
            self.token_ids = None
            return
        weight = lm_head.weight.detach()
        bias = getattr(lm_head, "bias", None)
        self.proj = nn.Linear(weight.shape[1], token_ids.shape[0], bias=bias is not None,
                              device=weight.device, dtype=weight.dtype)
        self.proj.weight = nn.Parameter(weight[token_ids.to(weight.device)].contiguous(), requires_grad=False)
        if bias is not None:
            self.proj.bias = nn.Parameter(bias.detach()[token_ids.to(weight.device)].contiguous(), requires_grad=False)
        self.register_buffer("token_ids", token_ids.to(weight.device), persistent=False)

    @property
    def size(self) -> int:
        return self.proj.weight.shape[0]

    def forward(self, hidden: torch.Tensor, anchor: torch.Tensor | None = None, tables: bool = False) -> tuple:
        """`anchor` [b]: the token before the first row of each batch row (the block's first token),
        which a DFlash2 selector walks from; unused otherwise. `tables` (DFlash2): also the selector's
        candidate columns and scores (CandidateSelector.tables), for drafts drawn from its distribution."""
        logits = scale_logits(self.proj(hidden), self.multiplier, self.softcap)
        if self.selector is not None:
            if anchor is None:
                raise DFlashError("a DFlash2 draft head needs the block's anchor token")
            found = self.selector.tables(hidden, logits, anchor, self.token_ids)
            tokens = self.selector.walk(*found)
            return (logits, tokens, found[1], found[3]) if tables else (logits, tokens)
        best = logits.argmax(dim=-1)
        return logits, best if self.token_ids is None else self.token_ids[best]

"""Per-request target and draft sessions over the PyTorch reference models: what the Python
reference loop (spec/loop.py, the tests' oracle) runs, one pair per request. The torch backend's
runtime is the slot executor over the exported modules (runtime/torch_graphs.py).
"""

from __future__ import annotations

import torch

from dflash_trt.models.draft_vocab import DraftHead
from dflash_trt.models.drafter import DFlashDrafter, LayerKV
from dflash_trt.models.target import TargetModel


class TorchTargetSession:
    def __init__(self, target: TargetModel, taps: tuple[int, ...]):
        self.target = target
        self.taps = taps
        self.cache = target.new_cache()

    def prefill(self, prompt: list[int]) -> tuple[torch.Tensor, torch.Tensor | None]:
        logits, features = self.target.forward(prompt, self.cache, self.taps, last_logits_only=True)
        self.target.commit(self.cache, len(prompt))
        return logits[-1], features

    def forward(self, ids: list[int]) -> tuple[torch.Tensor, torch.Tensor | None]:
        return self.target.forward(ids, self.cache, self.taps)

    def commit(self, keep: int) -> None:
        self.target.commit(self.cache, keep)


class TorchDraftSession:
    """Holds the drafter's context K/V for the committed prefix (block K/V are never kept)."""

    def __init__(self, drafter: DFlashDrafter, target: TargetModel, head: DraftHead | None = None):
        self.drafter = drafter
        self.target = target
        # Callers that open many sessions pass one head: a draft vocabulary's head is a copy of rows.
        self.head = head if head is not None else drafter.head(target.lm_head)
        self.mask_token_id = drafter.config.mask_token_id
        self.context: list[LayerKV] | None = None
        self.length = 0  # committed positions whose K/V are cached

    @torch.inference_mode()
    def draft(self, features: torch.Tensor, bonus: int, block_size: int) -> list[int]:
        device = self.target.device
        n = features.shape[0]
        new_positions = torch.arange(self.length, self.length + n, device=device)[None]
        new_kv = self.drafter.inject_context(features[None].to(self.drafter.fc.weight.dtype), new_positions)
        if self.context is None:
            self.context = new_kv
        else:
            self.context = [
                (torch.cat([k, nk], dim=2), torch.cat([v, nv], dim=2))
                for (k, v), (nk, nv) in zip(self.context, new_kv, strict=True)
            ]
        self.length += n
        start = self.length  # the bonus token's position
        block = torch.tensor([[bonus] + [self.mask_token_id] * (block_size - 1)], device=device)
        hidden = self.drafter.block_hidden(
            self.target.embed(block),
            torch.arange(start, start + block_size, device=device)[None],
            self.context,
            torch.arange(0, start, device=device)[None],
        )
        # Slot j predicts the token at position start + j; slot 0 (the bonus) is not a draft. Its
        # row still goes through the head: CPU GEMMs are much slower for odd row counts (measured
        # on SmolLM2's head: 7 rows 31.6 ms, 8 rows 15.8 ms), and B is 4 on a CPU by default;
        # 4 rows take SkinnyLinear's product (runtime/skinny.py), as 3 would.
        if self.head.selector is not None:  # DFlash2: the selector walks from the bonus over the drafts only
            _, tokens = self.head(hidden[:, 1:], block[:, 0])
            return tokens[0].tolist()
        _, tokens = self.head(hidden)
        return tokens[0, 1:].tolist()


def sessions(llm, speculative: bool) -> tuple[TorchTargetSession, TorchDraftSession | None]:
    """A (target, drafter) session pair over a torch-backend LLM's models; no drafter when plain."""
    if not speculative:
        return TorchTargetSession(llm.target, ()), None
    taps = llm.drafter.config.target_layer_ids
    return TorchTargetSession(llm.target, taps), TorchDraftSession(llm.drafter, llm.target, llm.draft_head)

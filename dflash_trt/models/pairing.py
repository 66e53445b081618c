"""Pairing checks: is this drafter usable with this target? One line naming the field if not."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from transformers import PreTrainedTokenizerBase

from dflash_trt.errors import DFlashError
from dflash_trt.models.draft_config import DraftConfig


class TargetDims(Protocol):
    """What pairing needs of a target: a loaded TargetModel, or a TargetShape read from its config."""

    hidden_size: int
    num_layers: int
    vocab_size: int


@dataclass(frozen=True)
class TargetShape:
    hidden_size: int
    num_layers: int
    vocab_size: int

    @classmethod
    def of(cls, config) -> TargetShape:
        text = config.get_text_config() if hasattr(config, "get_text_config") else config
        return cls(text.hidden_size, text.num_hidden_layers, text.vocab_size)


def validate_pair(
    target: TargetDims,
    draft: DraftConfig,
    target_tokenizer: PreTrainedTokenizerBase | None = None,
    draft_tokenizer: PreTrainedTokenizerBase | None = None,
) -> None:
    """Raise DFlashError for the first mismatch; checked before any weights are used."""
    if draft.hidden_size != target.hidden_size:
        raise DFlashError(
            f"drafter hidden_size={draft.hidden_size} but the target's is {target.hidden_size}: "
            "the drafter was built for another target"
        )
    if draft.num_target_layers is not None and draft.num_target_layers != target.num_layers:
        raise DFlashError(
            f"drafter num_target_layers={draft.num_target_layers} but the target has {target.num_layers} layers"
        )
    bad = [k for k in draft.target_layer_ids if not 0 <= k < target.num_layers]
    if bad:
        raise DFlashError(
            f"drafter target_layer_ids {list(draft.target_layer_ids)}: layer {bad[0]} is outside the "
            f"target's layers 0..{target.num_layers - 1}"
        )
    if not 0 <= draft.mask_token_id < target.vocab_size:
        raise DFlashError(
            f"drafter mask_token_id={draft.mask_token_id} is outside the target vocabulary (size {target.vocab_size})"
        )
    if draft.vocab_size is not None and draft.vocab_size != target.vocab_size:
        raise DFlashError(f"drafter vocab_size={draft.vocab_size} but the target's is {target.vocab_size}")
    if target_tokenizer is not None and draft_tokenizer is not None:
        if target_tokenizer.get_vocab() != draft_tokenizer.get_vocab():
            raise DFlashError("drafter tokenizer differs from the target tokenizer (different vocabularies)")

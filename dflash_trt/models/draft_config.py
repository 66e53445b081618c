"""DraftConfig: a DFlash drafter's config.json (z-lab HF format), parsed and checked."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from transformers import Qwen3Config

from dflash_trt.errors import DFlashError

# DFlash-specific fields may sit at the top level (older z-lab revisions) or inside
# `dflash_config` (newer ones); SGLang and the reference accept both, so do we.
DFLASH_FIELDS = ("block_size", "target_layer_ids", "mask_token_id", "num_target_layers")
# A DFlash2 drafter (models/dflash2.py) states all four, where the DFlash fields may sit
DFLASH2_FIELDS = ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k")


def default_target_layer_ids(num_target_layers: int, num_taps: int) -> list[int]:
    """Evenly spaced taps from layer 1 to n-3, as the reference's `build_target_layer_ids`."""
    if num_taps == 1:
        return [num_target_layers // 2]
    start, end = 1, num_target_layers - 3
    return [round(start + i * (end - start) / (num_taps - 1)) for i in range(num_taps)]


@dataclass(frozen=True)
class DraftConfig:
    """Everything the drafter and the verify loop need to know about a drafter.

    `arch` is the Qwen3-style layer stack (hidden size, heads, RoPE, sliding windows); the other
    fields are the DFlash contract with the target.
    """

    arch: Qwen3Config
    block_size: int
    target_layer_ids: tuple[int, ...]
    mask_token_id: int
    num_target_layers: int | None = None
    vocab_size: int | None = None  # only when config.json states it (Qwen3Config would invent one)
    input_embedding_scale: float = 1.0
    output_multiplier: float = 1.0
    final_logit_softcapping: float | None = None
    is_causal: bool | None = None  # None: sliding layers causal, full layers not (reference rule)
    # DFlash2: taps of the in-block convolutions and their channel group; the candidate selector's
    # pairwise rank and candidates per position. All None for a DFlash (v1) drafter.
    conv_kernel_size: int | None = None
    conv_group_size: int | None = None
    selector_rank: int | None = None
    selector_top_k: int | None = None

    @property
    def method(self) -> str:
        """"dflash2" when the drafter has DFlash2's convolutions and candidate selector, else "dflash"."""
        return "dflash" if self.conv_kernel_size is None else "dflash2"

    def describe(self) -> str:
        """The method in words, for plans and refusals."""
        if self.method == "dflash":
            return "DFlash"
        return (f"DFlash2 (conv {self.conv_kernel_size} taps per {self.conv_group_size} channels, "
                f"selector top-{self.selector_top_k} rank {self.selector_rank})")

    @property
    def hidden_size(self) -> int:
        return self.arch.hidden_size

    @property
    def num_layers(self) -> int:
        return self.arch.num_hidden_layers

    def layer_type(self, layer: int) -> str:
        types = self.arch.layer_types
        return types[layer] if types else "full_attention"

    def layer_is_causal(self, layer: int) -> bool:
        if self.is_causal is not None:
            return self.is_causal
        return self.layer_type(layer) == "sliding_attention"

    def layer_window(self, layer: int) -> int | None:
        # Qwen3Config keeps sliding_window only when use_sliding_window is true; the reference
        # reads it from there too, so a sliding layer without it is causal with no window.
        return self.arch.sliding_window if self.layer_type(layer) == "sliding_attention" else None

    @classmethod
    def from_dict(cls, raw: dict[str, Any], where: str = "config.json") -> DraftConfig:
        nested = raw.get("dflash_config") or {}

        def field(name: str, default: Any = None) -> Any:
            return nested.get(name, raw.get(name, default))

        mask = field("mask_token_id")
        if mask is None:
            raise DFlashError(f"{where}: drafter config has no mask_token_id (top level or dflash_config)")
        arch_fields = {k: v for k, v in raw.items() if k not in ("dflash_config", "architectures")}
        for name in ("hidden_size", "num_hidden_layers", "num_attention_heads"):
            if name not in arch_fields:
                raise DFlashError(f"{where}: drafter config is missing '{name}'")
        arch = Qwen3Config(**arch_fields)
        num_target_layers = field("num_target_layers")
        layer_ids = field("target_layer_ids")
        if layer_ids is None:
            if num_target_layers is None:
                raise DFlashError(f"{where}: drafter config needs target_layer_ids or num_target_layers")
            layer_ids = default_target_layer_ids(int(num_target_layers), arch.num_hidden_layers)
        v2 = {name: field(name) for name in DFLASH2_FIELDS}
        stated = [name for name, value in v2.items() if value is not None]
        if stated and len(stated) < len(DFLASH2_FIELDS):
            missing = next(name for name in DFLASH2_FIELDS if v2[name] is None)
            raise DFlashError(f"{where}: a DFlash2 drafter config needs {missing} beside {stated[0]}")
        if not stated and "DFlash2DraftModel" in (raw.get("architectures") or []):
            raise DFlashError(f"{where}: architectures says DFlash2DraftModel but the config has no "
                              f"{DFLASH2_FIELDS[0]} (nor any DFlash2 field)")
        config = cls(
            arch=arch,
            block_size=int(field("block_size", 16)),
            target_layer_ids=tuple(int(i) for i in layer_ids),
            mask_token_id=int(mask),
            num_target_layers=None if num_target_layers is None else int(num_target_layers),
            vocab_size=raw.get("vocab_size"),
            input_embedding_scale=float(field("input_embedding_scale", 1.0)),
            output_multiplier=float(field("output_multiplier", 1.0)),
            final_logit_softcapping=field("final_logit_softcapping"),
            is_causal=field("is_causal", field("causal")),
            **{name: None if value is None else int(value) for name, value in v2.items()},
        )
        config.check(where)
        return config

    @classmethod
    def from_dir(cls, path: str | Path) -> DraftConfig:
        file = Path(path) / "config.json"
        if not file.is_file():
            raise DFlashError(f"{path}: no config.json; a drafter directory needs config.json + *.safetensors")
        try:
            raw = json.loads(file.read_text())
        except json.JSONDecodeError as err:
            raise DFlashError(f"{file}: not valid JSON ({err.msg} at line {err.lineno})") from None
        return cls.from_dict(raw, where=str(file))

    def check(self, where: str) -> None:
        """Internal consistency; pairing with a target is checked in `pairing.py`."""
        if self.block_size < 2:
            raise DFlashError(f"{where}: block_size is {self.block_size}; DFlash needs a block of at least 2")
        if not self.target_layer_ids:
            raise DFlashError(f"{where}: target_layer_ids is empty")
        if self.arch.num_attention_heads % self.arch.num_key_value_heads:
            raise DFlashError(f"{where}: num_attention_heads must be a multiple of num_key_value_heads")
        if self.method == "dflash2":
            for name in DFLASH2_FIELDS:
                if getattr(self, name) < 1:
                    raise DFlashError(f"{where}: {name} is {getattr(self, name)}; it must be at least 1")
            if self.hidden_size % self.conv_group_size:
                raise DFlashError(f"{where}: conv_group_size {self.conv_group_size} does not divide hidden_size "
                                  f"{self.hidden_size}")
            if self.vocab_size is None:
                raise DFlashError(f"{where}: a DFlash2 drafter needs vocab_size (its selector's codebooks have a "
                                  f"row per token)")

    def to_dict(self) -> dict[str, Any]:
        """The z-lab layout: Qwen3 fields at top level, DFlash fields inside `dflash_config`."""
        raw = self.arch.to_dict()
        raw["architectures"] = ["DFlash2DraftModel" if self.method == "dflash2" else "DFlashDraftModel"]
        raw["dflash_config"] = {
            "block_size": self.block_size,
            "target_layer_ids": list(self.target_layer_ids),
            "mask_token_id": self.mask_token_id,
            **{name: getattr(self, name) for name in DFLASH2_FIELDS if getattr(self, name) is not None},
        }
        if self.vocab_size is not None:
            raw["vocab_size"] = self.vocab_size
        raw["block_size"] = self.block_size  # older readers look at the top level only
        if self.num_target_layers is not None:
            raw["num_target_layers"] = self.num_target_layers
        return raw

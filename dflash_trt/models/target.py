"""TargetModel: an HF causal LM seen through the DFlash contract.

One forward returns logits and the tapped features (the residual-stream OUTPUT of each layer in
`target_layer_ids`, i.e. HF `hidden_states[k + 1]`), and the KV cache can be rolled back to any
committed length. Hybrid models with recurrent state (Gated DeltaNet) cannot crop that state, so
for them the cache is snapshotted before a multi-token forward and rolled back by restoring the
snapshot and re-feeding the kept tokens: exact, at the cost of one short extra forward.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import torch
from torch import nn
from transformers import DynamicCache, PreTrainedModel

from dflash_trt.errors import DFlashError
from dflash_trt.models.kv_cache import growing_cache

ATTENTION_ONLY = frozenset({"llama", "mistral", "qwen2", "qwen3", "qwen3_moe"})
HYBRID_RECURRENT = frozenset({"qwen3_next", "qwen3_5_text", "qwen3_5_moe_text"})
SUPPORTED_MODEL_TYPES = ATTENTION_ONLY | HYBRID_RECURRENT


def check_model_type(model_type: str, where: str) -> None:
    if model_type not in SUPPORTED_MODEL_TYPES:
        names = ", ".join(sorted(SUPPORTED_MODEL_TYPES))
        raise DFlashError(f"{where}: target model_type '{model_type}' is not supported (supported: {names})")


@dataclass
class TargetCache:
    """KV cache plus what is needed to roll it back exactly."""

    kv: DynamicCache
    length: int = 0  # committed tokens
    snapshot: DynamicCache | None = None  # hybrid models only: state before the pending forward
    pending: list[int] = field(default_factory=list)  # tokens fed since the last commit


class TargetModel:
    def __init__(self, model: PreTrainedModel):
        self.model = model.eval()
        self.config = model.config
        self.model_type = self.config.model_type
        check_model_type(self.model_type, "target")
        self.is_stateful = self.model_type in HYBRID_RECURRENT

    @property
    def hidden_size(self) -> int:
        return self.config.hidden_size

    @property
    def num_layers(self) -> int:
        return self.config.num_hidden_layers

    @property
    def vocab_size(self) -> int:
        return self.model.get_input_embeddings().weight.shape[0]

    @property
    def lm_head(self) -> nn.Module:
        return self.model.get_output_embeddings()

    @property
    def device(self) -> torch.device:
        return self.model.device

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        # Raw table lookup, as the reference's noise embedding (no model-specific scaling).
        return nn.functional.embedding(ids, self.model.get_input_embeddings().weight)

    def new_cache(self) -> TargetCache:
        return TargetCache(kv=growing_cache(self.config))

    @torch.inference_mode()
    def forward(
        self,
        ids: list[int],
        cache: TargetCache,
        taps: tuple[int, ...] = (),
        last_logits_only: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Feed `ids` after the cache -> (logits [n or 1, V], features [n, taps*H] or None).

        The new tokens stay pending until `commit` says how many of them to keep.
        """
        assert not cache.pending, "commit() the previous forward first"
        if self.is_stateful and len(ids) > 1:
            cache.snapshot = copy.deepcopy(cache.kv)
        start = cache.length
        out = self._run(ids, cache.kv, start, taps, last_logits_only)
        cache.pending = list(ids)
        features = None
        if taps:
            # hidden_states[0] is the embedding output; layer k's output is index k + 1.
            features = torch.cat([out.hidden_states[k + 1][0] for k in taps], dim=-1)
        return out.logits[0], features

    def commit(self, cache: TargetCache, keep: int) -> None:
        """Keep the first `keep` pending tokens in the cache and drop the rest."""
        pending, cache.pending = cache.pending, []
        assert 0 <= keep <= len(pending)
        drop = len(pending) - keep
        # a recurrent state cannot be cropped: dropping tokens needs the snapshot taken in forward()
        assert not (drop and self.is_stateful and cache.snapshot is None), "stateful rollback without a snapshot"
        if drop and cache.snapshot is not None:
            cache.kv = cache.snapshot
            if keep:
                self._run(pending[:keep], cache.kv, cache.length, (), True)
        elif drop:
            cache.kv.crop(-drop)
        cache.snapshot = None
        cache.length += keep

    def _run(self, ids, kv, start, taps, last_logits_only):
        input_ids = torch.tensor([ids], dtype=torch.long, device=self.device)
        positions = torch.arange(start, start + len(ids), device=self.device)[None]
        with torch.inference_mode():
            return self.model(
                input_ids=input_ids,
                position_ids=positions,
                past_key_values=kv,
                use_cache=True,
                output_hidden_states=bool(taps),
                logits_to_keep=1 if last_logits_only else 0,
            )


def eos_token_ids(target: TargetModel, tokenizer) -> tuple[int, ...]:
    """Every id that ends a reply: the generation config's and the tokenizer's."""
    ids = target.model.generation_config.eos_token_id
    ids = [] if ids is None else [ids] if isinstance(ids, int) else list(ids)
    if tokenizer is not None and tokenizer.eos_token_id is not None:
        ids.append(tokenizer.eos_token_id)
    return tuple(sorted(set(ids)))

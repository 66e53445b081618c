"""A KV cache that grows in place: HF's DynamicCache re-concatenates every layer's whole cache on
each new token (an O(length) copy per step: 30 % of a batch-48 SmolLM2 decode step on our CPU).
Here each layer keeps a buffer with spare capacity, doubled when full, and hands attention views.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer


class GrowingLayer(DynamicLayer):
    """DynamicLayer semantics (update / crop / batch_select_indices) over a preallocated buffer."""

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        super().lazy_initialization(key_states, value_states)
        self.length = 0
        self._keys = self._values = None

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        end = self.length + key_states.shape[-2]
        if self._keys is None or end > self._keys.shape[-2]:
            self._grow(key_states, value_states, end)
        self._keys[..., self.length : end, :] = key_states
        self._values[..., self.length : end, :] = value_states
        self.length = end
        self.keys, self.values = self._keys[..., :end, :], self._values[..., :end, :]
        return self.keys, self.values

    def _grow(self, key_states: torch.Tensor, value_states: torch.Tensor, needed: int) -> None:
        capacity = max(needed, 2 * (0 if self._keys is None else self._keys.shape[-2]), 64)
        keys = key_states.new_empty(*key_states.shape[:-2], capacity, key_states.shape[-1])
        values = value_states.new_empty(*value_states.shape[:-2], capacity, value_states.shape[-1])
        if self.length:
            keys[..., : self.length, :] = self._keys[..., : self.length, :]
            values[..., : self.length, :] = self._values[..., : self.length, :]
        self._keys, self._values = keys, values

    def get_seq_length(self) -> int:
        return self.length if self.is_initialized else 0

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove > 0:
            raise ValueError("crop takes the negative number of tokens to remove, as DynamicLayer.crop")
        if tokens_to_remove == 0 or not self.is_initialized:
            return
        self.length = max(0, self.length + tokens_to_remove)
        self.keys, self.values = self._keys[..., : self.length, :], self._values[..., : self.length, :]

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        if self.get_seq_length() > 0:
            self._keys, self._values = self._keys[indices], self._values[indices]
            self.keys, self.values = self._keys[..., : self.length, :], self._values[..., : self.length, :]

    def batch_repeat_interleave(self, repeats: int) -> None:
        if self.get_seq_length() > 0:
            self._keys = self._keys.repeat_interleave(repeats, dim=0)
            self._values = self._values.repeat_interleave(repeats, dim=0)
            self.keys, self.values = self._keys[..., : self.length, :], self._values[..., : self.length, :]

    def reset(self) -> None:
        self._keys = self._values = None
        self.length = 0
        super().reset()


def growing_cache(config) -> DynamicCache:
    """A DynamicCache whose full-attention layers grow in place; other layer kinds (sliding window,
    linear attention) keep HF's own classes, so hybrid and sliding models behave as before."""
    cache = DynamicCache(config=config)
    cache.layers = [GrowingLayer() if type(layer) is DynamicLayer else layer for layer in cache.layers]
    return cache

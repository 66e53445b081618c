"""One request's target session over bundle contract v1 (present = past ++ new), backend-agnostic.

The onnxruntime and TensorRT backends differ only in how a graph runs and how a cache is cut back
to the committed length; prefill, verify and commit are the same and live here.

Hybrid targets (bundle.json `target.linear_attention`) also carry each linear-attention layer's
conv and recurrent state: the graph returns them for every position from `logits_from` on
(export/hybrid_graphs.py), and commit picks the ones after the last kept token, so a rollback
after a partial acceptance is exact without re-feeding tokens.
"""

from __future__ import annotations

from typing import Any


def cache_layout(info: dict, dtype: str) -> list[tuple[str, tuple[int, ...], str]]:
    """bundle.json's `target` or `draft` entry -> (kind, empty shape for one row, dtype) per cache
    input of its graph, in order: "kv" per full-attention layer's K and V, then "conv" and
    "recurrent" per linear-attention layer of a hybrid target (the recurrent state is float32
    whatever the bundle's dtype)."""
    linear = info.get("linear_attention")
    types = info.get("layer_types") or ["full_attention"] * info["num_layers"]
    kv = ("kv", (1, info["num_key_value_heads"], 0, info["head_dim"]), dtype)
    layout = [kv, kv] * types.count("full_attention")
    if linear:
        conv = ("conv", (1, linear["conv_dim"], linear["conv_kernel"] - 1), dtype)
        state = (1, linear["num_value_heads"], linear["key_head_dim"], linear["value_head_dim"])
        layout += [conv, ("recurrent", state, "float32")] * types.count("linear_attention")
    return layout


class ConcatCacheTarget:
    def __init__(self, past: list[Any], kinds: list[str] | None = None):
        self.past = past  # per cache input: K/V [1, kv_heads, length, head_dim], or a linear layer's state
        self.kinds = kinds or ["kv"] * len(past)
        self.length = 0  # committed tokens
        self.pending: list[Any] | None = None  # the last forward's present K/V (and states), until commit
        self.pending_from = 0  # the last forward's logits_from: where its per-position states start

    def _step(self, ids: list[int], logits_from: int) -> tuple[Any, Any, list[Any]]:
        """Run the target graph -> (logits [n - logits_from, V], features [n, F], present caches)."""
        raise NotImplementedError

    def _keep(self, present: Any, length: int) -> Any:
        """`present` cut to its first `length` positions, contiguous (the next step's past)."""
        raise NotImplementedError

    def _own(self, view: Any) -> Any:
        """A state's slice as the next step's input (contiguous where the backend needs it)."""
        return view

    def _run(self, ids: list[int], last_only: bool = False):
        assert self.pending is None, "commit() the previous forward first"
        self.pending_from = len(ids) - 1 if last_only else 0
        logits, features, self.pending = self._step(ids, self.pending_from)
        return logits, features

    def prefill(self, prompt: list[int]):
        logits, features = self._run(prompt, last_only=True)
        self.commit(len(prompt))
        return logits[-1], features

    def forward(self, ids: list[int]):
        return self._run(ids)

    def commit(self, keep: int) -> None:
        present, self.pending = self.pending, None
        self.length += keep
        kept = keep - self.pending_from  # positions kept from logits_from on: they index the states
        self.past = [self._cut(kind, new, old, kept) for kind, new, old in zip(self.kinds, present, self.past, strict=True)]

    def _cut(self, kind: str, new: Any, old: Any, kept: int) -> Any:
        if kind == "kv":  # rollback: drop what was not kept
            return self._keep(new, self.length)
        assert kept >= 0, "a prefill keeps all its tokens"
        if kind == "conv":  # the conv window's K-1 columns that end at the last kept token
            return self._own(new[:, :, kept: kept + old.shape[2]])
        return old if kept == 0 else self._own(new[:, kept - 1])  # "recurrent": the state after it

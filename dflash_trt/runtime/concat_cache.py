"""One request's target session over bundle contract v1 (present = past ++ new), backend-agnostic.

The onnxruntime and TensorRT backends differ only in how a graph runs and how a cache is cut back
to the committed length; prefill, verify and commit are the same and live here.
"""

from __future__ import annotations

from typing import Any


class ConcatCacheTarget:
    def __init__(self, past: list[Any]):
        self.past = past  # per layer K and V, [1, kv_heads, length, head_dim]
        self.length = 0  # committed tokens
        self.pending: list[Any] | None = None  # the last forward's present K/V, until commit

    def _step(self, ids: list[int], logits_from: int) -> tuple[Any, Any, list[Any]]:
        """Run the target graph -> (logits [n - logits_from, V], features [n, F], present K/V)."""
        raise NotImplementedError

    def _keep(self, present: Any, length: int) -> Any:
        """`present` cut to its first `length` positions, contiguous (the next step's past)."""
        raise NotImplementedError

    def _run(self, ids: list[int], last_only: bool = False):
        assert self.pending is None, "commit() the previous forward first"
        logits, features, self.pending = self._step(ids, len(ids) - 1 if last_only else 0)
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
        self.past = [self._keep(p, self.length) for p in present]  # rollback: drop what was not kept

"""The torch backend's executor for the C++ core (dflash_trt._core.Executor, csrc/executor.h): one
(target, drafter) session pair per KV slot, looping over the rows of each phase, so requests share
steps but not the model's matrix multiplies (until a torch graph backend runs behind the C++ slot
executor). Bundles bring C++ executors instead (runtime/ort_executor.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from dflash_trt.runtime.native import native_core


def _rows_of(logits: torch.Tensor) -> np.ndarray:
    """Logits [V] or [n, V] as a float32 numpy array [n, V] the core reads through the buffer protocol."""
    array = logits.detach().to(torch.float32).cpu().numpy()
    return array.reshape(1, -1) if array.ndim == 1 else array


@dataclass
class _Row:
    target: Any
    drafter: Any
    # committed positions' features not yet injected into the drafter, one tensor per prefill chunk or
    # verify (joined at the next draft: a row that never drafts never copies them)
    features: list[torch.Tensor] = field(default_factory=list)
    pending: torch.Tensor | None = None  # the last verify block's features, until commit


def session_executor(llm):
    """A core Executor over a torch-backend `llm`'s per-request sessions, one pair per KV slot (with a
    drafter session whenever the LLM has a drafter: a row's requests may be plain or speculative)."""
    from dflash_trt.runtime import torch_backend

    core = native_core()  # the class is made here so that importing this module does not need the extension

    class SessionExecutor(core.Executor):
        def __init__(self):
            core.Executor.__init__(self)
            self.rows: dict[int, _Row] = {}

        def prefill_logits(self, rows, chunks):
            out = []
            for row, chunk in zip(rows, chunks, strict=True):
                if row not in self.rows:  # a request's first chunk (or its whole prompt): new sessions
                    self.rows[row] = _Row(*torch_backend.sessions(llm, llm.has_drafter))
                state = self.rows[row]
                logits, features = state.target.prefill(chunk)  # after what the session holds
                if features is not None:
                    state.features.append(features)
                out.append(_rows_of(logits))
            return out

        def draft(self, rows, bonus, block_size):
            out = []
            for row, token in zip(rows, bonus, strict=True):
                state = self.rows[row]
                out.append(list(state.drafter.draft(torch.cat(state.features), token, block_size)))
                state.features = []  # injected
            return out

        def verify_logits(self, rows, blocks):
            out = []
            for row, block in zip(rows, blocks, strict=True):
                state = self.rows[row]
                logits, state.pending = state.target.forward(list(block))
                out.append(_rows_of(logits))
            return out

        def commit(self, rows, kept):
            for row, keep in zip(rows, kept, strict=True):
                state = self.rows[row]
                state.target.commit(keep)
                if state.pending is not None:
                    # kept positions wait for the next draft (a block of 1 verifies without drafting)
                    state.features.append(state.pending[:keep])
                state.pending = None

        def release(self, row):
            self.rows.pop(row, None)

    return SessionExecutor()

"""The C++ scheduler (dflash_trt._core.Scheduler) over the existing per-request Python sessions.

`SessionExecutor` implements the core's Executor interface (csrc/executor.h) by holding one
(target, drafter) session pair per row and looping over the rows of each phase: the torch backend's
TorchTargetSession / TorchDraftSession or onnxruntime's OrtTargetSession / OrtDraftSession, opened
through `LLM._sessions`. A phase is therefore batched in name only; true batched graphs come with
graph contract v2 (docs/design/contract-v2.md) and the C++ executors.

`CoreEngine` is the small Python face used by the tests for now: add_request / abort / step /
run-until-done. Nothing in `LLM` uses it yet.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from dflash_trt.errors import DFlashError
from dflash_trt.spec.sampling import SamplingParams


def _core():
    try:
        from dflash_trt import _core
    except ImportError as err:  # never built: say how
        raise DFlashError(
            "dflash_trt._core is not built: run `bash scripts/setup.sh` (needs a C++17 compiler)"
        ) from err
    return _core


def _rows_of(logits: torch.Tensor) -> np.ndarray:
    """Logits [V] or [n, V] as a float32 numpy array [n, V] the core reads through the buffer protocol."""
    array = logits.detach().to(torch.float32).cpu().numpy()
    return array.reshape(1, -1) if array.ndim == 1 else array


@dataclass
class _Row:
    target: Any
    drafter: Any
    features: torch.Tensor | None  # committed positions' features not yet injected into the drafter
    pending: torch.Tensor | None = None  # the last verify block's features, until commit


def executor(llm, speculative: bool = True):
    """A core Executor over `llm`'s per-request sessions (torch or onnxruntime backend)."""
    core = _core()  # the class is made here so that importing this module does not need the extension

    class SessionExecutor(core.Executor):
        def __init__(self):
            core.Executor.__init__(self)
            self.llm = llm
            self.speculative = speculative
            self.rows: dict[int, _Row] = {}

        def prefill(self, rows, prompts):
            out = []
            for row, prompt in zip(rows, prompts, strict=True):
                assert row not in self.rows, f"slot {row} was not released"
                target, drafter = self.llm._sessions(self.speculative)
                logits, features = target.prefill(prompt)
                self.rows[row] = _Row(target, drafter, features)
                out.append(_rows_of(logits))
            return out

        def draft(self, rows, bonus, block_size):
            out = []
            for row, token in zip(rows, bonus, strict=True):
                state = self.rows[row]
                out.append(list(state.drafter.draft(state.features, token, block_size)))
                state.features = state.features[:0]  # injected
            return out

        def verify(self, rows, blocks):
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
                if state.pending is not None and state.features is not None:
                    # kept positions wait for the next draft (a block of 1 verifies without drafting)
                    state.features = torch.cat([state.features, state.pending[:keep]])
                state.pending = None

        def release(self, row):
            self.rows.pop(row, None)

    return SessionExecutor()


@dataclass
class CoreOutput:
    request: int
    prompt_token_ids: list[int]
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None  # "stop", "length" or "abort"
    metrics: dict = field(default_factory=dict)


class CoreEngine:
    """Requests join and leave between steps; each step runs every live request once."""

    def __init__(
        self,
        llm,
        max_batch: int = 8,
        capacity: int = 2048,
        block_size: int | None = None,
        speculative: bool = True,
        engine_seed: int | None = None,
    ):
        core = _core()
        if speculative and not llm.has_drafter:
            raise DFlashError("speculative=True needs a drafter: pass draft=... or use speculative=False")
        block = (block_size or llm.block_size) if speculative else 1
        self.llm = llm
        self.executor = executor(llm, speculative)
        seed = random.getrandbits(64) if engine_seed is None else engine_seed
        self.scheduler = core.Scheduler(
            self.executor,
            core.SchedulerConfig(max_batch=max_batch, capacity=capacity, block_size=block, engine_seed=seed),
        )
        self.outputs: dict[int, CoreOutput] = {}

    @property
    def slots(self):
        return self.scheduler.slots

    def add_request(self, prompt, params: SamplingParams | None = None) -> int:
        params = params or SamplingParams()
        if params.stop:
            raise DFlashError(
                "the core engine stops on token ids only for now; stop strings are not supported yet"
            )
        ids = self.llm.encode(prompt)
        core = _core()
        request = self.scheduler.add_request(
            ids,
            core.RequestParams(
                max_tokens=params.max_tokens,
                temperature=params.temperature,
                top_k=params.top_k,
                top_p=params.top_p,
                seed=params.seed,
                stop_token_ids=list(params.stop_token_ids),
                eos_token_ids=list(self.llm.eos_token_ids),
                ignore_eos=params.ignore_eos,
            ),
        )
        self.outputs[request] = CoreOutput(request, ids)
        return request

    def abort(self, request: int) -> bool:
        return self.scheduler.abort(request)

    def step(self) -> list[CoreOutput]:
        """One scheduler step -> the outputs (updated in place) of the requests it touched."""
        touched = []
        for o in self.scheduler.step():
            output = self.outputs[o["request"]]
            output.token_ids.extend(o["new_tokens"])
            output.finish_reason = o["finish_reason"]
            output.metrics = o["metrics"]
            touched.append(output)
        return touched

    @property
    def has_work(self) -> bool:
        return self.scheduler.has_work

    def run(self, prompts: Sequence | None = None, params: SamplingParams | None = None) -> list[CoreOutput]:
        """Add `prompts` (if any), then step until no request is live -> their outputs, in order."""
        ids = [self.add_request(p, params) for p in prompts or ()]
        while self.has_work:
            self.step()
        return [self.outputs[i] for i in ids]

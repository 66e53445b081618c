"""The C++ scheduler (dflash_trt._core.Scheduler) over an LLM's executor.

A slots bundle brings a C++ executor (runtime/ort_executor.py). The torch backend's
`SessionExecutor` implements the core's Executor interface (csrc/executor.h) in Python by holding
one (target, drafter) session pair per KV slot and looping over the rows of each phase: batched in
name only, until a torch graph backend runs behind the C++ slot executor.

`CoreEngine` is the small Python face over the scheduler: add_request / abort / step /
run-until-done / stats, with adaptive speculation on by default (its cost model seeded at load by
`calibrate_costs`). Plain and speculative requests share it: a plain one verifies blocks of 1.
"""

from __future__ import annotations

import random
import time
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
    # committed positions' features not yet injected into the drafter, one tensor per prefill chunk or
    # verify (joined at the next draft: a row that never drafts never copies them)
    features: list[torch.Tensor] = field(default_factory=list)
    pending: torch.Tensor | None = None  # the last verify block's features, until commit


def executor(llm):
    """A core Executor over a torch-backend `llm`'s per-request sessions, one pair per KV slot (with a
    drafter session whenever the LLM has a drafter: a row's requests may be plain or speculative)."""
    from dflash_trt.runtime import torch_backend

    core = _core()  # the class is made here so that importing this module does not need the extension

    class SessionExecutor(core.Executor):
        def __init__(self):
            core.Executor.__init__(self)
            self.rows: dict[int, _Row] = {}

        def prefill(self, rows, chunks):
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
                if state.pending is not None:
                    # kept positions wait for the next draft (a block of 1 verifies without drafting)
                    state.features.append(state.pending[:keep])
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


def calibrate_costs(
    scheduler, executor, rows: Sequence[int], blocks: Sequence[int], prompt: Sequence[int]
) -> None:
    """Seed the scheduler's cost model before any request: time one verify (and one draft, for a block
    of 2 or more) per (rows, block) on dummy rows, each after an untimed run of the same shape (first
    calls pay for lazy set-up: onnxruntime plans a shape on its first run, and a cold verify timed at
    5 s once kept the policy at B=1 for good). Rows 0..n-1 must be free; they are released after."""
    for n in rows:
        slots = list(range(n))
        executor.prefill(slots, [list(prompt)] * n)
        bonus = [int(prompt[-1])] * n
        for block in blocks:
            for timed in (False, True):
                drafts = [[] for _ in slots]
                if block > 1:
                    start = time.perf_counter()
                    drafts = executor.draft(slots, bonus, block)
                    if timed:
                        scheduler.seed_cost("draft", n, block, time.perf_counter() - start)
                start = time.perf_counter()
                executor.verify(slots, [[b, *d] for b, d in zip(bonus, drafts, strict=True)])
                if timed:
                    scheduler.seed_cost("verify", n, block, time.perf_counter() - start)
                executor.commit(slots, [1] * n)
        for row in slots:
            executor.release(row)


class CoreEngine:
    """Requests join and leave between steps; each step runs every running request once, and
    requests beyond the free slots wait in the core's queue.

    `adaptive` (default: on when the LLM has a drafter and `block_size` is not pinned) lets each step choose its
    verify block in 1..block_size (the model's block unless pinned) from the measured cost of the
    executor's calls and the running acceptance estimate; `calibrate` times a few calls at load to
    seed the cost model (`calibrate_costs`)."""

    def __init__(
        self,
        llm,
        max_batch: int = 8,
        capacity: int = 2048,
        block_size: int | None = None,
        speculative: bool = True,
        engine_seed: int | None = None,
        adaptive: bool | None = None,
        max_waiting: int = -1,
        max_block: int | None = None,
        calibrate: bool = True,
        prefill_chunk: int = 0,
    ):
        core = _core()
        if speculative and not llm.has_drafter:
            raise DFlashError("speculative=True needs a drafter: pass draft=... or use speculative=False")
        block = (block_size or max_block or llm.block_size) if llm.has_drafter else 1
        adaptive = (llm.has_drafter and block_size is None) if adaptive is None else adaptive
        if adaptive and not llm.has_drafter:
            raise DFlashError("adaptive=True chooses among speculative block sizes: it needs a drafter")
        self.llm = llm
        self.speculative = speculative  # what a request added without saying does
        self.block_size = block  # the largest block a step verifies (the only one unless adaptive)
        # A slots bundle runs on its C++ executor (its KV slots sized here); the torch backend on sessions.
        batched = getattr(llm, "batched_only", False)
        self.executor = llm._bundle.executor(max_batch, capacity) if batched else executor(llm)
        seed = random.getrandbits(64) if engine_seed is None else engine_seed
        self.scheduler = core.Scheduler(
            self.executor,
            core.SchedulerConfig(
                max_batch=max_batch,
                capacity=capacity,
                block_size=block,
                engine_seed=seed,
                adaptive=adaptive,
                max_waiting=max_waiting,
                prefill_chunk=prefill_chunk,
            ),
        )
        if adaptive and calibrate and block > 1:
            calibrate_costs(
                self.scheduler,
                self.executor,
                sorted({1, max_batch}),
                sorted({1, block}),
                [0] * max(1, min(8, capacity // 2)),
            )
        self.outputs: dict[int, CoreOutput] = {}

    @property
    def slots(self):
        return self.scheduler.slots

    def add_request(self, prompt, params: SamplingParams | None = None, speculative: bool | None = None) -> int:
        """Queue a request -> its id; `speculative` False decodes it plainly (default: the engine's)."""
        params = params or SamplingParams()
        speculative = self.speculative if speculative is None else speculative
        if speculative and not self.llm.has_drafter:
            raise DFlashError("speculative=True needs a drafter: pass draft=... or use speculative=False")
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
                max_block=0 if speculative else 1,
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

    def stats(self) -> dict:
        """Requests running and waiting, and the adaptive bookkeeping: the block each step chose
        (`last_block`, `steps_per_block`), acceptance estimates a_j, timed phase costs."""
        return {
            "num_running": self.scheduler.num_running,
            "num_waiting": self.scheduler.num_waiting,
            **self.scheduler.stats(),
        }

    def run(self, prompts: Sequence | None = None, params: SamplingParams | None = None) -> list[CoreOutput]:
        """Add `prompts` (if any), then step until no request is live -> their outputs, in order."""
        ids = [self.add_request(p, params) for p in prompts or ()]
        while self.has_work:
            self.step()
        return [self.outputs[i] for i in ids]

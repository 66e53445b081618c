"""Many requests at once on the caller's thread: the C++ scheduler (dflash_trt._core) driven from Python.

`BatchRunner` owns a scheduler over the LLM's executor and steps it (what `LLM.generate` and `stream`
use; runtime/engine.py's `Engine` steps one on a thread of its own). The runner keeps what the core
does not: text and stop strings (they need the tokenizer), per-request timing as a caller sees it,
and the counters a server exports. The core keeps the waiting queue, tokens, KV slots, acceptance and
randomness, so a request's tokens never depend on the batch around it.
"""

from __future__ import annotations

import itertools
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace

from dflash_trt.errors import DFlashError
from dflash_trt.runtime.calibration import calibrate_costs
from dflash_trt.runtime.native import native_core
from dflash_trt.runtime.outputs import RequestOutput
from dflash_trt.runtime.prompts import given
from dflash_trt.spec.metrics import RequestMetrics
from dflash_trt.spec.sampling import SamplingParams
from dflash_trt.spec.stopping import StopChecker

DEFAULT_MAX_BATCH = 8
DEFAULT_CAPACITY = 4096  # tokens per KV slot: prompt + max_tokens must fit
# vLLM's: first come first served, or by each request's priority (lower first), preempting running
# requests of a lower one when every slot is taken (csrc/scheduler.h)
SCHEDULING_POLICIES = ("fcfs", "priority")


def check_fits(prompt_tokens: int, max_tokens: int, capacity: int) -> None:
    """One line when a prompt and what it may generate do not fit a KV slot of `capacity` tokens."""
    if prompt_tokens + max_tokens > capacity:
        raise DFlashError(f"prompt ({prompt_tokens} tokens) + max_tokens ({max_tokens}) exceeds the context "
                          f"capacity of {capacity} tokens per request; shorten the prompt or lower max_tokens")


def check_priority(priority, policy: str) -> None:
    """One line for a request's priority that `policy` cannot honour (vLLM's rule: 0 unless "priority")."""
    if isinstance(priority, bool) or not isinstance(priority, int) or not -2**63 <= priority < 2**63:
        raise DFlashError(f"priority must be an integer (lower is served first), got {priority!r}")
    if priority != 0 and policy != "priority":
        raise DFlashError(f"priority {priority} needs scheduling_policy='priority' (serve --scheduling-policy "
                          f"priority); under first come first served every request's priority is 0")


def check_batching(max_batch, capacity, prefill_chunk=0, scheduling_policy="fcfs") -> None:
    if not isinstance(max_batch, int) or max_batch < 1:
        raise DFlashError(f"max_batch must be an integer >= 1, got {max_batch!r}")
    if not isinstance(capacity, int) or capacity < 2:
        raise DFlashError(f"capacity must be an integer >= 2, got {capacity!r}")
    if not isinstance(prefill_chunk, int) or prefill_chunk < 0:
        raise DFlashError(f"prefill_chunk must be an integer >= 0 (0: whole prompts), got {prefill_chunk!r}")
    if scheduling_policy not in SCHEDULING_POLICIES:
        raise DFlashError(f"scheduling_policy must be one of {', '.join(SCHEDULING_POLICIES)}, got {scheduling_policy!r}")


@dataclass(eq=False)  # a request is itself: compared and hashed by identity
class LiveRequest:
    """A request the runner holds: what the core does not keep of it (text, stop strings, clocks)."""

    id: int
    prompt: object
    ids: list[int]
    params: SamplingParams
    speculative: bool
    stop: StopChecker
    on_output: Callable | None
    metrics: RequestMetrics
    arrival: float = field(default_factory=time.perf_counter)
    submitted: float | None = None  # handed to the core, whose queue clock starts there
    first_token: float | None = None
    last_token: float | None = None
    finished_at: float | None = None  # a finished request's clock stops here, however late it is read
    core_id: int | None = None
    finish_reason: str | None = None
    core_metrics: dict = field(default_factory=dict)  # the core's counters and clocks as last seen
    logprobs: list = field(default_factory=list)  # per output token {token: logprob}, its own first
    prompt_logprobs: list | None = None  # per prompt token (None for the first), once prefilled when asked
    constraint: object = None  # its structured output's state (runtime/constraints.py), or None
    priority: int = 0  # with scheduling_policy "priority": lower is served first
    cache_salt: str = ""  # reuses only KV positions of requests with the same salt (vLLM's cache_salt)
    error: str | None = None  # finish "error": why, in one line

    @property
    def token_ids(self) -> list[int]:
        return list(self.stop.token_ids)

    def clock(self) -> None:
        """Bring the metrics' clocks and token count up to now (a finished request's stop at its finish)."""
        m = self.metrics
        now = self.finished_at if self.finished_at is not None else time.perf_counter()
        m.output_tokens = len(self.stop.token_ids)
        m.e2e_latency_s = now - self.arrival
        if self.first_token is not None:
            m.prefill_s = self.first_token - self.arrival
            m.decode_s = now - self.first_token
            m.time_per_output_token_s = m.decode_s / (m.output_tokens - 1) if m.output_tokens > 1 else None


class StepFailed(DFlashError):
    """A step the backend failed (its cause chained): `requests` are those it finished "error", and
    those it had updated before it failed."""

    def __init__(self, cause: BaseException, requests: list[LiveRequest]):
        super().__init__(f"the engine step failed: {type(cause).__name__}: {cause}")
        self.requests = requests


def max_block(speculative: bool, drafts: int | None) -> int:
    """The core's block limit of a request: 1 plain decoding, k + 1 for at most k drafts a step, 0 the
    engine's block."""
    if not speculative:
        return 1
    return 0 if drafts is None else drafts + 1


class BatchRunner:
    """Requests through the core, one `step()` at a time, on the caller's thread."""

    def __init__(self, llm, max_batch: int = DEFAULT_MAX_BATCH, capacity: int = DEFAULT_CAPACITY,
                 speculative: bool | None = None, block_size: int | None = None, engine_seed: int | None = None,
                 prefill_chunk: int = 0, adaptive: bool | None = None, calibrate: bool = True,
                 max_waiting: int = -1, reserve_memory: bool = False, prefix_caching: bool = True,
                 prefix_wait_tokens: int = 128, scheduling_policy: str = "fcfs"):
        """`speculative` is what a request added without saying does (default: speculative when the
        LLM has a drafter; plain requests verify blocks of 1 in the same slots). `block_size` pins the
        verify block; None lets every step choose it in 1..the drafter's trained block
        (`llm.max_block_size`) from measured costs and acceptance (`adaptive`, seeded at load by
        `calibrate_costs` when `calibrate`). `prefill_chunk` N > 0 prefills N prompt tokens per step, so
        a long prompt does not stall the running requests' steps; 0 prefills each prompt whole.
        `max_waiting` caps the requests queued beyond the slots (-1: no cap). `reserve_memory` makes
        the KV slots resident at once (a server: its memory at start is its memory under load).
        `prefix_caching`: a finished request's KV slot keeps its tokens' cache, and a request whose prompt
        starts with them takes that slot and prefills only the rest (its metrics' `cached_tokens`).
        `prefix_wait_tokens` N > 0: a request that would reuse at least N more of its prompt once a
        request still prefilling is done (n copies of one prompt sent together) waits for that prefill.
        `scheduling_policy` (SCHEDULING_POLICIES): "priority" admits waiting requests by their priority
        (lower first, then arrival) and lets one preempt a running request of a lower priority when
        every slot is taken (that one prefills what it had again when readmitted, and goes on)."""
        check_batching(max_batch, capacity, prefill_chunk, scheduling_policy)
        core = native_core()
        speculative = llm.has_drafter if speculative is None else speculative
        if speculative and not llm.has_drafter:
            raise DFlashError("speculative=True needs a drafter: pass draft=... or use speculative=False")
        adaptive = (llm.has_drafter and block_size is None) if adaptive is None else adaptive
        if adaptive and not llm.has_drafter:
            raise DFlashError("adaptive=True chooses among speculative block sizes: it needs a drafter")
        if adaptive and getattr(llm, "draft_rule", "point-mass") == "drafter":
            raise DFlashError("draft_rule 'drafter' needs a fixed block size (blocks chosen per step would make a "
                              "seeded request's tokens depend on its batch): pass block_size=")
        self.llm = llm
        self.max_batch, self.capacity, self.speculative = max_batch, capacity, speculative
        self.scheduling_policy = scheduling_policy
        # the largest block a step verifies (the only one unless adaptive); metrics size their histograms by it
        self.block_size = (block_size or llm.max_block_size or llm.block_size) if llm.has_drafter else 1
        self.executor = llm.executor(max_batch, capacity)  # its KV slots are allocated here
        if reserve_memory:
            self.executor.reserve_memory()
        config = core.SchedulerConfig(max_batch=max_batch, capacity=capacity, block_size=self.block_size,
                                      engine_seed=llm.engine_seed() if engine_seed is None else engine_seed,
                                      adaptive=adaptive, max_waiting=max_waiting, prefill_chunk=prefill_chunk,
                                      prefix_reuse=prefix_caching, prefix_wait_tokens=prefix_wait_tokens,
                                      by_priority=scheduling_policy == "priority")
        self.scheduler = core.Scheduler(self.executor, config)
        if adaptive and calibrate and self.block_size > 1:
            calibrate_costs(self.scheduler, self.executor, sorted({1, max_batch}), sorted({1, self.block_size}),
                            [0] * max(1, min(8, capacity // 2)))
            self.forget_cached()  # the calibration's rows are no request's
        self._ids = itertools.count()
        self.live: dict[int, LiveRequest] = {}  # core id -> request, waiting or running in the core
        # the core's running / waiting counts, read after each call into it: stats() may come from another
        # thread while a step runs (without the GIL), and must not read the core then
        self.running = self.waiting = self.preemptions = 0
        self.counters = Counter()
        self.accepted_per_pos = [0] * max(self.block_size - 1, 0)
        self.finished = Counter()

    # -- requests ------------------------------------------------------------------------------

    def prepare(self, prompt, params: SamplingParams | None = None, on_output: Callable | None = None,
                speculative: bool | None = None, priority: int = 0, cache_salt: str | None = None) -> LiveRequest:
        """Check a request (one line for what is wrong, before any work) -> the request, not yet queued.
        `cache_salt` (vLLM's): it reuses KV positions only of requests with the same salt, so one tenant
        cannot time another's prompts through the prefix cache."""
        params = params or self.llm.get_default_sampling_params()
        if params.n != 1:
            raise DFlashError(f"n {params.n}: a request here is one sequence (LLM.generate runs n samples as n "
                              "requests, the OpenAI front n choices)")
        check_priority(priority, self.scheduling_policy)
        if cache_salt is not None and (not isinstance(cache_salt, str) or not cache_salt):
            raise DFlashError(f"cache_salt must be a non-empty string, got {cache_salt!r}")
        speculative = self.speculative if speculative is None else speculative
        self.llm._check_request(params, speculative)
        speculative = speculative and params.num_speculative_tokens != 0
        ids = self.llm.encode(prompt)
        prompt = given(prompt)  # a vLLM prompt dict's text or ids
        if params.truncate_prompt_tokens is not None:
            ids = ids[-params.truncate_prompt_tokens:]
        check_fits(len(ids), params.max_tokens, self.capacity)
        stop = StopChecker(params, self.llm.eos_token_ids, self.llm.text_stream(params.skip_special_tokens))
        metrics = RequestMetrics(block_size=self.block_size if speculative else None, prompt_tokens=len(ids))
        return LiveRequest(next(self._ids), prompt, ids, params, speculative, stop, on_output, metrics,
                        constraint=self.llm.constraint(params, ids), priority=priority, cache_salt=cache_salt or "")

    def submit(self, request: LiveRequest, arrival: float | None = None) -> None:
        """Queue a prepared request; `arrival` (perf_counter) restarts its clock, e.g. for a benchmark
        client that prepared every request first."""
        if arrival is not None:
            request.arrival = arrival
        params = request.params  # stop strings are applied here, on text; the core stops on token ids
        request.submitted = time.perf_counter()
        request.core_id = self.scheduler.add_request(request.ids, native_core().RequestParams(
            max_tokens=params.max_tokens, temperature=params.temperature, top_k=params.top_k, top_p=params.top_p,
            seed=params.seed, stop_token_ids=list(params.stop_token_ids), eos_token_ids=list(self.llm.eos_token_ids),
            ignore_eos=params.ignore_eos, max_block=max_block(request.speculative, params.num_speculative_tokens),
            logprobs=-1 if params.logprobs is None else params.logprobs, repetition_penalty=params.repetition_penalty,
            frequency_penalty=params.frequency_penalty, presence_penalty=params.presence_penalty,
            logit_bias=list(params.logit_bias), min_tokens=params.min_tokens, min_p=params.min_p,
            constraint=request.constraint,
            prompt_logprobs=-1 if params.prompt_logprobs is None else params.prompt_logprobs,
            priority=request.priority, cache_salt=request.cache_salt))  # queued for a slot
        self.live[request.core_id] = request
        self.counters["prompt_tokens_total"] += len(request.ids)
        self._read_counts()

    def add(self, prompt, params: SamplingParams | None = None, on_output: Callable | None = None,
            speculative: bool | None = None, priority: int = 0, cache_salt: str | None = None) -> LiveRequest:
        """prepare + submit -> the request (its tokens, finish reason and the core's counters grow as it runs)."""
        request = self.prepare(prompt, params, on_output, speculative, priority, cache_salt)
        self.submit(request)
        return request

    def abort(self, request_id: int) -> LiveRequest | None:
        """Finish a waiting or running request now -> it (its output says "abort"), or None if not live."""
        for core_id, request in self.live.items():
            if request.id == request_id:
                self.scheduler.abort(core_id)  # its slot is free on return; the core says "abort" next step
                del self.live[core_id]
                self._finish(request, "abort")
                self._read_counts()
                return request
        return None

    def forget_cached(self) -> None:
        """Drop what finished requests' slots keep for prefix caching (a benchmark's warm-up must not
        serve its timed prompts)."""
        self.executor.forget_retained()

    def _read_counts(self) -> None:
        scheduler = self.scheduler
        self.running, self.waiting, self.preemptions = scheduler.num_running, scheduler.num_waiting, scheduler.preemptions

    @property
    def has_work(self) -> bool:
        return bool(self.live or self.scheduler.has_work)

    @property
    def slots(self):
        return self.scheduler.slots

    # -- stepping ------------------------------------------------------------------------------

    def step(self) -> list[LiveRequest]:
        """One core step (it admits waiting requests into free slots first) -> the requests it touched.
        A request the target gave no token (NaN logits) finishes "error" alone. Should the step itself
        fail (the backend raised), every live request finishes "error", what the slots kept for prefix
        reuse is dropped (the failed step may have half-written them), and StepFailed is raised: the
        runner goes on serving new requests."""
        touched = []
        try:
            for out in self.scheduler.step():
                request = self.live.get(out["request"])
                if request is None:  # aborted from here already: the core's "abort" closes its books
                    continue
                self._update(request, out)  # may abort the core request (a stop string)
                touched.append(request)
        except Exception as err:
            raise StepFailed(err, touched + self.fail_live(f"the engine step failed: {type(err).__name__}: {err}")) \
                from err
        self._read_counts()
        if not self.has_work:  # idle: the steps' scratch goes back to the system, not kept for the next burst
            self.executor.release_scratch()
            native_core().release_host_memory()
        return touched

    def fail_live(self, why: str) -> list[LiveRequest]:
        """Finish every live request "error" (`why`), and drop what the slots keep for prefix reuse (the
        failure may have half-written them) -> those requests."""
        failed = []
        for core_id, request in list(self.live.items()):
            self.scheduler.abort(core_id)
            del self.live[core_id]
            self.refuse(request, why)
            failed.append(request)
        self.forget_cached()
        self._read_counts()
        return failed

    def refuse(self, request: LiveRequest, why: str) -> None:
        """Finish a request "error" that the core does not hold (never queued, or taken out of it)."""
        request.error = why
        self._finish(request, "error")

    def _update(self, request: LiveRequest, out: dict) -> None:
        new, finish = out["new_tokens"], out["finish_reason"]
        if finish == "error":
            request.error = out["error"]
        if new:
            now = time.perf_counter()
            if request.first_token is None:
                request.first_token = now
            else:  # vLLM's inter-token latency: one gap per step that gave the request tokens
                request.metrics.token_gaps.append(now - request.last_token)
            request.last_token = now
        stopped = request.stop.add(new) if new else False
        request.metrics.num_preemptions = out["num_preemptions"]
        queued = out["metrics"]["queue_time_s"]  # in the core's queue; before it, the caller's (an Engine's inbox)
        if request.metrics.queue_s is None and queued is not None:  # the core's clock stops at the first step
            request.metrics.queue_s = request.submitted - request.arrival + queued
        if request.metrics.cached_tokens != out["cached_tokens"]:  # known at admission, the same in every output
            request.metrics.cached_tokens = out["cached_tokens"]
            self.counters["prefix_cache_hits_total"] += out["cached_tokens"]
        request.logprobs.extend(dict(entries) for entries in out.get("new_logprobs", ()))
        if request.params.prompt_logprobs is not None and new and request.prompt_logprobs is None:
            # the first output: its prompt is in (a one-token prompt scores nothing, so has no key)
            request.prompt_logprobs = [None, *(dict(entries) for entries in out.get("prompt_logprobs", ()))]
        self._count(request, out["metrics"])
        if finish is not None or stopped:
            if finish is None:  # a stop string the core cannot see: free its slot now (its "abort" is skipped)
                self.scheduler.abort(request.core_id)
            del self.live[request.core_id]
            self._finish(request, finish if finish == "abort" else request.stop.finish_reason or finish)

    def _count(self, request: LiveRequest, core: dict) -> None:
        """Fold the core's cumulative counters into the request's metrics and the engine's totals."""
        before = request.core_metrics or {"num_drafts": 0, "num_draft_tokens": 0, "num_accepted_tokens": 0,
                                          "accepted_per_position": []}
        drafts = core["num_drafts"] - before["num_drafts"]
        draft_tokens = core["num_draft_tokens"] - before["num_draft_tokens"]
        accepted = core["num_accepted_tokens"] - before["num_accepted_tokens"]
        if drafts:  # one verify step of a speculating request
            request.metrics.record(accepted, draft_tokens)
        self.counters["spec_decode_num_drafts"] += drafts
        self.counters["spec_decode_num_draft_tokens"] += draft_tokens
        self.counters["spec_decode_num_accepted_tokens"] += accepted
        old = before["accepted_per_position"]
        for k, count in enumerate(core["accepted_per_position"]):
            if k < len(self.accepted_per_pos):
                self.accepted_per_pos[k] += count - (old[k] if k < len(old) else 0)
        request.core_metrics = dict(core)

    def _finish(self, request: LiveRequest, reason: str) -> None:
        request.finished_at = time.perf_counter()
        request.finish_reason = reason
        self.finished[reason] += 1
        self.counters["generation_tokens_total"] += len(request.stop.token_ids)

    # -- what callers see ----------------------------------------------------------------------

    def output(self, request: LiveRequest) -> RequestOutput:
        """A snapshot of the request's output, with its metrics up to now."""
        request.clock()
        m = request.metrics
        tokens = list(request.stop.token_ids)
        logprobs = None if request.params.logprobs is None else request.logprobs[:len(tokens)]
        return RequestOutput(prompt=request.prompt, prompt_token_ids=list(request.ids), text=request.stop.text,
                             token_ids=tokens, finish_reason=request.finish_reason,
                             stop_reason=request.stop.stop_reason if request.finish_reason == "stop" else None,
                             metrics=replace(m, acceptance_lengths=list(m.acceptance_lengths),
                                             token_gaps=list(m.token_gaps)), logprobs=logprobs,
                             prompt_logprobs=request.prompt_logprobs, error=request.error)

    def core_stats(self) -> dict:
        """The scheduler's books: requests running and waiting, and the adaptive bookkeeping (the block
        each step chose, `last_block`, `steps_per_block`; acceptance estimates; timed phase costs;
        phase seconds)."""
        # bytes the executor moved between host and device memory (its own accounting; None: it keeps none)
        host_bytes = getattr(self.executor, "host_bytes", None)
        return {"num_running": self.scheduler.num_running, "num_waiting": self.scheduler.num_waiting,
                "host_bytes": host_bytes, **self.scheduler.stats()}

    def stats(self) -> dict:
        """What a server exports: running / waiting requests, token and speculation counters."""
        return {
            "running": self.running,
            "waiting": self.waiting,
            "num_preemptions": self.preemptions,
            "max_batch": self.max_batch,
            "capacity": self.capacity,
            # a request holds a whole slot of KV cache (capacity tokens) while it runs
            "kv_cache_usage": self.running / self.max_batch,
            **{name: self.counters[name] for name in (
                "prompt_tokens_total", "prefix_cache_hits_total", "generation_tokens_total", "spec_decode_num_drafts",
                "spec_decode_num_draft_tokens", "spec_decode_num_accepted_tokens")},
            "spec_decode_num_accepted_tokens_per_pos": list(self.accepted_per_pos),
            "requests_finished": dict(self.finished),
        }

    def stream(self, prompt, params: SamplingParams | None = None, speculative: bool | None = None) -> Iterator:
        """One request's output after every step that touched it (stepping every live request);
        closing the iterator early aborts it."""
        request = self.prepare(prompt, params, speculative=speculative)
        self.submit(request)
        try:
            while request.finish_reason is None:
                if any(r is request for r in self.step()):
                    yield self.output(request)
        finally:
            if request.finish_reason is None:
                self.abort(request.id)

    def run(self, prompts: list, params: SamplingParams | list[SamplingParams] | None = None,
            speculative: bool | None = None, priority: list[int] | None = None,
            progress: Callable[[int], object] | None = None) -> list:
        """Every prompt concurrently (up to max_batch at once) -> their outputs, in order; `params` one
        for all or one per prompt, `priority` one per prompt. Every prompt is checked before any work.
        `progress(n)` hears of the n requests each step finished (a progress bar's update)."""
        each = params if isinstance(params, list) else [params] * len(prompts)
        ranks = [0] * len(prompts) if priority is None else priority
        requests = [self.prepare(p, one, speculative=speculative, priority=rank)
                    for p, one, rank in zip(prompts, each, ranks, strict=True)]
        for request in requests:
            self.submit(request)
        done = 0
        while done < len(requests):
            self.step()
            now = sum(r.finish_reason is not None for r in requests)
            if progress is not None and now > done:
                progress(now - done)
            done = now
        return [self.output(r) for r in requests]

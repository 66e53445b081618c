"""Many requests from any thread: a BatchRunner (runtime/batch_runner.py) stepping on a background thread.

What `serve` uses: requests and aborts come from any thread and take effect between two steps; the
core is only ever touched by the engine's own thread.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import AsyncIterator, Callable, Iterator

from dflash_trt.errors import Busy
from dflash_trt.runtime.batch_runner import DEFAULT_CAPACITY, DEFAULT_MAX_BATCH, BatchRunner, StepFailed, LiveRequest
from dflash_trt.spec.sampling import SamplingParams

logger = logging.getLogger(__name__)

# An Engine whose steps failed this many times in a row takes no more requests: its backend is broken
# (a sticky CUDA error fails every step after it), and a server should be restarted, not answer 500s
DOWN_AFTER_FAILED_STEPS = 3


class Engine:
    """A BatchRunner stepping on a background thread; add_request / abort from any thread.

    Requests and aborts are handed to the engine thread and take effect between two steps, so the
    core is only ever touched by that thread. `on_output` callbacks run on the engine thread after
    every step that touched the request: keep them short (hand the output to a queue)."""

    def __init__(self, llm, max_batch: int = DEFAULT_MAX_BATCH, capacity: int = DEFAULT_CAPACITY,
                 speculative: bool | None = None, block_size: int | None = None, engine_seed: int | None = None,
                 prefill_chunk: int = 0, max_waiting: int = -1, reserve_memory: bool = False,
                 prefix_caching: bool = True, scheduling_policy: str = "fcfs"):
        """`max_waiting` caps the requests waiting for a slot (-1: no cap); one more is refused with
        `Busy` (status 429) on the caller's thread. `reserve_memory`, `prefix_caching`,
        `scheduling_policy`: as BatchRunner's."""
        self.llm = llm
        self.runner = BatchRunner(llm, max_batch, capacity, speculative, block_size, engine_seed, prefill_chunk,
                                  reserve_memory=reserve_memory, prefix_caching=prefix_caching,
                                  scheduling_policy=scheduling_policy)
        self.max_batch, self.capacity, self.max_waiting = max_batch, capacity, max_waiting
        self._cv = threading.Condition()
        self._inbox: list[tuple[str, object]] = []
        self._live: set[int] = set()
        self._closing = False
        self.error: BaseException | None = None  # the last step failure (its requests finished "error")
        self.failed_steps = 0  # in a row, up to now
        self.down: str | None = None  # why it takes no more requests (DOWN_AFTER_FAILED_STEPS failed steps)
        self._thread = threading.Thread(target=self._loop, name="dflash-engine", daemon=True)
        self._thread.start()

    def add_request(self, prompt, params: SamplingParams | None = None, on_output: Callable | None = None,
                    speculative: bool | None = None, priority: int = 0, cache_salt: str | None = None) -> int:
        # refusals: here, on the caller's thread
        request = self.runner.prepare(prompt, params, on_output, speculative, priority, cache_salt)
        with self._cv:
            if self._closing:
                raise Busy("the engine is shutting down and takes no new requests", 503)
            self.check_up()
            # every live request beyond the slots waits for one (those in the inbox too)
            if self.max_waiting >= 0 and len(self._live) + 1 - self.max_batch > self.max_waiting:
                raise Busy(f"all {self.max_batch} slots are taken and {self.max_waiting} requests already wait; "
                           f"retry shortly", 429)
            self._inbox.append(("add", request))
            self._live.add(request.id)
            self._cv.notify()
        return request.id

    def check_up(self) -> None:
        """Busy (503) once the engine is down (its steps kept failing): it takes no more requests."""
        if self.down:
            raise Busy(f"the engine is down: {self.down}", 503)

    def abort(self, request_id: int) -> bool:
        """Finish the request before the next step (its slot is freed then); False if it is not live."""
        with self._cv:
            if request_id not in self._live:
                return False
            self._inbox.append(("abort", request_id))
            self._cv.notify()
        return True

    def reset_prefix_cache(self) -> None:
        """Drop what finished requests' slots keep for prefix caching, between two steps (running requests
        keep their positions: a new request may still start on them). Returns once done."""
        done = threading.Event()
        with self._cv:
            if self._closing:
                raise Busy("the engine is shutting down", 503)
            self._inbox.append(("forget", done))
            self._cv.notify()
        done.wait()

    def generate(self, prompts: list, params: SamplingParams | None = None, speculative: bool | None = None,
                 cancelled: Callable[[], bool] | None = None, cache_salt: str | None = None) -> list:
        """Every prompt at once -> their last outputs, in order, on the caller's thread (which waits).
        `cancelled` is asked first and while waiting: once it says True, None is returned. Requests not
        finished then, or when an exception ends the wait, are aborted."""
        if cancelled is not None and cancelled():  # asked first too: a short step may never wait 50 ms
            return None
        finished: queue.Queue = queue.Queue()
        ids = []
        try:
            for i, prompt in enumerate(prompts):
                ids.append(self.add_request(
                    prompt, params, lambda out, i=i: out.finish_reason is not None and finished.put((i, out)),
                    speculative, cache_salt=cache_salt))
            outputs = [None] * len(prompts)
            for _ in prompts:
                while True:
                    try:
                        i, outputs[i] = finished.get(timeout=0.05)
                        break
                    except queue.Empty:
                        if cancelled is not None and cancelled():
                            return None
            ids = []
            return outputs
        finally:
            for request_id in ids:  # not finished: cancelled, or an exception on the way
                self.abort(request_id)

    def stream(self, prompt, params: SamplingParams | None = None, speculative: bool | None = None,
               priority: int = 0, cache_salt: str | None = None) -> Iterator:
        """Outputs after every step until the last; closing the iterator early aborts the request."""
        outputs: queue.Queue = queue.Queue()
        request_id = self.add_request(prompt, params, outputs.put, speculative, priority, cache_salt)
        finished = False
        try:
            while not finished:
                out = outputs.get()
                finished = out.finish_reason is not None
                yield out
        finally:
            if not finished:
                self.abort(request_id)

    async def astream(self, prompt, params: SamplingParams | None = None, speculative: bool | None = None,
                      priority: int = 0, cache_salt: str | None = None) -> AsyncIterator:
        """asyncio form of `stream`; cancelling the consumer aborts the request."""
        loop = asyncio.get_running_loop()
        outputs: asyncio.Queue = asyncio.Queue()
        def put(out) -> None:
            if not loop.is_closed():  # an abort's last output may come after the consumer's loop ended
                loop.call_soon_threadsafe(outputs.put_nowait, out)

        request_id = self.add_request(prompt, params, put, speculative, priority, cache_salt)
        finished = False
        try:
            while not finished:
                out = await outputs.get()
                finished = out.finish_reason is not None
                yield out
        finally:
            if not finished:
                self.abort(request_id)

    def stats(self) -> dict:
        with self._cv:
            return self.runner.stats()

    def shutdown(self, drain: bool = True, timeout: float | None = None) -> None:
        """Take no new requests; finish (drain) or abort the live ones; stop the thread."""
        with self._cv:
            self._closing = True
            if not drain:
                self._inbox.extend(("abort", rid) for rid in sorted(self._live))
            self._cv.notify()
        self._thread.join(timeout)

    # -- the engine thread ---------------------------------------------------------------------

    def _loop(self) -> None:
        try:
            self._serve()
        except BaseException as err:  # a bug of ours: down, and nobody left waiting for an answer
            logger.exception("the engine thread failed; its requests finish \"error\"")
            why = f"the engine thread failed: {type(err).__name__}: {err}"
            with self._cv:
                self.down = why
                waiting = [item for kind, item in self._inbox if kind == "add"]
                self._inbox = []
            for request in waiting:
                self.runner.refuse(request, why)
            self._deliver(waiting)  # first: the core may be what broke
            self._deliver(self.runner.fail_live(why))  # (what raises here is logged by the thread)

    def _serve(self) -> None:
        while True:
            with self._cv:
                while not self._inbox and not self.runner.has_work and not self._closing:
                    self._cv.wait()
                if self._closing and not self._inbox and not self.runner.has_work:
                    return
                commands, self._inbox = self._inbox, []
                touched = []
                for kind, item in commands:
                    if kind == "add":
                        try:
                            self.runner.submit(item)
                        except Exception as err:  # the core refused what prepare let through: it alone fails
                            self.runner.refuse(item, f"the core refused it: {type(err).__name__}: {err}")
                            touched.append(item)
                    elif kind == "forget":
                        try:
                            self.runner.forget_cached()
                        finally:  # the caller waits for it
                            item.set()
                    elif (request := self.runner.abort(item)) is not None:
                        touched.append(request)
            try:
                if self.runner.has_work:
                    ran = bool(self.runner.live)  # else the step only closes aborted requests' books
                    touched += self.runner.step()
                    if ran:
                        self.failed_steps = 0
            except StepFailed as failed:  # what ran finished "error"; the engine serves on, unless it is down
                logger.error("an engine step failed; its %d requests finished \"error\": %s",
                             len(failed.requests), failed.__cause__)
                self.error = failed.__cause__
                self.failed_steps += 1
                if self.failed_steps >= DOWN_AFTER_FAILED_STEPS:
                    with self._cv:
                        cause = failed.__cause__
                        self.down = f"{self.failed_steps} steps failed in a row, the last: {type(cause).__name__}: {cause}"
                touched += failed.requests
            self._deliver(touched)

    def _deliver(self, touched: list[LiveRequest]) -> None:
        for request in touched:
            if request.finish_reason is not None:
                with self._cv:
                    self._live.discard(request.id)
            if request.on_output is None:
                continue
            out = self.runner.output(request)
            try:
                request.on_output(out)
            except Exception:  # the caller's callback broke: its request ends, the engine goes on
                logger.exception("on_output of request %d raised; aborting the request", request.id)
                if request.finish_reason is None:
                    self.abort(request.id)

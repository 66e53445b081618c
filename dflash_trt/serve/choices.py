"""A request's n choices, each a Triton stream of its own, read side by side.

Each stream is read by a task of its own (a pump), which hands its pieces to one queue in arrival
order. Closing cancels each pump once and lets it close its stream (and so its Triton request) by
itself: the callers run inside anyio cancel scopes (sse-starlette's, on a client's disconnect), which
cancel every await again, and a pump cancelled a second time mid-close left its connection open, so
Triton never cancelled the request.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from dflash_trt.serve.triton_client import Piece


_CLOSING: set[asyncio.Task] = set()


class Choices:
    """`beams` None: stream i is choice i, piece after piece; an int n: stream i is a beam search whose
    finished pieces are whole choices (its k-th is choice i * n + k; the empty ones before them are the
    search's signs of life)."""

    def __init__(self, streams: list[AsyncIterator[Piece]], beams: int | None = None):
        self.count = len(streams) * (beams or 1)
        self._beams = beams
        self._queue: asyncio.Queue = asyncio.Queue()
        self._pumps = [asyncio.ensure_future(self._pump(i, stream)) for i, stream in enumerate(streams)]
        self._finished = 0

    async def _pump(self, index: int, stream: AsyncIterator[Piece]) -> None:
        choice = index * (self._beams or 1)
        try:
            async for piece in stream:
                if self._beams is not None and piece.finish_reason is None:
                    continue  # a beam search's sign of life: no choice of its own
                self._queue.put_nowait((choice, piece, None))
                choice += self._beams is not None
        except Exception as err:  # a refusal or Triton's failure: the reader raises it
            self._queue.put_nowait((choice, None, err))
        finally:
            await stream.aclose()

    @property
    def done(self) -> bool:
        """Every choice has had its last piece (the one with a finish reason)."""
        return self._finished == self.count

    async def next(self) -> tuple[int, Piece]:
        """The next piece of any choice, with the choice's index; a choice's error is raised here."""
        choice, piece, err = await self._queue.get()
        if err is not None:
            raise err
        self._finished += piece.finish_reason is not None
        return choice, piece

    async def first_pieces(self) -> list[tuple[int, Piece]]:
        """What came until every choice has sent a piece (so that a refusal, which comes first, is
        raised before a reply begins, every choice closed)."""
        seen, pieces = set(), []
        try:
            while len(seen) < self.count:
                choice, piece = await self.next()
                seen.add(choice)
                pieces.append((choice, piece))
        except BaseException:
            await self.close()
            raise
        return pieces

    async def close(self) -> None:
        """Stop every pump (closing a Triton stream cancels its request); if this await is cancelled,
        the pumps still finish closing (asyncio.wait, unlike gather, leaves them be)."""
        for pump in self._pumps:
            pump.cancel()
            _CLOSING.add(pump)  # a task the loop alone holds may be collected mid-close
            pump.add_done_callback(_CLOSING.discard)
        await asyncio.wait(self._pumps)

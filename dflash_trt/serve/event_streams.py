"""A chat stream's chunks re-written as another stream's Server-Sent Events."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterable


async def translated(chunks: AsyncIterator[dict | str], first: Iterable[dict],
                     feed: Callable[[dict | str], Iterable[dict]]) -> AsyncIterator[dict]:
    """`first`, then `feed(chunk)`'s events for each chunk; the chunks are closed when the client leaves
    (which cancels their Triton requests)."""
    try:
        for event in first:
            yield event
        async for chunk in chunks:
            for event in feed(chunk):
                yield event
    finally:
        await chunks.aclose()

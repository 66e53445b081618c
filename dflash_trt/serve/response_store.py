"""The Responses API's stored responses: what `previous_response_id` continues and GET /v1/responses/{id}
returns. Held in the front's memory, the most recently used kept up to a count (`serve
--responses-store N`); a restart forgets them, as vLLM's in-memory store does."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass


FINAL = ("completed", "incomplete", "failed", "cancelled")  # a response's statuses once it has ended


@dataclass(frozen=True)
class StoredResponse:
    body: dict  # the Response object as it was returned, or a background one as it now stands
    items: list[dict]  # the conversation it ends: earlier responses' items, its input, then its output
    inputs: list[dict]  # its request's input items, each with an id (GET .../input_items)
    cancel: Callable[[], Awaitable[None]] | None = None  # a running background response's: stop it, wait

    @property
    def ended(self) -> bool:
        return self.body["status"] in FINAL


class ResponseStore:
    """Least recently used responses beyond `capacity` are forgotten (0: none is kept)."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self._kept: OrderedDict[str, StoredResponse] = OrderedDict()

    def put(self, response_id: str, stored: StoredResponse) -> None:
        if self.capacity <= 0:
            return
        self._kept[response_id] = stored
        self._kept.move_to_end(response_id)
        while len(self._kept) > self.capacity:
            self._kept.popitem(last=False)

    def get(self, response_id: str) -> StoredResponse | None:
        stored = self._kept.get(response_id)
        if stored is not None:
            self._kept.move_to_end(response_id)
        return stored

    def delete(self, response_id: str) -> bool:
        return self._kept.pop(response_id, None) is not None

"""The client's request ids (vLLM's --enable-request-id-headers) and the request log (its
--enable-log-requests): what lets a client find its request in the server's log."""

from __future__ import annotations

import json
import uuid


class RequestIdHeader:
    """ASGI middleware: every reply carries X-Request-Id, the request's own or a new one (vLLM's
    --enable-request-id-headers), so a client can find its request in the server's log. A new one is
    handed to the route as if the client had sent it: a chat's or completion's id carries it too."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        given = next((v for k, v in scope["headers"] if k.lower() == b"x-request-id"), None)
        request_id = given or uuid.uuid4().hex.encode()
        if given is None:
            scope = {**scope, "headers": [*scope["headers"], (b"x-request-id", request_id)]}

        async def tagged(message):
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), (b"x-request-id", request_id)]}
            await send(message)

        await self.app(scope, receive, tagged)


def received(request_id: str, parsed, most: int | None) -> str:
    """vLLM's "Received request" line of a chat or completion request (protocol.py's): the id, the fields
    sent, the prompt (cut to `most` characters)."""
    prompt = next(iter(parsed.model_dump(include={"messages", "prompt"}).values()))
    text = prompt if isinstance(prompt, str) else json.dumps(prompt, ensure_ascii=False)
    if most is not None:
        text = text[:most]
    sent = parsed.model_dump(exclude_none=True, exclude={"messages", "prompt", "model", "tools"})
    return f"Received request {request_id}: prompt: {text!r}, params: {json.dumps(sent, default=str)}"

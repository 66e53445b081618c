"""The front's side of Triton: POST generate_stream over HTTP, read its Server-Sent Events.

HTTP rather than gRPC: Triton 2.51 cancels a request when its HTTP connection closes (noticed at the
next chunk it writes), so closing the stream here is how a client's disconnect reaches the engine;
2.51's gRPC cancel path has a known crash (server issue #7368, research/trt.md §9).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass

import httpx
from httpx_sse import aconnect_sse

from dflash_trt.serve.config import TRITON_MODEL
from dflash_trt.serve.requests import RequestError


class UpstreamError(Exception):
    """Triton failed in a way that is not the client's fault (503 to the client)."""


@dataclass(frozen=True)
class Piece:
    text: str
    token_ids: list[int]
    finish_reason: str | None
    usage: dict | None
    logprobs: list | None = None  # per token [text, logprob, [[text, logprob] of the top ones]], when asked
    # the first piece's, when asked: the prompt's text (echo), and per prompt token [id, text, logprob,
    # [[id, text, logprob] of the top ones]] (the first's logprob and top null)
    prompt_text: str = ""
    prompt_logprobs: list | None = None
    prompt_token_ids: list[int] = ()  # the first piece's, when asked (return_token_ids)


def _error(message: str) -> Exception:
    return RequestError.from_json(message) or UpstreamError(message)


def _refusal(body: str) -> Exception:
    try:
        data = json.loads(body.strip().removeprefix("data:"))
    except ValueError:
        return UpstreamError(body)
    return _error(data["error"]) if isinstance(data, dict) and "error" in data else UpstreamError(body)


def _ids(value) -> list[int]:
    """An INT64 [-1] output as Triton's JSON gives it: a list, or a lone number for one element."""
    return value if isinstance(value, list) else [value]


def _piece(data: dict) -> Piece:
    return Piece(text=data.get("text_output", ""), token_ids=_ids(data.get("token_ids", [])),
                 finish_reason=data.get("finish_reason") or None,
                 usage=json.loads(data["usage"]) if data.get("usage") else None,
                 logprobs=json.loads(data["logprobs"]) if data.get("logprobs") else None,
                 prompt_text=data.get("prompt_text", ""), prompt_token_ids=_ids(data.get("prompt_token_ids", [])),
                 prompt_logprobs=json.loads(data["prompt_logprobs"]) if data.get("prompt_logprobs") else None)


class TritonClient:
    def __init__(self, url: str, metrics_url: str):
        self.url, self.metrics_url = url, metrics_url
        # no read timeout: a long generation streams for as long as it takes
        self.http = httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(None, connect=10),
                                      limits=httpx.Limits(max_connections=None, max_keepalive_connections=64))

    async def generate(self, inputs: dict) -> AsyncIterator[Piece]:
        """The request's pieces as they come, to the stream's end (Triton ends it after the model's FINAL
        response: the one with a finish reason, or a beam search's last); leaving the loop early closes
        the connection (cancels it)."""
        finished = False
        try:
            async with aconnect_sse(self.http, "POST", f"/v2/models/{TRITON_MODEL}/generate_stream",
                                    json={**inputs, "stream": True}) as events:
                response = events.response
                if response.status_code != 200:  # a refusal before the first event (JSON, or one SSE event)
                    raise _refusal((await response.aread()).decode(errors="replace"))
                async for event in events.aiter_sse():
                    data = event.json()
                    if "error" in data:  # errors after the first event arrive under HTTP 200
                        raise _error(data["error"])
                    piece = _piece(data)
                    finished = piece.finish_reason is not None
                    yield piece
        except httpx.HTTPError as err:
            raise UpstreamError(f"Triton is unreachable: {err}") from None
        if not finished:
            raise UpstreamError("Triton ended the stream without a final response")

    async def ready(self) -> bool:
        try:
            response = await self.http.get(f"/v2/models/{TRITON_MODEL}/ready", timeout=5)
        except httpx.HTTPError:
            return False
        return response.status_code == 200

    async def metrics(self) -> str:
        response = await self.http.get(self.metrics_url, timeout=10)
        response.raise_for_status()
        return response.text

    async def close(self) -> None:
        await self.http.aclose()

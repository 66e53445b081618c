"""The OpenAI-compatible front (FastAPI): /v1/chat/completions, /v1/completions, /v1/models,
/health and /metrics, each request forwarded to Triton's generate_stream.

Every refusal is an OpenAI-style error object with a 4xx status naming the field; a client that goes
away mid-request closes its Triton stream, which cancels the request in the engine.
"""

from __future__ import annotations

import asyncio
import hmac
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException

from dflash_trt.serve import protocol
from dflash_trt.serve.requests import RequestError
from dflash_trt.serve.responses import Reply, error_body, sse
from dflash_trt.serve.triton_client import Piece, TritonClient, UpstreamError

DISCONNECT_POLL_S = 0.1


@dataclass(frozen=True)
class FrontSettings:
    model: str  # the id /v1/models lists
    api_key: str | None = None
    max_body_bytes: int = 1 << 20


def _error(status: int, message: str, param: str | None = None, code: str | None = None) -> JSONResponse:
    return JSONResponse(error_body(status, message, param, code), status_code=status)


def create_app(settings: FrontSettings, triton: TritonClient) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app):
        yield
        await triton.close()  # open keep-alive connections would hold Triton's shutdown for its whole timeout

    app = FastAPI(title="dflash-trt", docs_url=None, redoc_url=None, lifespan=lifespan)

    @app.exception_handler(RequestError)
    async def refused(request, err: RequestError):
        response = _error(err.status, err.message, err.param)
        if err.status == 429:  # the waiting queue is full: a slot frees within a few steps
            response.headers["Retry-After"] = "1"
        return response

    @app.exception_handler(UpstreamError)
    async def upstream(request, err: UpstreamError):
        return _error(503, f"the inference server failed: {err}", code="upstream_error")

    @app.exception_handler(HTTPException)
    async def http_error(request, err: HTTPException):  # unknown paths (404), wrong methods (405)
        return _error(err.status_code, str(err.detail))

    @app.exception_handler(Exception)
    async def bug(request, err: Exception):  # a bug of ours: still an error object, and the server lives on
        return _error(500, f"internal error: {type(err).__name__}: {err}", code="internal_error")

    def authorize(request: Request) -> None:
        if settings.api_key is None:
            return
        header = request.headers.get("authorization", "")
        if not hmac.compare_digest(header.encode(), f"Bearer {settings.api_key}".encode()):
            raise RequestError(None, "invalid or missing API key (Authorization: Bearer KEY)", 401)

    async def body(request: Request) -> bytes:
        """The body, refused with 413 past the limit before it is all read."""
        declared = request.headers.get("content-length")
        if declared and declared.isdigit() and int(declared) > settings.max_body_bytes:
            raise RequestError(None, f"the request body is over {settings.max_body_bytes} bytes", 413)
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > settings.max_body_bytes:
                raise RequestError(None, f"the request body is over {settings.max_body_bytes} bytes", 413)
            chunks.append(chunk)
        return b"".join(chunks)

    @app.get("/health")
    async def health():
        if await triton.ready():
            return Response(status_code=200)
        return _error(503, "the model is not ready", code="not_ready")

    @app.get("/metrics")
    async def metrics():
        try:
            text = await triton.metrics()
        except Exception as err:  # the metrics port is down: say so, never a 500
            return _error(503, f"metrics are unavailable: {err}", code="upstream_error")
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.get("/v1/models")
    async def models(request: Request):
        authorize(request)
        card = {"id": settings.model, "object": "model", "created": 0, "owned_by": "dflash-trt"}
        return {"object": "list", "data": [card]}

    async def complete(request: Request, kind: type[protocol._Sampling]):
        authorize(request)
        parsed = protocol.parse(await body(request), kind)
        if parsed.model != settings.model:
            return _error(404, f"model '{parsed.model}' does not exist; this server serves '{settings.model}'",
                          "model", "model_not_found")
        inputs = parsed.triton_inputs()
        reply = Reply(chat=kind is protocol.ChatRequest, model=settings.model, with_meta_info=parsed.return_meta_info)
        pieces = _renamed(triton.generate(inputs), "messages" if reply.chat else "prompt")
        if not parsed.stream:
            return await _whole(request, reply, pieces)
        first = await anext(pieces)  # refusals (prompt too long, ...) come first: a 4xx, not a broken stream
        return StreamingResponse(_events(reply, first, pieces, parsed.include_usage), media_type="text/event-stream")

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        return await complete(request, protocol.ChatRequest)

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await complete(request, protocol.CompletionRequest)

    return app


async def _renamed(pieces: AsyncIterator[Piece], prompt_field: str) -> AsyncIterator[Piece]:
    """The Triton model names the prompt 'prompt'; a chat client sent 'messages'."""
    try:
        async for piece in pieces:
            yield piece
    except RequestError as err:
        if err.param == "prompt":
            raise RequestError(prompt_field, err.message.replace("prompt", prompt_field, 1), err.status) from None
        raise
    finally:
        await pieces.aclose()


async def _whole(request: Request, reply: Reply, pieces: AsyncIterator[Piece]) -> Response:
    """Collect the reply; if the client leaves first, stop (closing the Triton stream cancels it)."""

    async def collect():
        text, last = [], None
        async for piece in pieces:
            text.append(piece.text)
            last = piece
        return "".join(text), last

    task = asyncio.ensure_future(collect())
    while not task.done():
        await asyncio.wait({task}, timeout=DISCONNECT_POLL_S)
        if not task.done() and await request.is_disconnected():
            task.cancel()
            return Response(status_code=499)  # nobody reads it
    text, last = task.result()
    return JSONResponse(reply.whole(text, last.finish_reason, last.usage))


async def _events(reply: Reply, first: Piece, pieces: AsyncIterator[Piece], include_usage: bool):
    """SSE: the role, content deltas, the finish reason, usage if asked, [DONE]. Starlette cancels
    this generator when the client disconnects; `pieces` is then closed, and Triton cancels."""
    try:
        if reply.chat:
            yield sse(reply.chunk(None, role=True))
        piece = first
        while True:
            if piece.text:
                yield sse(reply.chunk(piece.text))
            if piece.finish_reason is not None:
                yield sse(reply.chunk(None, piece.finish_reason))
                if include_usage:
                    yield sse(reply.usage_chunk(piece.usage))
                break
            piece = await anext(pieces)
        yield sse("[DONE]")
    except (RequestError, UpstreamError) as err:  # mid-stream: the status line has gone already
        status = err.status if isinstance(err, RequestError) else 503
        yield sse(error_body(status, str(err), getattr(err, "param", None)))
    finally:
        await pieces.aclose()

"""The Responses API's routes over the front's ResponseStore: create (whole, streamed, or in the
background), retrieve, list a response's input items, cancel a background one, delete. A request runs
as the chat it converts to (responses_api.py), through the front's `complete`."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Annotated, Literal

from fastapi import FastAPI, Query, Request
from fastapi.responses import JSONResponse

from dflash_trt.serve import protocol
from dflash_trt.serve.openapi_docs import ERRORS, replies
from dflash_trt.serve.requests import RequestError
from dflash_trt.serve.response_store import ResponseStore, StoredResponse
from dflash_trt.serve.responses_api import RENAMED, ResponseRender, ResponsesRequest
from dflash_trt.serve.responses_models import DeletedResponse, InputItemList, ResponseObject, StreamEvent
from dflash_trt.serve.triton_client import UpstreamError


def add_responses_routes(app: FastAPI, model: str, capacity: int, complete: Callable[..., Awaitable],
                         unknown: Callable[[str], JSONResponse], background: set[asyncio.Task]) -> None:
    """The routes on `app`: `model` the served id, `capacity` the responses kept (0: none), `complete` the
    front's run of a chat request (with the render that writes its reply), `unknown` its answer to another
    model, `background` where background runs are held (the front cancels them at shutdown)."""
    stored = ResponseStore(capacity)

    def kept(response_id: str, param: str | None = None) -> StoredResponse:
        response = stored.get(response_id)
        if response is None:
            raise RequestError(param, f"no stored response with id '{response_id}' (never stored, deleted, or "
                                      f"forgotten: this server keeps its last {stored.capacity})", 404)
        return response

    async def in_background(parsed: protocol.ChatRequest, render: ResponseRender) -> JSONResponse:
        """Start a background response -> it, queued. Its run is `complete` for a client that leaves once
        cancelled; its end (completed, incomplete, failed, cancelled) is stored."""
        parsed.check_sampling()  # refusals before it is queued
        if parsed.model != model:
            return unknown(parsed.model)
        stop = asyncio.Event()

        class Detached:
            headers: dict = {}  # no X-Request-Id: the run is no HTTP request's

            @staticmethod
            async def is_disconnected() -> bool:
                return stop.is_set()

        async def run() -> None:
            render.running(cancel)
            try:
                reply = await complete(Detached(), parsed, render)
            except RequestError as err:  # a refusal, or the engine's failure (500: NaN logits, a failed step)
                code = {429: "rate_limit_exceeded"}.get(err.status, "server_error" if err.status >= 500 else
                                                        "invalid_request")
                render.failed(code, err.message)
            except UpstreamError as err:
                render.failed("server_error", f"the inference server failed: {err}")
            except Exception as err:  # a bug of ours: the response says so rather than stay in progress for good
                render.failed("server_error", f"internal error: {type(err).__name__}: {err}")
                raise
            else:
                if reply.status_code == 499:  # cancelled before its reply was whole
                    render.cancelled()

        async def cancel() -> None:
            stop.set()
            await asyncio.wait({task})

        task = asyncio.ensure_future(run())
        background.add(task)
        task.add_done_callback(background.discard)
        return JSONResponse(render.queued(cancel))

    @app.post("/v1/responses", response_model=None, responses=replies(ResponseObject, StreamEvent))
    async def responses(request: Request, body: ResponsesRequest):
        """OpenAI's Responses API, run as a chat; kept unless `store` is false; `background`: run after the
        reply, which is the response queued."""
        if (body.store or body.background) and stored.capacity == 0:
            raise RequestError("background" if body.background else "store", "this server stores no responses "
                               "(serve --responses-store 0): send store false, without background")
        earlier = []
        if body.previous_response_id is not None:
            previous = kept(body.previous_response_id, "previous_response_id")
            if not previous.ended:
                raise RequestError("previous_response_id", f"response '{body.previous_response_id}' is still "
                                                           f"{previous.body['status']}: wait for its end")
            earlier = previous.items
        try:
            parsed, render = body.chat_request(earlier), ResponseRender(body, model, stored, earlier)
            if body.background:
                return await in_background(parsed, render)
            return await complete(request, parsed, render)
        except RequestError as err:
            raise protocol.renamed(err, RENAMED) from None

    @app.post("/v1/responses/{response_id}/cancel", response_model=ResponseObject, responses=ERRORS)
    async def cancel_response(response_id: str):
        """OpenAI's: stop a background response (stored cancelled); one that has ended comes back as it is."""
        response = kept(response_id)
        if not response.body["background"]:
            raise RequestError(None, f"response '{response_id}' did not run in the background: only such a "
                                     "response can be cancelled")
        if response.cancel is not None and not response.ended:
            await response.cancel()
        return JSONResponse(kept(response_id).body)

    @app.get("/v1/responses/{response_id}", response_model=ResponseObject, responses=ERRORS)
    async def retrieve_response(response_id: str):
        """OpenAI's retrieve: a stored response as it was returned."""
        return JSONResponse(kept(response_id).body)

    @app.get("/v1/responses/{response_id}/input_items", response_model=InputItemList, responses=ERRORS)
    async def response_input_items(response_id: str, limit: Annotated[int, Query(ge=1, le=100)] = 20,
                                   order: Literal["asc", "desc"] = "desc", after: str | None = None):
        """OpenAI's: a stored response's input items, newest first (`order` desc) or oldest, `limit` a page,
        from after the item `after` names."""
        items = kept(response_id).inputs[::-1 if order == "desc" else 1]
        if after is not None:
            at = [i for i, item in enumerate(items) if item["id"] == after]
            if not at:
                raise RequestError("after", f"response '{response_id}' has no input item '{after}'")
            items = items[at[0] + 1:]
        page = items[:limit]
        return InputItemList(object="list", data=page, first_id=page[0]["id"] if page else None,
                             last_id=page[-1]["id"] if page else None, has_more=len(items) > limit)

    @app.delete("/v1/responses/{response_id}", response_model=DeletedResponse, responses=ERRORS)
    async def delete_response(response_id: str):
        """Forget a stored response (a later previous_response_id naming it is a 404)."""
        response = kept(response_id)
        if response.cancel is not None and not response.ended:  # a background run: stopped first
            await response.cancel()
        stored.delete(response_id)
        return DeletedResponse(id=response_id, object="response.deleted", deleted=True)

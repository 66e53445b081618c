"""The OpenAI-compatible front (FastAPI): /v1/chat/completions, /v1/completions, /v1/responses (run as
a chat: responses_routes.py), Anthropic's /v1/messages (messages_api.py), vLLM's /tokenize, /detokenize
and /reset_prefix_cache, /v1/models, /health (and /ping), /version and /metrics, each request forwarded
to Triton's generate_stream.

Typed end to end: request bodies are protocol.py's models (FastAPI validates them; one handler turns
any validation error into OpenAI's error object naming the field), replies are openai_models.py's,
and /openapi.json (and /docs, unless turned off) carries both. Streams are Server-Sent Events by
sse-starlette. Every refusal is an OpenAI-style error object with a 4xx status naming the field:
401 without the key (checked before the body is read, in constant time), 413 past the body limit
(before it is all read), 429 with Retry-After when the waiting queue is full, 503 while the model is
not ready or drains. A client that goes away mid-request closes its Triton stream, which cancels the
request in the engine.
"""

from __future__ import annotations

import asyncio
import hmac
import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass

from fastapi import FastAPI, HTTPException, Request
from fastapi.middleware.cors import CORSMiddleware
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from sse_starlette import EventSourceResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match, Route

from dflash_trt import __version__
from dflash_trt.serve import generate_api, messages_api, protocol
from dflash_trt.serve.choices import Choices
from dflash_trt.serve.event_streams import translated
from dflash_trt.serve.openai_models import (
    ChatCompletion,
    ChatCompletionChunk,
    Completion,
    Health,
    ModelCard,
    ModelList,
    Version,
)
from dflash_trt.serve.reply_text import UNTHINK, ReplyText
from dflash_trt.serve.request_ids import RequestIdHeader, received
from dflash_trt.serve.requests import RequestError
from dflash_trt.serve.responses import Outcome, Reply, error_body, merged_usage
from dflash_trt.serve.openapi_docs import ERRORS, replies
from dflash_trt.serve.responses_api import ResponseRender
from dflash_trt.serve.responses_routes import add_responses_routes
from dflash_trt.serve.stats_log import STATS_INTERVAL_S, log_stats
from dflash_trt.serve.tokenize_api import (
    DetokenizeRequest,
    DetokenizeResponse,
    TokenizePrompt,
    TokenizeRequest,
    TokenizeResponse,
)
from dflash_trt.serve.triton_client import Piece, TritonClient, UpstreamError

DISCONNECT_POLL_S = 0.1
# the paths the API key and the body limit hold
GUARDED = ("/v1/", "/generate", "/tokenize", "/detokenize", "/reset_prefix_cache", "/flush_cache")


@dataclass(frozen=True)
class FrontSettings:
    model: str  # the id /v1/models lists
    api_key: str | None = None
    max_body_bytes: int = 1 << 20
    docs: bool = True  # /docs (Swagger UI); /openapi.json is always served
    drain_s: float = 60  # on shutdown, how long an in-flight stream may go on to its end
    tool_parser: str | None = None  # the format of the model's tool calls (tool_calls.PARSERS); None: tools refused
    # with a reasoning parser: (chat_template_kwargs, a request's own template or None) -> whether the
    # prompt leaves a think block open (reply_text.py); None: replies are all content
    thinking: Callable[[dict, str | None], bool] | None = None
    # a token id's text, decoded alone by the model's tokenizer (SGLang's return_text_in_logprobs); None:
    # the model has no tokenizer
    token_text: Callable[[int], str] | None = None
    trust_request_chat_template: bool = False  # vLLM's flag: a request's chat_template renders its prompt
    responses_store: int = 256  # Responses API responses kept for previous_response_id (the most recent; 0: none)
    # CORS (vLLM's --allowed-origins, ...): the origins whose browser pages may call the API; none: no
    # CORS headers (a page of another origin cannot read a reply), so that a server on a user's machine
    # is not open to every site its browser visits (vLLM allows any origin by default)
    allowed_origins: tuple[str, ...] = ()
    allow_credentials: bool = False
    allowed_methods: tuple[str, ...] = ("*",)
    allowed_headers: tuple[str, ...] = ("*",)
    # vLLM's periodic stats lines (stats_log.py), said through this every stats_interval_s; None: none
    stats_log: Callable[[str], None] | None = None
    stats_interval_s: float = STATS_INTERVAL_S
    # vLLM's --enable-log-requests: each chat and completion said on arrival (its id, sampling and prompt,
    # the prompt cut to max_log_len characters; None: whole); None: not logged
    request_log: Callable[[str], None] | None = None
    max_log_len: int | None = None
    request_id_headers: bool = False  # vLLM's --enable-request-id-headers: replies carry X-Request-Id
    force_include_usage: bool = False  # vLLM's --enable-force-include-usage: every stream ends with its usage


def _error(status: int, message: str, param: str | None = None, code: str | None = None) -> JSONResponse:
    return JSONResponse(error_body(status, message, param, code), status_code=status)


class _Guard:
    """ASGI middleware in front of /v1/: the API key (before any of the body is read) and the body
    limit (refused at the declared length, else when the bytes read pass it)."""

    def __init__(self, app, settings: FrontSettings):
        self.app, self.settings = app, settings

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or not scope["path"].startswith(GUARDED):
            return await self.app(scope, receive, send)
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        key = self.settings.api_key
        # OpenAI's header, or Anthropic's (x-api-key)
        bearer = hmac.compare_digest(headers.get("authorization", "").encode(), f"Bearer {key}".encode())
        if key is not None and not (bearer or hmac.compare_digest(headers.get("x-api-key", "").encode(), key.encode())):
            return await _error(401, "invalid or missing API key (Authorization: Bearer KEY, or x-api-key: KEY)")(
                scope, receive, send)
        limit = self.settings.max_body_bytes
        too_large = f"the request body is over {limit} bytes"
        declared = headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            return await _error(413, too_large)(scope, receive, send)
        read = 0

        async def limited():
            nonlocal read
            message = await receive()
            read += len(message.get("body", b""))
            if read > limit:  # FastAPI passes an HTTPException from reading the body through as it is
                raise HTTPException(413, too_large)
            return message

        await self.app(scope, limited, send)


def create_app(settings: FrontSettings, triton: TritonClient) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app):
        stats = None if settings.stats_log is None else asyncio.ensure_future(
            log_stats(triton.metrics, settings.stats_log, settings.stats_interval_s))
        yield
        if stats is not None:
            stats.cancel()
        for task in list(background):  # background responses still running: each closes its Triton stream
            task.cancel()
        await asyncio.gather(*background, return_exceptions=True)
        await triton.close()  # open keep-alive connections would hold Triton's shutdown for its whole timeout

    background: set[asyncio.Task] = set()  # background responses' runs (responses_routes.py)
    app = FastAPI(title="dflash-trt", summary="OpenAI-compatible DFlash speculative decoding",
                  docs_url="/docs" if settings.docs else None, redoc_url=None, lifespan=lifespan)
    app.add_middleware(_Guard, settings=settings)
    if settings.request_id_headers:  # outside the guard: a refusal carries the id too
        app.add_middleware(RequestIdHeader)
    if settings.allowed_origins:  # outside the guard: a preflight carries no API key, and refusals get the headers
        app.add_middleware(CORSMiddleware, allow_origins=list(settings.allowed_origins),
                           allow_credentials=settings.allow_credentials, allow_methods=list(settings.allowed_methods),
                           allow_headers=list(settings.allowed_headers))

    @app.exception_handler(RequestError)
    async def refused(request, err: RequestError):
        response = _error(err.status, err.message, err.param)
        if err.status == 429:  # the waiting queue is full: a slot frees within a few steps
            response.headers["Retry-After"] = "1"
        return response

    @app.exception_handler(RequestValidationError)
    async def invalid(request, err: RequestValidationError):
        refusal = protocol.refusal(list(err.errors()), err.body)
        return _error(refusal.status, refusal.message, refusal.param)

    @app.exception_handler(UpstreamError)
    async def upstream(request, err: UpstreamError):
        return _error(503, f"the inference server failed: {err}", code="upstream_error")

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request, err: StarletteHTTPException):  # unknown paths (404), wrong methods (405), 413
        response = _error(err.status_code, str(err.detail))
        response.headers.update(err.headers or {})
        if err.status_code == 405:  # Starlette's Allow names the methods of the first route of the path only
            response.headers["Allow"] = ", ".join(sorted({
                method for route in app.router.routes if isinstance(route, Route)
                and route.matches(request.scope)[0] != Match.NONE for method in route.methods or ()}))
        return response

    @app.exception_handler(Exception)
    async def bug(request, err: Exception):  # a bug of ours: still an error object, and the server lives on
        return _error(500, f"internal error: {type(err).__name__}: {err}", code="internal_error")

    served = False  # the model has been ready: a 503 after that is a drain, before it a start

    @app.get("/health", response_model=Health, responses={503: ERRORS[503]})
    async def health():
        """200 once the model serves; 503 before that (`error.code` "starting"), while it drains
        ("draining"), and once its engine is down ("engine_down": its steps keep failing; restart the
        server): load balancers route elsewhere."""
        nonlocal served
        if not await triton.ready():
            state = "draining" if served else "starting"
            return _error(503, f"the model is not ready: {state}", code=state)
        served = True
        try:
            await _answer(triton, {"health_check": True})
        except (RequestError, UpstreamError) as err:
            return _error(503, str(err), code="engine_down")
        return Health(status="ready")

    @app.get("/metrics", response_class=PlainTextResponse, responses={503: ERRORS[503]})
    async def metrics():
        """Prometheus text: the engine's vLLM-named metrics and Triton's own."""
        try:
            text = await triton.metrics()
        except Exception as err:  # the metrics port is down: say so, never a 500
            return _error(503, f"metrics are unavailable: {err}", code="upstream_error")
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4; charset=utf-8")

    # SageMaker's health check, as vLLM serves it
    app.add_api_route("/ping", health, methods=["GET", "POST"], response_model=Health, responses={503: ERRORS[503]})

    @app.get("/version", response_model=Version)
    async def version():
        return Version(version=__version__)

    card = ModelCard(id=settings.model, object="model", created=0, owned_by="dflash-trt")
    learnt: dict = {}  # what the Triton model says of itself (its max_model_len), once it has said it

    async def served_card() -> ModelCard:
        """The card, with vLLM's max_model_len (prompt + max_tokens) once the model has answered."""
        if not learnt:
            try:
                piece = await _answer(triton, {"health_check": True})
            except (RequestError, UpstreamError):  # starting, draining or down: the card as far as known
                return card
            learnt["max_model_len"] = (piece.usage or {}).get("max_model_len")
        return card.model_copy(update=learnt)

    @app.get("/v1/models", response_model=ModelList, response_model_exclude_none=True,
             responses={401: ERRORS[401]})
    async def models():
        return ModelList(object="list", data=[await served_card()])

    def unknown(model: str) -> JSONResponse:
        return _error(404, f"model '{model}' does not exist; this server serves '{settings.model}'", "model",
                      "model_not_found")

    @app.get("/v1/models/{model:path}", response_model=ModelCard, response_model_exclude_none=True,
             responses={401: ERRORS[401], 404: ERRORS[404]})
    async def model(model: str):
        """OpenAI's retrieve: the served model's card (a model id may hold slashes)."""
        return await served_card() if model == settings.model else unknown(model)

    def trusted(template: str | None) -> None:
        if template is not None and not settings.trust_request_chat_template:
            raise RequestError("chat_template", "this server renders prompts with its own chat template: a "
                                                "request's is taken only if it was started with "
                                                "--trust-request-chat-template")

    async def complete(request: Request, parsed: protocol._Sampling,
                       render: ResponseRender | messages_api.MessageRender | None = None):
        """Run a chat or completion request; `render` (the Responses or Messages API's: `whole`, `events`)
        writes its reply instead of the chat completion objects it is built from."""
        parsed.check_sampling()
        if parsed.model != settings.model:
            return unknown(parsed.model)
        chat = isinstance(parsed, protocol.ChatRequest)
        tools = parsed.offered_tools() if chat else {}
        forced = parsed.forced_tool() if chat else None  # the reply is the calls' JSON: no parser needed
        if tools and forced is None and settings.tool_parser is None:
            raise RequestError("tools", "this server parses no tool calls: its chat template writes none in a "
                                        "format it knows; start it with --tool-call-parser (and --chat-template), "
                                        "or force the calls with tool_choice")
        if chat:
            trusted(parsed.chat_template)
        # a continued last message opens no turn, so no think block either: the reply is all content
        thinking = (settings.thinking(parsed.template_variables(), parsed.chat_template)
                    if chat and settings.thinking and not parsed.continue_final_message else None)
        echo_top = parsed.logprobs if not chat and parsed.echo else None
        reply = Reply(chat=chat, model=settings.model, with_meta_info=parsed.return_meta_info,
                      logprobs=parsed.logprob_count() is not None, reasoning=thinking is not None,
                      prompt_top=parsed.prompt_logprobs, echo_top=echo_top,
                      request_id=parsed.request_id or request.headers.get("x-request-id"))
        if settings.request_log is not None:
            settings.request_log(received(reply.id, parsed, settings.max_log_len))
        reply.per_prompt, reply.token_ids = parsed.n, bool(parsed.return_token_ids)
        count = parsed.choice_count()
        most = 1 if getattr(parsed, "parallel_tool_calls", None) is False else None
        readers = [ReplyText(thinking, settings.tool_parser, tools, most, forced) for _ in range(count)]
        # each choice is a request of its own in the engine
        # a grammar (structured output, forced calls) starts once the think block the prompt opened ends
        after = UNTHINK if thinking else None
        # a reply that thinks has its reasoning tokens counted in its usage
        counted = {"reasoning_end": UNTHINK} if thinking else {}
        # a beam search is one request per prompt, whose replies are its n choices
        beams = parsed.n if parsed.use_beam_search else None
        choices = Choices([_renamed(triton.generate({**parsed.triton_inputs(choice, after), **counted}),
                                    "messages" if chat else "prompt")
                           for choice in range(0, count, beams or 1)], beams)
        # a completion's echoed prompt per choice; None: token ids, whose text the Triton model sends
        echoes = [parsed.echoed(choice) for choice in range(count)]
        if not parsed.stream:
            whole = await _whole(request, reply, choices, readers, echoes)
            if isinstance(whole, Response):  # the client left
                return whole
            return JSONResponse(whole if render is None else render.whole(whole))
        early = await choices.first_pieces()  # refusals (prompt too long, ...) come first: a 4xx, not a broken stream
        usage = parsed.include_usage or settings.force_include_usage
        chunks = _chunks(reply, choices, early, usage, readers, echoes, not chat and bool(parsed.echo),
                         parsed.continuous_usage)
        # sse-starlette ends its streams when the server begins to stop; a drain lets them finish
        return EventSourceResponse(_sse(chunks) if render is None else render.events(chunks),
                                   sep="\n", shutdown_grace_period=settings.drain_s)

    @app.post("/v1/chat/completions", response_model=None, responses=replies(ChatCompletion, ChatCompletionChunk))
    async def chat(request: Request, body: protocol.ChatRequest):
        return await complete(request, body)

    @app.post("/v1/completions", response_model=None, responses=replies(Completion, Completion))
    async def completions(request: Request, body: protocol.CompletionRequest):
        return await complete(request, body)

    @app.post("/v1/messages", response_model=None, responses=ERRORS)
    async def messages(request: Request, body: messages_api.MessagesRequest):
        """Anthropic's Messages API, run as a chat."""
        try:
            return await complete(request, body.chat_request(), messages_api.MessageRender(body, settings.model))
        except RequestError as err:
            raise protocol.renamed(err, messages_api.RENAMED) from None

    @app.post("/v1/messages/count_tokens", response_model=messages_api.TokensCount, responses=ERRORS)
    async def count_tokens(body: messages_api.CountTokensRequest):
        """Anthropic's: the input tokens a Messages request of this prompt would read (its usage's
        input_tokens and cache_read_input_tokens together)."""
        if body.model != settings.model:
            return unknown(body.model)
        try:
            piece = await _answer(triton, body.tokenize_request().triton_inputs(), "messages")
        except RequestError as err:
            raise protocol.renamed(err, messages_api.RENAMED) from None
        return messages_api.TokensCount(input_tokens=len(piece.prompt_token_ids))

    @app.post("/tokenize", response_model=TokenizeResponse, responses=ERRORS)
    async def tokenize(body: TokenizeRequest):
        """vLLM's: the token ids the model reads for a prompt or chat messages (as a request renders them)."""
        if body.model is not None and body.model != settings.model:
            return unknown(body.model)
        field = "prompt" if isinstance(body, TokenizePrompt) else "messages"
        if field == "messages":
            trusted(body.chat_template)
        piece = await _answer(triton, body.triton_inputs(), field)
        ids = list(piece.prompt_token_ids)
        return TokenizeResponse(count=len(ids), max_model_len=piece.usage["max_model_len"], tokens=ids)

    @app.post("/generate", response_model=None, responses=replies(generate_api.GenerateReply, generate_api.Answer))
    async def generate(request: Request, body: generate_api.GenerateRequest):
        """SGLang's native generate: prompts (text or token ids, no chat template) and SGLang's
        sampling_params -> {text, output_ids, meta_info}, a list of them for a batch or n > 1; streamed,
        cumulative chunks (a batch's or n samples' each with its "index")."""
        field = "text" if body.text is not None else "input_ids"
        try:
            if body.return_logprob and body.return_text_in_logprobs and settings.token_text is None:
                raise RequestError("return_text_in_logprobs", "this model has no tokenizer to give tokens' text")
            runs = [(parsed, generate_api.GenerateRender(body, rid, settings.token_text))
                    for parsed, rid in body.completions(settings.model)]
            if body.stream and len(runs) == 1:
                ((parsed, render),) = runs
                return await complete(request, parsed, render)
        except RequestError as err:
            raise generate_api.refused(err, field) from None
        if body.stream:
            return await _stream_batch(request, runs, field)
        # each prompt and sample a request of its own; one refused, the others are closed
        tasks = [asyncio.ensure_future(complete(request, parsed, render)) for parsed, render in runs]
        try:
            results = await asyncio.gather(*tasks)
        except RequestError as err:
            raise generate_api.refused(err, field) from None
        finally:
            for task in tasks:  # those still running once one failed (a finished one ignores it)
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        left = next((result for result in results if result.status_code != 200), None)
        if left is not None:  # the client left
            return left
        answers = [render.answer for _, render in runs]
        return JSONResponse(answers if body.batched() else answers[0])

    async def _stream_batch(request: Request, runs: list, field: str):
        """Each prompt and sample a streamed completion of its own, all started at once; one refused
        (before any chunk), the others are closed."""
        taps = [generate_api.StreamTap(render) for _, render in runs]
        tasks = [asyncio.ensure_future(complete(request, parsed, tap)) for (parsed, _), tap in zip(runs, taps)]
        try:
            await asyncio.gather(*tasks)
        except BaseException as err:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            for tap in taps:
                await tap.close()
            if isinstance(err, RequestError):
                raise generate_api.refused(err, field) from None
            raise
        return EventSourceResponse(generate_api.merged(taps), sep="\n", shutdown_grace_period=settings.drain_s)

    @app.post("/reset_prefix_cache", response_class=Response, responses=ERRORS)
    async def reset_prefix_cache():
        """vLLM's: the prompt positions finished requests' slots keep are forgotten (running requests keep
        theirs), so that a benchmark's warm-up serves none of its timed prompts. 200, no body."""
        await _answer(triton, {"reset_prefix_cache": True})
        return Response(status_code=200)

    # SGLang's name for it (GET or POST), which answers in text
    @app.api_route("/flush_cache", methods=["GET", "POST"], response_class=PlainTextResponse, responses=ERRORS)
    async def flush_cache():
        await _answer(triton, {"reset_prefix_cache": True})
        return PlainTextResponse("Cache flushed.\n")

    @app.post("/detokenize", response_model=DetokenizeResponse, responses=ERRORS)
    async def detokenize(body: DetokenizeRequest):
        """vLLM's: token ids back to their text."""
        if body.model is not None and body.model != settings.model:
            return unknown(body.model)
        return DetokenizeResponse(prompt=(await _answer(triton, body.triton_inputs(), "tokens")).prompt_text)

    add_responses_routes(app, settings.model, settings.responses_store, complete, unknown, background)

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


async def _answer(triton: TritonClient, inputs: dict, prompt_field: str = "prompt") -> Piece:
    """The one answer of a request that generates nothing: tokenize-only, a cache reset (refusals named
    by `prompt_field`)."""
    pieces = _renamed(triton.generate(inputs), prompt_field)
    try:
        return await anext(pieces)
    finally:
        await pieces.aclose()


def _finish(reason: str | None, reader: ReplyText) -> str | None:
    """A reply that ended on its own after calling tools ends for them (OpenAI's "tool_calls")."""
    return "tool_calls" if reason == "stop" and reader.calls else reason


async def _whole(request: Request, reply: Reply, choices: Choices, readers: list[ReplyText],
                 echoes: list[str | None]) -> dict | Response:
    """Collect every choice's reply (after its echo, a completion's echoed prompt: None for the text the
    Triton model sends); if one is refused, or the client leaves first, stop them all."""
    texts, logprobs, last, ids = ([[] for _ in range(choices.count)] for _ in range(4))
    echoes, prompts, prompt_ids, seen = list(echoes), [None] * choices.count, [()] * choices.count, set()

    async def collect():
        while not choices.done:
            choice, piece = await choices.next()
            if choice not in seen:  # its first piece: the prompt's text and logprobs, when asked
                seen.add(choice)
                echoes[choice] = piece.prompt_text if echoes[choice] is None else echoes[choice]
                prompts[choice], prompt_ids[choice] = piece.prompt_logprobs, piece.prompt_token_ids
            texts[choice].append(piece.text)
            ids[choice] += piece.token_ids
            logprobs[choice] += piece.logprobs or []
            last[choice] = piece

    task = asyncio.ensure_future(collect())
    try:
        while not task.done():  # the client is asked every poll, however fast the pieces come
            await asyncio.wait({task}, timeout=DISCONNECT_POLL_S)
            if not task.done() and await request.is_disconnected():
                task.cancel()
                return Response(status_code=499)  # nobody reads it
        task.result()  # a choice's refusal or failure
    finally:
        await choices.close()
    outcomes = []
    for choice, (piece, reader) in enumerate(zip(last, readers, strict=True)):
        reader.next("".join(texts[choice]), final=True)
        outcomes.append(Outcome(echoes[choice] + reader.content, _finish(piece.finish_reason, reader),
                                logprobs[choice] if reply.logprobs else None, reader.calls, reader.reasoning,
                                prompts[choice], ids[choice], prompt_ids[choice],
                                (piece.usage or {}).get("stop_reason")))
    return reply.whole(outcomes, merged_usage([piece.usage for piece in last], reply.per_prompt))


def _sse(chunks: AsyncIterator[dict | str]) -> AsyncIterator[dict]:
    """A chat or completion stream's chunks as Server-Sent Events."""
    return translated(chunks, [], lambda chunk: [{"data": chunk if isinstance(chunk, str) else json.dumps(chunk)}])


async def _chunks(reply: Reply, choices: Choices, early: list[tuple[int, Piece]], include_usage: bool,
                  readers: list[ReplyText], echoes: list[str | None], echo: bool = False, continuous: bool = False):
    """A stream's chunks (dicts, then "[DONE]"; a mid-stream refusal an error object): each choice's role
    (a chat) or echoed prompt (`echo`: its text from `echoes`, or None for the Triton model's, with its
    logprobs when asked), content deltas (and tool calls, each whole once its block closes) and finish
    reason, the usage of all if asked, [DONE]; `continuous` (vLLM's continuous_usage_stats): each choice's
    chunks with its usage so far. `early`: the pieces read before the reply began, every choice's first
    among them. sse-starlette cancels this generator when the client disconnects; the choices are then
    closed, and Triton cancels them."""
    firsts = {}
    for choice, piece in early:
        firsts.setdefault(choice, piece)
    echoes = [firsts[choice].prompt_text if text is None else text for choice, text in enumerate(echoes)]
    sent = [len(text) for text in echoes]  # per choice, the text so far, where a completion's token offsets count from
    texts = [""] * choices.count  # per choice, the text so far (reasoning and calls included)
    usages = [None] * choices.count
    # return_token_ids: a choice's prompt ids go with its first chunk (None: sent), its new ids with each
    prompts = [list(firsts[choice].prompt_token_ids) if reply.token_ids else None for choice in range(choices.count)]

    def ids(choice: int, piece: Piece) -> dict:
        if not reply.token_ids:
            return {}
        first, prompts[choice] = prompts[choice], None
        return {"token_ids": piece.token_ids, "prompt_token_ids": first}

    # per choice: its prompt's tokens (their ids came with its first piece) and its reply's so far
    prompt_tokens = [len(firsts[choice].prompt_token_ids) for choice in range(choices.count)]
    generated = [0] * choices.count

    def counted(chunk: dict, choice: int) -> dict:
        if continuous:
            chunk["usage"] = {"prompt_tokens": prompt_tokens[choice], "completion_tokens": generated[choice],
                              "total_tokens": prompt_tokens[choice] + generated[choice]}
        return chunk

    try:
        for choice in range(choices.count):  # a chat's role, a completion's echoed prompt
            if reply.chat or echo:
                yield counted(reply.chunk(echoes[choice] or None, role=reply.chat, index=choice,
                                          prompt=firsts[choice].prompt_logprobs,
                                          **({"prompt_token_ids": prompts[choice]} if reply.token_ids else {})),
                              choice)
                prompts[choice] = None
            if reply.chat and echoes[choice]:  # the last message the reply continues, first
                yield counted(reply.chunk(echoes[choice], index=choice), choice)
        while early or not choices.done:
            choice, piece = early.pop(0) if early else await choices.next()
            reader = readers[choice]
            texts[choice] += piece.text
            generated[choice] += len(piece.token_ids)
            new = reader.next(texts[choice], final=piece.finish_reason is not None)
            if new.content or new.reasoning or piece.logprobs or (reply.token_ids and piece.token_ids):
                yield counted(reply.chunk(new.content, logprobs=piece.logprobs, offset=sent[choice], index=choice,
                                          reasoning=new.reasoning, **ids(choice, piece)), choice)
                sent[choice] += len(new.content)
            if new.calls:
                first = len(reader.calls) - len(new.calls)
                yield counted(reply.chunk(None, index=choice, tool_calls=tuple(enumerate(new.calls, first))), choice)
            if piece.finish_reason is not None:
                yield counted(reply.chunk(None, _finish(piece.finish_reason, reader), index=choice,
                                          stop_reason=(piece.usage or {}).get("stop_reason")), choice)
                usages[choice] = piece.usage
        if include_usage:
            yield reply.usage_chunk(merged_usage(usages, reply.per_prompt))
        yield "[DONE]"
    except (RequestError, UpstreamError) as err:  # mid-stream: the status line has gone already
        status = err.status if isinstance(err, RequestError) else 503
        yield error_body(status, str(err), getattr(err, "param", None))
    finally:
        await choices.close()

"""OpenAI response bodies, stream chunks and error objects, built from the models of openai_models.py."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass

from dflash_trt.serve.openai_models import (
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChatDelta,
    ChatLogprobs,
    Completion,
    CompletionChoice,
    CompletionLogprobs,
    ErrorDetail,
    ErrorResponse,
    MetaInfo,
    CalledFunction,
    PromptTokensDetails,
    TokenLogprob,
    ToolCall,
    ToolCallDelta,
    TopLogprob,
    Usage,
    dump,
)

ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
               405: "invalid_request_error", 413: "invalid_request_error", 422: "invalid_request_error",
               429: "rate_limit_error"}


def error_body(status: int, message: str, param: str | None = None, code: str | None = None) -> dict:
    kind = ERROR_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    return dump(ErrorResponse(error=ErrorDetail(message=message, type=kind, param=param, code=code)))


def usage(info: dict | None) -> Usage:
    """Triton's usage JSON -> OpenAI usage, plus acceptance: per verify step (bench/server.py reads
    `acceptance_lengths`) and the mean, as dflash-trt extensions."""
    info = info or {}
    prompt, completion = info.get("prompt_tokens", 0), info.get("completion_tokens", 0)
    return Usage(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion,
                 prompt_tokens_details=PromptTokensDetails(cached_tokens=info.get("cached_tokens", 0)),
                 acceptance_lengths=info.get("acceptance_lengths", []),
                 mean_acceptance_length=info.get("mean_acceptance_length"))


def meta_info(info: dict | None) -> MetaInfo:
    """SGLang's `meta_info` for a reply (what the DFlash authors' benchmark client reads): verify steps
    that drafted (`spec_verify_ct`) and the mean acceptance length τ per such step, bonus token
    included (`spec_accept_length`; absent when nothing was drafted)."""
    info = info or {}
    accept = info.get("mean_acceptance_length")
    return MetaInfo(completion_tokens=info.get("completion_tokens", 0), spec_verify_ct=info.get("num_drafts", 0),
                    **({} if accept is None else {"spec_accept_length": accept}))


def chat_logprobs(entries: list | None) -> ChatLogprobs | None:
    """The Triton model's [text, logprob, [[text, logprob], ...]] per token -> OpenAI's chat form."""
    if entries is None:
        return None

    def top(text: str, logprob: float) -> TopLogprob:
        return TopLogprob(token=text, logprob=logprob, bytes=list(text.encode()))

    return ChatLogprobs(content=[TokenLogprob(**top(text, logprob).model_dump(), top_logprobs=[top(*t) for t in tops])
                                 for text, logprob, tops in entries])


def completion_logprobs(entries: list | None, offset: int = 0) -> CompletionLogprobs | None:
    """The same -> the legacy completions form; text offsets count from `offset` (the text sent before)."""
    if entries is None:
        return None
    offsets, at = [], offset
    for text, _, _ in entries:
        offsets.append(at)
        at += len(text)
    return CompletionLogprobs(tokens=[e[0] for e in entries], token_logprobs=[e[1] for e in entries],
                              top_logprobs=[dict((t, lp) for t, lp in e[2]) for e in entries], text_offset=offsets)


def merged_usage(infos: list[dict | None]) -> dict | None:
    """The usage of a request's choices (Triton's usage JSON each): the prompt counted once (its cached
    tokens: choice 0's), the completions and verify steps of all, τ over all their steps."""
    if len(infos) == 1:
        return infos[0]
    infos = [info or {} for info in infos]
    lengths = [tau for info in infos for tau in info.get("acceptance_lengths", [])]
    return {"prompt_tokens": infos[0].get("prompt_tokens", 0), "cached_tokens": infos[0].get("cached_tokens", 0),
            "completion_tokens": sum(info.get("completion_tokens", 0) for info in infos),
            "num_drafts": len(lengths), "acceptance_lengths": lengths,
            "mean_acceptance_length": sum(lengths) / len(lengths) if lengths else None}


@dataclass(frozen=True)
class Outcome:
    """One choice of a whole reply: its content, and its tool_calls.ToolCall's and reasoning when the
    request offered tools / the server parses reasoning (Reply says which)."""

    text: str
    finish_reason: str | None
    logprobs: list | None = None
    tool_calls: list = ()
    reasoning: str | None = None


def _tool_call(call, index: int | None = None) -> ToolCall:
    function = CalledFunction(name=call.name, arguments=call.arguments)
    if index is None:
        return ToolCall(id=call.id, type="function", function=function)
    return ToolCallDelta(index=index, id=call.id, type="function", function=function)


def _message(outcome: Outcome, reasoning: bool) -> AssistantMessage:
    extra = {"reasoning_content": outcome.reasoning} if reasoning else {}
    if not outcome.tool_calls:
        return AssistantMessage(role="assistant", content=outcome.text, **extra)
    return AssistantMessage(role="assistant", content=outcome.text or None,
                            tool_calls=[_tool_call(call) for call in outcome.tool_calls], **extra)


class Reply:
    """One request's identity and the shapes of its chat or completion objects."""

    def __init__(self, chat: bool, model: str, with_meta_info: bool = False, logprobs: bool = False,
                 reasoning: bool = False):
        self.chat, self.model, self.with_meta_info, self.logprobs = chat, model, with_meta_info, logprobs
        self.reasoning = reasoning  # replies carry reasoning_content
        self.id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        self.created = int(time.time())

    def _head(self) -> dict:
        return {"id": self.id, "created": self.created, "model": self.model}

    def whole(self, outcomes: list[Outcome], info: dict | None) -> dict:
        """The reply of every choice, in choice order; `info`: their merged usage."""
        extra = {"usage": usage(info), **({"meta_info": meta_info(info)} if self.with_meta_info else {})}
        if self.chat:
            choices = [ChatChoice(index=i, message=_message(o, self.reasoning), logprobs=chat_logprobs(o.logprobs),
                                  finish_reason=o.finish_reason)
                       for i, o in enumerate(outcomes)]
            return dump(ChatCompletion(object="chat.completion", choices=choices, **self._head(), **extra))
        choices = [CompletionChoice(index=i, text=o.text, logprobs=completion_logprobs(o.logprobs),
                                    finish_reason=o.finish_reason) for i, o in enumerate(outcomes)]
        return dump(Completion(object="text_completion", choices=choices, **self._head(), **extra))

    def chunk(self, text: str | None, finish_reason: str | None = None, role: bool = False,
              logprobs: list | None = None, offset: int = 0, index: int = 0, tool_calls: tuple = (),
              reasoning: str = "") -> dict:
        """A stream chunk of choice `index`; `tool_calls`: (place among the choice's calls, call) pairs;
        `reasoning`: new reasoning text (with `text`, new content, when there is any)."""
        if self.chat:
            delta = (ChatDelta(role="assistant", content="") if role
                     else ChatDelta(tool_calls=[_tool_call(call, at) for at, call in tool_calls]) if tool_calls
                     else ChatDelta(reasoning_content=reasoning, **({"content": text} if text else {})) if reasoning
                     else ChatDelta() if text is None else ChatDelta(content=text))
            choice = ChatChunkChoice(index=index, delta=delta, logprobs=chat_logprobs(logprobs),
                                     finish_reason=finish_reason)
            return dump(ChatCompletionChunk(object="chat.completion.chunk", choices=[choice], **self._head()))
        choice = CompletionChoice(index=index, text=text or "", logprobs=completion_logprobs(logprobs, offset),
                                  finish_reason=finish_reason)
        return dump(Completion(object="text_completion", choices=[choice], **self._head()))

    def usage_chunk(self, info: dict | None) -> dict:
        if self.chat:
            return dump(ChatCompletionChunk(object="chat.completion.chunk", choices=[], usage=usage(info),
                                            **self._head()))
        return dump(Completion(object="text_completion", choices=[], usage=usage(info), **self._head()))

"""OpenAI response bodies, stream chunks and error objects, built from the models of openai_models.py."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass

from dflash_trt.serve.openai_models import (
    AssistantMessage,
    CalledFunction,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChatDelta,
    ChatLogprobs,
    Completion,
    CompletionChoice,
    CompletionLogprobs,
    CompletionTokensDetails,
    ErrorDetail,
    ErrorResponse,
    MetaInfo,
    PromptLogprob,
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
                 **({"completion_tokens_details": CompletionTokensDetails(reasoning_tokens=info["reasoning_tokens"])}
                    if "reasoning_tokens" in info else {}),
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
    """The same (an echoed prompt's first token: [text, None, None]) -> the legacy completions form; text
    offsets count from `offset` (the text sent before)."""
    if entries is None:
        return None
    offsets, at = [], offset
    for text, _, _ in entries:
        offsets.append(at)
        at += len(text)
    return CompletionLogprobs(tokens=[e[0] for e in entries], token_logprobs=[e[1] for e in entries],
                              top_logprobs=[None if e[2] is None else dict((t, lp) for t, lp in e[2]) for e in entries],
                              text_offset=offsets)


def echoed_logprobs(prompt: list | None, top: int) -> list:
    """The Triton model's prompt entries ([id, text, logprob, [[id, text, logprob], ...]] per token) ->
    the reply's per-token form with `top` of the most probable, as output tokens' (completion_logprobs).
    None (a request the engine aborted before it scored its prompt): none."""
    return [[text, logprob, None if ranked is None else [[t, lp] for _, t, lp in ranked[:top]]]
            for _, text, logprob, ranked in prompt or ()]


def vllm_prompt_logprobs(prompt: list | None, top: int) -> list | None:
    """The same -> vLLM's prompt_logprobs: per token after the first {id: {logprob, rank, decoded_token}},
    its own entry first, then the `top` most probable (rank: place among them; the token's own, null
    when outside them); None for a request aborted before its prompt was scored."""
    if prompt is None:
        return None
    out = [None]
    for token, text, logprob, ranked in prompt[1:]:
        ranked = ranked[:top]
        places = {t: rank for rank, (t, _, _) in enumerate(ranked, 1)}
        entries = {str(token): PromptLogprob(logprob=logprob, rank=places.get(token), decoded_token=text)}
        for t, t_text, lp in ranked:
            entries.setdefault(str(t), PromptLogprob(logprob=lp, rank=places[t], decoded_token=t_text))
        out.append(entries)
    return out


def merged_usage(infos: list[dict | None], per_prompt: int = 1) -> dict | None:
    """The usage of a request's choices (Triton's usage JSON each; `per_prompt` choices of each prompt in
    a row): each prompt counted once (its cached tokens: its first choice's), the completions and verify
    steps of all, τ over all their steps."""
    if len(infos) == 1:
        return infos[0]
    infos = [info or {} for info in infos]
    lengths = [tau for info in infos for tau in info.get("acceptance_lengths", [])]
    firsts = infos[::per_prompt]
    return {"prompt_tokens": sum(info.get("prompt_tokens", 0) for info in firsts),
            "cached_tokens": sum(info.get("cached_tokens", 0) for info in firsts),
            "completion_tokens": sum(info.get("completion_tokens", 0) for info in infos),
            **({"reasoning_tokens": sum(info.get("reasoning_tokens", 0) for info in infos)}
               if any("reasoning_tokens" in info for info in infos) else {}),
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
    prompt: list | None = None  # the Triton model's prompt entries, when asked (Piece.prompt_logprobs)
    token_ids: list[int] = ()  # the reply's and its prompt's tokens (shown with return_token_ids)
    prompt_token_ids: list[int] = ()
    stop_reason: int | str | None = None  # vLLM's: the stop string or stop token id that ended it


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
                 reasoning: bool = False, prompt_top: int | None = None, echo_top: int | None = None,
                 request_id: str | None = None):
        self.chat, self.model, self.with_meta_info, self.logprobs = chat, model, with_meta_info, logprobs
        self.reasoning = reasoning  # replies carry reasoning_content
        # vLLM's prompt_logprobs asked (its count), and a completion's echo with logprobs (their count)
        self.prompt_top, self.echo_top = prompt_top, echo_top
        self.per_prompt = 1  # choices per prompt (n), in a row: a prompt's tokens count once in the usage
        self.token_ids = False  # replies carry the prompt's and the reply's token ids (return_token_ids)
        # vLLM's: the client's request id (the body's, else its X-Request-Id) after the prefix, else a random one
        self.id = ("chatcmpl-" if chat else "cmpl-") + (request_id or uuid.uuid4().hex)
        self.created = int(time.time())

    def _head(self) -> dict:
        return {"id": self.id, "created": self.created, "model": self.model}

    def whole(self, outcomes: list[Outcome], info: dict | None) -> dict:
        """The reply of every choice, in choice order; `info`: their merged usage."""
        extra = {"usage": usage(info), **({"meta_info": meta_info(info)} if self.with_meta_info else {})}
        if self.chat:
            choices = [ChatChoice(index=i, message=_message(o, self.reasoning), logprobs=chat_logprobs(o.logprobs),
                                  finish_reason=o.finish_reason, stop_reason=o.stop_reason)
                       for i, o in enumerate(outcomes)]
            if self.prompt_top is not None:  # the choices share their prompt
                extra["prompt_logprobs"] = vllm_prompt_logprobs(outcomes[0].prompt, self.prompt_top)
            if self.token_ids:
                extra["prompt_token_ids"] = list(outcomes[0].prompt_token_ids)
                for choice, o in zip(choices, outcomes, strict=True):
                    choice.token_ids = list(o.token_ids)
            return dump(ChatCompletion(object="chat.completion", choices=choices, **self._head(), **extra))
        choices = []
        for i, o in enumerate(outcomes):
            logprobs = o.logprobs
            if self.echo_top is not None:
                logprobs = echoed_logprobs(o.prompt, self.echo_top) + (logprobs or [])
            scored = {} if self.prompt_top is None else {"prompt_logprobs": vllm_prompt_logprobs(o.prompt, self.prompt_top)}
            if self.token_ids:
                scored.update(prompt_token_ids=list(o.prompt_token_ids), token_ids=list(o.token_ids))
            choices.append(CompletionChoice(index=i, text=o.text, logprobs=completion_logprobs(logprobs),
                                            finish_reason=o.finish_reason, stop_reason=o.stop_reason, **scored))
        return dump(Completion(object="text_completion", choices=choices, **self._head(), **extra))

    def chunk(self, text: str | None, finish_reason: str | None = None, role: bool = False,
              logprobs: list | None = None, offset: int = 0, index: int = 0, tool_calls: tuple = (),
              reasoning: str = "", prompt: list | None = None, token_ids: list | None = None,
              prompt_token_ids: list | None = None, stop_reason: int | str | None = None) -> dict:
        """A stream chunk of choice `index`; `tool_calls`: (place among the choice's calls, call) pairs;
        `reasoning`: new reasoning text (with `text`, new content, when there is any); `prompt`: a
        completion's echoed prompt entries (its logprobs then); with return_token_ids, `token_ids` the
        chunk's new tokens and `prompt_token_ids` (a choice's first chunk) its prompt's."""
        ids = {} if token_ids is None else {"token_ids": list(token_ids)}
        if finish_reason is not None:  # the last chunk of a choice says what ended it, as the whole form does
            ids["stop_reason"] = stop_reason
        if self.chat:
            delta = (ChatDelta(role="assistant", content="") if role
                     else ChatDelta(tool_calls=[_tool_call(call, at) for at, call in tool_calls]) if tool_calls
                     else ChatDelta(reasoning_content=reasoning, **({"content": text} if text else {})) if reasoning
                     else ChatDelta() if text is None else ChatDelta(content=text))
            choice = ChatChunkChoice(index=index, delta=delta, logprobs=chat_logprobs(logprobs),
                                     finish_reason=finish_reason, **ids)
            prompt_ids = {} if prompt_token_ids is None else {"prompt_token_ids": list(prompt_token_ids)}
            return dump(ChatCompletionChunk(object="chat.completion.chunk", choices=[choice], **self._head(),
                                            **prompt_ids))
        if prompt is not None and self.echo_top is not None:
            logprobs = echoed_logprobs(prompt, self.echo_top)
        if prompt_token_ids is not None:
            ids["prompt_token_ids"] = list(prompt_token_ids)
        choice = CompletionChoice(index=index, text=text or "", logprobs=completion_logprobs(logprobs, offset),
                                  finish_reason=finish_reason, **ids)
        return dump(Completion(object="text_completion", choices=[choice], **self._head()))

    def usage_chunk(self, info: dict | None) -> dict:
        if self.chat:
            return dump(ChatCompletionChunk(object="chat.completion.chunk", choices=[], usage=usage(info),
                                            **self._head()))
        return dump(Completion(object="text_completion", choices=[], usage=usage(info), **self._head()))

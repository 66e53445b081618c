"""OpenAI response bodies as pydantic models: what the front returns and what /openapi.json says it
returns (requests are in protocol.py). Replies are built from these models and dumped with
`exclude_unset`, so a field is in the JSON exactly when the reply set it (a chunk's delta carries only
what changed, while `logprobs: null` is always there, as in OpenAI's objects)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field


class PromptTokensDetails(BaseModel):
    cached_tokens: int = Field(description="prompt tokens a finished request's KV slot held already (prefix "
                                           "caching): not prefilled")


class CompletionTokensDetails(BaseModel):
    reasoning_tokens: int = Field(description="the reply's tokens up to the end of its reasoning (with "
                                              "--reasoning-parser and a prompt that opened a think block)")


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails | None = None
    completion_tokens_details: CompletionTokensDetails | None = None
    acceptance_lengths: list[int] = Field(
        default_factory=list, description="dflash-trt: tokens committed per verify step that drafted (τ per step)")
    mean_acceptance_length: float | None = Field(None, description="dflash-trt: the mean of acceptance_lengths")


class MetaInfo(BaseModel):
    """SGLang's `meta_info` (`return_meta_info: true`), which the DFlash authors' benchmark client reads."""

    completion_tokens: int
    spec_verify_ct: int = Field(description="verify steps that drafted")
    spec_accept_length: float | None = Field(None, description="mean tokens committed per such step; absent "
                                                                "when nothing was drafted")


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None = Field(description="the token's UTF-8 bytes")


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob] = Field(description="the most probable tokens at this position (top_logprobs)")


class ChatLogprobs(BaseModel):
    """Log-probabilities under the model's raw logits (before temperature, top-k and top-p)."""

    content: list[TokenLogprob] | None


class CompletionLogprobs(BaseModel):
    """The legacy completions form: per token its text, log-probability, the top ones and its offset
    (with echo, the prompt's tokens first: the first with null, nothing comes before it)."""

    tokens: list[str]
    token_logprobs: list[float | None]
    top_logprobs: list[dict[str, float] | None]
    text_offset: list[int]


class PromptLogprob(BaseModel):
    """vLLM's prompt_logprobs entry of one token at one prompt position."""

    logprob: float
    rank: int | None = Field(description="1: the most probable there; null: the prompt's token, outside the top")
    decoded_token: str


# vLLM's prompt_logprobs: per prompt token {token id: entry} (its own, then the top ones), null for the first
PromptLogprobs = list[dict[str, PromptLogprob] | None]


class CalledFunction(BaseModel):
    name: str
    arguments: str = Field(description="a JSON object's text")


class ToolCall(BaseModel):
    id: str
    type: Literal["function"]
    function: CalledFunction


class ToolCallDelta(ToolCall):
    """A streamed call: sent once, whole (its name and all its arguments in one chunk)."""

    index: int = Field(description="the call's place among the choice's calls")


class AssistantMessage(BaseModel):
    role: Literal["assistant"]
    content: str | None = Field(description="null when the reply is only tool calls")
    reasoning_content: str | None = Field(None, description="with --reasoning-parser: the reply's thinking "
                                                            "(null: it did not think)")
    tool_calls: list[ToolCall] | None = None


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None
    stop_reason: int | str | None = Field(None, description="vLLM's: the stop string or stop token id that ended "
                                                           "the reply (null: EOS, a length, or still running)")
    token_ids: list[int] | None = Field(None, description="vLLM's, with return_token_ids: the reply's tokens")


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    prompt_logprobs: PromptLogprobs | None = Field(None, description="vLLM's, when asked: the rendered prompt's")
    prompt_token_ids: list[int] | None = Field(None, description="vLLM's, with return_token_ids: the rendered "
                                                                 "prompt's tokens")
    meta_info: MetaInfo | None = None


class ChatDelta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[ToolCallDelta] | None = None


class ChatChunkChoice(BaseModel):
    index: int
    delta: ChatDelta
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None
    stop_reason: int | str | None = Field(None, description="vLLM's: the stop string or stop token id that ended "
                                                           "the reply (null: EOS, a length, or still running)")
    token_ids: list[int] | None = Field(None, description="vLLM's, with return_token_ids: the chunk's new tokens")


class ChatCompletionChunk(BaseModel):
    """One Server-Sent Event of a streamed chat reply; the last (with stream_options.include_usage)
    has no choices and the usage."""

    id: str
    object: Literal["chat.completion.chunk"]
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None
    prompt_token_ids: list[int] | None = Field(None, description="vLLM's, with return_token_ids: in a choice's "
                                                                 "first chunk, the rendered prompt's tokens")


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None
    stop_reason: int | str | None = Field(None, description="vLLM's: the stop string or stop token id that ended "
                                                           "the reply (null: EOS, a length, or still running)")
    prompt_logprobs: PromptLogprobs | None = Field(None, description="vLLM's, when asked: its prompt's")
    prompt_token_ids: list[int] | None = Field(None, description="vLLM's, with return_token_ids: its prompt's")
    token_ids: list[int] | None = Field(None, description="vLLM's, with return_token_ids: the reply's tokens")


class Completion(BaseModel):
    """A completion reply, or one Server-Sent Event of a streamed one (then usage only on the last,
    with stream_options.include_usage)."""

    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None
    meta_info: MetaInfo | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"]
    created: int
    owned_by: str
    max_model_len: int | None = Field(None, description="vLLM's: the tokens a request may hold (prompt + "
                                                        "max_tokens), once the model has started")


class ModelList(BaseModel):
    object: Literal["list"]
    data: list[ModelCard]


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorResponse(BaseModel):
    error: ErrorDetail


class Health(BaseModel):
    status: Literal["ready"]


class Version(BaseModel):
    version: str


def dump(model: BaseModel) -> dict:
    """The JSON object of a reply: the fields it set, nothing else."""
    return model.model_dump(mode="json", exclude_unset=True)

"""OpenAI's Responses API reply bodies as pydantic models: the Response object, its output items and
the stream's events (what /v1/responses returns and what /openapi.json says it returns)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from dflash_trt.serve.openai_models import TokenLogprob


class OutputText(BaseModel):
    type: Literal["output_text"]
    text: str
    annotations: list = Field(default_factory=list)
    logprobs: list[TokenLogprob] | None = Field(None, description="with include message.output_text.logprobs")


class ReasoningText(BaseModel):
    type: Literal["reasoning_text"]
    text: str


class MessageItem(BaseModel):
    id: str
    type: Literal["message"]
    status: Literal["in_progress", "completed", "incomplete"]
    role: Literal["assistant"]
    content: list[OutputText]


class ReasoningItem(BaseModel):
    """With --reasoning-parser: the reply's thinking, as text (never encrypted here)."""

    id: str
    type: Literal["reasoning"]
    status: Literal["in_progress", "completed", "incomplete"]
    summary: list = Field(default_factory=list)
    content: list[ReasoningText]
    encrypted_content: None = None


class FunctionCallItem(BaseModel):
    id: str
    type: Literal["function_call"]
    status: Literal["in_progress", "completed", "incomplete"]
    call_id: str
    name: str
    arguments: str = Field(description="the arguments as a JSON object's text")


OutputItem = MessageItem | ReasoningItem | FunctionCallItem


class InputTokensDetails(BaseModel):
    cached_tokens: int = Field(description="prompt tokens a finished request's KV slot held (prefix caching)")


class OutputTokensDetails(BaseModel):
    reasoning_tokens: int = Field(description="the reply's tokens up to the end of its reasoning")


class ResponseUsage(BaseModel):
    input_tokens: int
    input_tokens_details: InputTokensDetails
    output_tokens: int
    output_tokens_details: OutputTokensDetails
    total_tokens: int
    acceptance_lengths: list[int] = Field(
        default_factory=list, description="dflash-trt: tokens committed per verify step that drafted (τ per step)")


class IncompleteDetails(BaseModel):
    reason: Literal["max_output_tokens"]


class TextFormat(BaseModel):
    type: Literal["text", "json_object", "json_schema"]


class TextConfig(BaseModel):
    format: TextFormat


class ResponseError(BaseModel):
    code: str
    message: str


class ResponseObject(BaseModel):
    """A response: created (a background one queued), then in progress, and completed or incomplete (a
    background one also failed, or cancelled); stored unless `store` is false (GET /v1/responses/{id}
    returns it, previous_response_id continues its conversation)."""

    id: str
    object: Literal["response"]
    created_at: int
    status: Literal["queued", "in_progress", "completed", "incomplete", "failed", "cancelled"]
    background: bool = False
    model: str
    output: list[OutputItem]
    usage: ResponseUsage | None = None
    incomplete_details: IncompleteDetails | None = None
    error: ResponseError | None = None
    instructions: str | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    parallel_tool_calls: bool
    tool_choice: str | dict
    tools: list[dict]
    text: TextConfig
    metadata: dict[str, str] = Field(default_factory=dict)
    previous_response_id: str | None = None
    store: bool


class StreamEvent(BaseModel):
    """One Server-Sent Event of a streamed response (`event:` is its type): response.created,
    response.in_progress, response.output_item.added / .done, response.content_part.added / .done,
    response.output_text.delta / .done, response.reasoning_text.delta / .done,
    response.function_call_arguments.delta / .done, then response.completed or response.incomplete
    (with the whole response), or error."""

    type: str
    sequence_number: int


class DeletedResponse(BaseModel):
    id: str
    object: Literal["response.deleted"]
    deleted: Literal[True]


class InputItemList(BaseModel):
    """A page of a stored response's input items (its request's: messages, function calls and their
    outputs, reasoning), each with its id."""

    object: Literal["list"]
    data: list[dict]
    first_id: str | None
    last_id: str | None
    has_more: bool

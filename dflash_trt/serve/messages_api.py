"""Anthropic's Messages API (POST /v1/messages) on the chat path, as agents built for it (Claude Code
style clients) call a local model.

A request becomes a ChatRequest (`system` a system turn first; messages' text blocks their content,
`tool_use` blocks an assistant turn's tool_calls, `tool_result` blocks tool turns; tools and
tool_choice the chat forms; `stop_sequences` stop) and runs as one. Its reply is written back as a
Message (text, `thinking` and `tool_use` content blocks; `stop_reason` end_turn / max_tokens /
stop_sequence / tool_use) or the Messages stream's events (message_start, content_block_start /
delta / stop, message_delta, message_stop). Errors keep the OpenAI error object of every endpoint here.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, ValidationError

from dflash_trt.serve.event_streams import translated
from dflash_trt.serve.protocol import ChatRequest, FunctionName, JsonInt, StopString, _Open, refusal, renamed
from dflash_trt.serve.requests import RequestError
from dflash_trt.serve.tokenize_api import TokenizeChat
from dflash_trt.spec.sampling import RANGES


class TextBlock(_Open):
    type: Literal["text"]
    text: str


class ToolUseBlock(_Open):
    """A call an earlier reply made (sent back in an assistant turn)."""

    type: Literal["tool_use"]
    id: str
    name: str
    input: dict[str, Any]


class ToolResultBlock(_Open):
    type: Literal["tool_result"]
    tool_use_id: str
    content: str | list[TextBlock] = ""
    is_error: bool | None = None


class ThinkingBlock(_Open):
    """An earlier reply's thinking, sent back: not shown to the model again (chat templates drop it)."""

    type: Literal["thinking", "redacted_thinking"]


def _block_type(block: Any) -> str | None:
    kind = block.get("type") if isinstance(block, dict) else getattr(block, "type", None)
    return "thinking" if kind == "redacted_thinking" else kind


Block = Annotated[Annotated[TextBlock, Tag("text")] | Annotated[ToolUseBlock, Tag("tool_use")]
                  | Annotated[ToolResultBlock, Tag("tool_result")] | Annotated[ThinkingBlock, Tag("thinking")],
                  Discriminator(_block_type)]


class Message(_Open):
    role: Literal["user", "assistant"]
    content: str | list[Block]


class MessagesTool(_Open):
    name: FunctionName
    description: str | None = None
    input_schema: dict[str, Any]


class ToolChoice(_Open):
    type: Literal["auto", "any", "none"]
    disable_parallel_tool_use: bool | None = None


class NamedToolChoice(ToolChoice):
    type: Literal["tool"]
    name: str


class ThinkingDisabled(_Open):
    type: Literal["disabled"]


class ThinkingEnabled(_Open):
    """At most budget_tokens tokens of thinking (vLLM's thinking_token_budget); whether the model thinks
    at all is its chat template's (chat templates of Qwen3 and Qwen3.5 think by default)."""

    type: Literal["enabled"]
    budget_tokens: JsonInt = Field(json_schema_extra=RANGES["thinking_token_budget"])  # SamplingParams checks it


# Anthropic's stop reasons for the chat's finish reasons
STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}
# A chat request's fields -> this body's, for refusals the chat path words
RENAMED = {"messages": "messages", "stop": "stop_sequences", "thinking_token_budget": "thinking.budget_tokens"}


class CountTokensRequest(BaseModel):
    """POST /v1/messages/count_tokens: the prompt of a Messages request, without its sampling."""

    model_config = ConfigDict(extra="forbid", strict=True)
    model: str
    messages: list[Message] = Field(min_length=1)
    system: str | list[TextBlock] | None = None
    tools: list[MessagesTool] | None = None
    tool_choice: ToolChoice | NamedToolChoice | None = None
    thinking: Annotated[ThinkingDisabled | ThinkingEnabled, Field(discriminator="type")] | None = Field(
        None, description="enabled: its budget_tokens bound the thinking (then </think> is forced); whether the "
                          "model thinks is its chat template's")

    def tokenize_request(self) -> TokenizeChat:
        """The chat's tokenization a Messages request of these fields would prefill."""
        # (a thinking budget bounds the reply, not its prompt)
        chat = MessagesRequest.model_validate({**dict(self), "max_tokens": 1, "thinking": None}).chat_request()
        return TokenizeChat(messages=chat.messages, tools=chat.tools)


class TokensCount(BaseModel):
    input_tokens: int


class MessagesRequest(CountTokensRequest):
    max_tokens: JsonInt = Field(json_schema_extra=RANGES["max_tokens"])
    temperature: float | None = Field(None, json_schema_extra=RANGES["temperature"])
    top_p: float | None = Field(None, json_schema_extra=RANGES["top_p"])
    top_k: JsonInt | None = Field(None, json_schema_extra={**RANGES["top_k"], "minimum": 0})
    stop_sequences: list[StopString] | None = None
    stream: bool = False
    metadata: dict[str, Any] | None = Field(None, description="accepted, changes no reply")
    # prompt caching is automatic here (prefix caching): the hint changes nothing
    cache_control: dict[str, Any] | None = None
    service_tier: Literal["auto", "standard_only"] | None = None

    def chat_request(self) -> ChatRequest:
        """The chat request this one runs as (its refusals named by this body's fields)."""
        fields = {"model": self.model, "messages": self._turns(), "max_tokens": self.max_tokens, "stream": self.stream}
        if self.stream:
            fields["stream_options"] = {"include_usage": True}
        for name in ("temperature", "top_p", "top_k"):
            if getattr(self, name) is not None:
                fields[name] = getattr(self, name)
        if self.stop_sequences:
            fields["stop"] = self.stop_sequences
        if isinstance(self.thinking, ThinkingEnabled):
            if self.thinking.budget_tokens >= self.max_tokens:  # Anthropic's rule
                raise RequestError("thinking.budget_tokens", "thinking.budget_tokens must be less than max_tokens")
            fields["thinking_token_budget"] = self.thinking.budget_tokens
        choice = self.tool_choice
        if self.tools and not (choice is not None and choice.type == "none"):
            fields["tools"] = [{"type": "function", "function": {
                "name": tool.name, "parameters": tool.input_schema,
                **({"description": tool.description} if tool.description is not None else {})}}
                for tool in self.tools]
            if choice is not None:
                fields["tool_choice"] = ({"type": "function", "function": {"name": choice.name}}
                                         if isinstance(choice, NamedToolChoice)
                                         else "required" if choice.type == "any" else "auto")
                if choice.disable_parallel_tool_use:
                    fields["parallel_tool_calls"] = False
        try:
            return ChatRequest.model_validate(fields)
        except ValidationError as err:
            raise renamed(refusal(list(err.errors()), fields), RENAMED) from None

    def _turns(self) -> list[dict]:
        system = self.system if isinstance(self.system, str) or self.system is None else \
            "".join(block.text for block in self.system)
        turns = [{"role": "system", "content": system}] if system is not None else []
        for message in self.messages:
            if isinstance(message.content, str):
                turns.append({"role": message.role, "content": message.content})
                continue
            text = "".join(block.text for block in message.content if isinstance(block, TextBlock))
            calls = [{"id": block.id, "type": "function", "function": {"name": block.name,
                                                                       "arguments": json.dumps(block.input)}}
                     for block in message.content if isinstance(block, ToolUseBlock)]
            results = [block for block in message.content if isinstance(block, ToolResultBlock)]
            for result in results:  # a user turn's tool results answer the calls before it
                output = result.content if isinstance(result.content, str) else \
                    "".join(block.text for block in result.content)
                turns.append({"role": "tool", "tool_call_id": result.tool_use_id, "content": output})
            if text or calls or not results:
                turns.append({"role": message.role, "content": text, **({"tool_calls": calls} if calls else {})})
        return turns


def _usage(info: dict | None) -> dict:
    info = info or {}
    cached = (info.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    return {"input_tokens": info.get("prompt_tokens", 0) - cached, "cache_read_input_tokens": cached,
            "cache_creation_input_tokens": 0, "output_tokens": info.get("completion_tokens", 0)}


class MessageRender:
    """One message's identity, and its content blocks built from the chat reply it runs as."""

    def __init__(self, request: MessagesRequest, model: str):
        self.request, self.model = request, model
        self.id = "msg_" + uuid.uuid4().hex

    @staticmethod
    def _stop(finish: str | None, matched: str | int | None) -> tuple[str | None, str | None]:
        """(stop_reason, stop_sequence) of a chat finish and what ended it (vLLM's stop_reason: a stop
        string, else the end of the turn)."""
        if finish == "stop" and isinstance(matched, str):
            return "stop_sequence", matched
        return STOP_REASONS.get(finish or "", finish), None

    def whole(self, chat: dict) -> dict:
        choice = chat["choices"][0]
        message = choice["message"]
        content = []
        if message.get("reasoning_content"):
            content.append({"type": "thinking", "thinking": message["reasoning_content"], "signature": ""})
        if message.get("content"):
            content.append({"type": "text", "text": message["content"]})
        for call in message.get("tool_calls") or ():
            content.append({"type": "tool_use", "id": call["id"], "name": call["function"]["name"],
                            "input": json.loads(call["function"]["arguments"] or "{}")})
        reason, sequence = self._stop(choice["finish_reason"], choice.get("stop_reason"))
        return {"id": self.id, "type": "message", "role": "assistant", "model": self.model, "content": content,
                "stop_reason": reason, "stop_sequence": sequence, "usage": _usage(chat.get("usage"))}

    def events(self, chunks: AsyncIterator[dict | str]) -> AsyncIterator[dict]:
        """A chat stream's chunks -> the Messages stream's events."""
        stream = _EventStream(self)
        start = stream.event("message_start", message={
            "id": self.id, "type": "message", "role": "assistant", "model": self.model, "content": [],
            "stop_reason": None, "stop_sequence": None, "usage": _usage(None)})
        return translated(chunks, [start], stream.feed)


class _EventStream:
    """The open content block, as the chat chunks come (each tool call whole)."""

    def __init__(self, render: MessageRender):
        self.render = render
        self.index = -1  # the open block's; blocks are numbered as they open
        self.open: str | None = None  # "thinking" or "text" while its text grows
        self.finish: str | None = None
        self.matched: str | int | None = None  # the stop string or token that ended it
        self.usage: dict | None = None

    @staticmethod
    def event(kind: str, **fields) -> dict:
        return {"event": kind, "data": json.dumps({"type": kind, **fields})}

    def feed(self, chunk: dict | str) -> list[dict]:
        if chunk == "[DONE]":
            reason, sequence = self.render._stop(self.finish, self.matched)
            usage = _usage(self.usage)
            ended = {"stop_reason": reason, "stop_sequence": sequence}
            return self._close() + [self.event("message_delta", delta=ended,
                                               usage={"output_tokens": usage["output_tokens"]}),
                                    self.event("message_stop")]
        if "error" in chunk:  # mid-stream: the status line has gone already
            error = chunk["error"]
            kind = "api_error" if error["type"] == "server_error" else error["type"]  # Anthropic's name for a 5xx
            return [self.event("error", error={"type": kind, "message": error["message"]})]
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        events = []
        for choice in chunk["choices"]:
            delta = choice["delta"]
            if delta.get("reasoning_content"):
                events += self._text("thinking", delta["reasoning_content"])
            if delta.get("content"):
                events += self._text("text", delta["content"])
            for call in delta.get("tool_calls") or ():
                events += self._close() + self._tool(call)
            if choice.get("finish_reason"):
                self.finish, self.matched = choice["finish_reason"], choice.get("stop_reason")
        return events

    def _text(self, kind: str, text: str) -> list[dict]:
        events = []
        if self.open != kind:
            events = self._close()
            self.open, self.index = kind, self.index + 1
            block = {"type": "thinking", "thinking": "", "signature": ""} if kind == "thinking" else \
                {"type": "text", "text": ""}
            events.append(self.event("content_block_start", index=self.index, content_block=block))
        delta = ({"type": "thinking_delta", "thinking": text} if kind == "thinking"
                 else {"type": "text_delta", "text": text})
        return events + [self.event("content_block_delta", index=self.index, delta=delta)]

    def _close(self) -> list[dict]:
        if self.open is None:
            return []
        self.open = None
        return [self.event("content_block_stop", index=self.index)]

    def _tool(self, call: dict) -> list[dict]:
        self.index += 1
        function = call["function"]
        block = {"type": "tool_use", "id": call["id"], "name": function["name"], "input": {}}
        return [self.event("content_block_start", index=self.index, content_block=block),
                self.event("content_block_delta", index=self.index,
                           delta={"type": "input_json_delta", "partial_json": function["arguments"] or "{}"}),
                self.event("content_block_stop", index=self.index)]

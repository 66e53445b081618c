"""OpenAI's Responses API (POST /v1/responses) on the chat path.

A request becomes a ChatRequest (`instructions` a system turn first, input items turns: messages,
function calls an assistant turn's tool_calls, function call outputs tool turns; function tools and
tool_choice the chat forms; `text.format` the response_format; `max_output_tokens` max_tokens) and runs
as one, so everything a chat does (tool calls parsed, reasoning apart, grammars, refusals) it does. Its
reply is written back as a Response object (`whole`) or the Responses stream's events (`events`).
A response is stored (unless `store: false`) with the conversation it ends, in the front's memory
(response_store.py): `previous_response_id` continues that conversation; a `background` one runs after
the reply (queued), followed by GET and stopped by cancel. `conversation` objects are refused.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    TypeAdapter,
    ValidationError,
    WithJsonSchema,
    create_model,
)

from dflash_trt.serve.event_streams import translated
from dflash_trt.serve.openai_models import TokenLogprob, dump
from dflash_trt.serve.protocol import ChatRequest, FunctionName, JsonInt, _Open, refusal, renamed
from dflash_trt.serve.requests import RequestError
from dflash_trt.serve.response_store import FINAL, ResponseStore, StoredResponse
from dflash_trt.serve.responses_models import (
    FunctionCallItem,
    IncompleteDetails,
    InputTokensDetails,
    MessageItem,
    OutputText,
    OutputTokensDetails,
    ReasoningItem,
    ReasoningText,
    ResponseError,
    ResponseObject,
    ResponseUsage,
    TextConfig,
    TextFormat,
)
from dflash_trt.spec.sampling import RANGES


class InputText(_Open):
    type: Literal["input_text", "output_text"]  # an earlier reply's text comes back as output_text
    text: str


class InputMessage(_Open):
    type: Literal["message"] = "message"
    role: Literal["user", "system", "developer", "assistant"]
    content: str | list[InputText]

    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(part.text for part in self.content)


class InputFunctionCall(_Open):
    """A call an earlier reply made (its output item, sent back)."""

    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str


class InputFunctionCallOutput(_Open):
    type: Literal["function_call_output"]
    call_id: str
    output: str | list[InputText]


class InputReasoning(_Open):
    """An earlier reply's reasoning, sent back: not shown to the model again (chat templates drop the
    thinking of earlier turns)."""

    type: Literal["reasoning"]


def _item_type(item: Any) -> str | None:
    return item.get("type", "message") if isinstance(item, dict) else getattr(item, "type", None)


InputItem = Annotated[
    Annotated[InputMessage, Tag("message")] | Annotated[InputFunctionCall, Tag("function_call")]
    | Annotated[InputFunctionCallOutput, Tag("function_call_output")] | Annotated[InputReasoning, Tag("reasoning")],
    Discriminator(_item_type)]


class FunctionTool(_Open):
    type: Literal["function"]
    name: FunctionName
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class NamedFunction(_Open):
    type: Literal["function"]
    name: str


class FormatRequest(_Open):
    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None
    description: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None


class TextRequest(_Open):
    format: FormatRequest | None = None
    verbosity: Literal["medium"] | None = Field(None, description="other verbosities are not supported")


# The body's fields that hosted objects would need -> what the refusal says
UNSTORED = {"conversation": "conversation objects are not kept here: continue with previous_response_id, or send "
                            "the conversation as input items",
            "prompt": "stored prompt templates are not supported: send instructions and input",
            "max_tool_calls": "max_tool_calls is not supported: leave it out"}
# A chat request's fields -> this body's, for refusals the chat path words
RENAMED = {"messages": "input", "max_tokens": "max_output_tokens", "response_format": "text.format",
           "logprobs": "include", "reasoning_effort": "reasoning.effort"}
EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh")  # OpenAI's, as the chat's reasoning_effort
LOGPROBS = "message.output_text.logprobs"


def _refused(name: str) -> Any:
    """A field this server refuses unless null (UNSTORED says why), as the schema says."""
    return Annotated[Any, WithJsonSchema({"type": "null", "description": UNSTORED[name]})]


# vLLM's sampling extensions a Responses request may carry, typed and checked as a chat request's
PASSED = ("top_k", "seed", "min_p", "stop", "stop_token_ids", "ignore_eos", "min_tokens", "presence_penalty",
          "frequency_penalty", "repetition_penalty", "logit_bias", "chat_template_kwargs", "priority")


class _ResponsesBody(BaseModel):
    """OpenAI's fields; ResponsesRequest adds PASSED. Fields it does not name are refused (as OpenAI's)."""

    model_config = ConfigDict(extra="forbid", strict=True)
    model: str
    input: str | Annotated[list[InputItem], Field(min_length=1)]
    instructions: str | None = None
    max_output_tokens: JsonInt | None = Field(None, json_schema_extra=RANGES["max_tokens"])
    temperature: float | None = Field(None, json_schema_extra=RANGES["temperature"])
    top_p: float | None = Field(None, json_schema_extra=RANGES["top_p"])
    top_logprobs: JsonInt | None = Field(None, json_schema_extra=RANGES["logprobs"])
    include: list[Literal["message.output_text.logprobs", "reasoning.encrypted_content"]] | None = Field(
        None, description="reasoning.encrypted_content: reasoning is never encrypted here (its text is in the item)")
    stream: bool = False
    tools: list[FunctionTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedFunction | None = None
    parallel_tool_calls: bool | None = None
    text: TextRequest | None = None
    metadata: dict[str, str] | None = None
    store: bool | None = Field(None, description="keep the response for previous_response_id and GET "
                                                 "/v1/responses/{id} (default true, as OpenAI's; in the server's "
                                                 "memory, the most recent serve --responses-store kept)")
    background: bool | None = Field(None, description="run after the reply: the response comes back queued; GET "
                                                      "/v1/responses/{id} follows it, POST .../cancel stops it "
                                                      "(stored, never streamed here)")
    truncation: Literal["disabled"] | None = None
    service_tier: Literal["auto", "default"] | None = None
    reasoning: Annotated[dict[str, Any], WithJsonSchema({"type": "object", "properties": {"effort": {
        "enum": [*EFFORTS, None]}}, "additionalProperties": {"type": "null"}})] | None = Field(
        None, description="effort: the chat template's reasoning_effort (a template that reads none refuses it); "
                          "whether the model thinks is the template's")
    previous_response_id: str | None = Field(None, description="a stored response whose conversation this one "
                                                               "continues (its instructions are not carried over)")
    conversation: _refused("conversation") = None
    prompt: _refused("prompt") = None
    max_tool_calls: _refused("max_tool_calls") = None
    # identifiers and hints that change no reply
    user: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    stream_options: dict[str, Any] | None = None

    def check(self) -> None:
        """The fields a stateless server cannot honour, refused with the field's name."""
        for name, why in UNSTORED.items():
            if getattr(self, name) is not None:
                raise RequestError(name, why)
        if self.reasoning and any(value is not None for name, value in self.reasoning.items() if name != "effort"):
            raise RequestError("reasoning", "this server writes no reasoning summary: reasoning takes an effort "
                                            "only (the chat template's reasoning_effort)")
        if self.top_logprobs is not None and LOGPROBS not in (self.include or ()):
            raise RequestError("top_logprobs", f"top_logprobs needs include [\"{LOGPROBS}\"]")
        if self.background and self.store is False:
            raise RequestError("background", "a background response is followed through the store: leave store "
                                             "out or send it true")
        if self.background and self.stream:
            raise RequestError("background", "a background response is not streamed here: follow it with GET "
                                             "/v1/responses/{id}, or leave background out to stream")

    def chat_request(self, earlier: list[dict] = ()) -> ChatRequest:
        """The chat request this one runs as, after the `earlier` conversation's items (a stored response's)
        (its refusals named by this body's fields)."""
        self.check()
        fields = {name: getattr(self, name) for name in PASSED if getattr(self, name) is not None}
        fields.update(model=self.model, messages=self._turns(earlier), stream=self.stream)
        if self.stream:
            fields["stream_options"] = {"include_usage": True}
        for mine, theirs in (("max_output_tokens", "max_tokens"), ("temperature", "temperature"),
                             ("top_p", "top_p"), ("parallel_tool_calls", "parallel_tool_calls")):
            if getattr(self, mine) is not None:
                fields[theirs] = getattr(self, mine)
        if LOGPROBS in (self.include or ()):
            fields.update(logprobs=True, top_logprobs=self.top_logprobs or 0)
        if (self.reasoning or {}).get("effort") is not None:
            fields["reasoning_effort"] = self.reasoning["effort"]
        if self.tools is not None:
            fields["tools"] = [{"type": "function", "function": tool.model_dump(exclude={"type"}, exclude_none=True)}
                               for tool in self.tools]
        if isinstance(self.tool_choice, NamedFunction):
            fields["tool_choice"] = {"type": "function", "function": {"name": self.tool_choice.name}}
        elif self.tool_choice is not None:
            fields["tool_choice"] = self.tool_choice
        form = self.text.format if self.text is not None else None
        if form is not None and form.type == "json_schema":
            fields["response_format"] = {"type": "json_schema", "json_schema": form.model_dump(
                by_alias=True, exclude={"type"}, exclude_none=True)}
        elif form is not None:
            fields["response_format"] = {"type": form.type}
        try:
            return ChatRequest.model_validate(fields)
        except ValidationError as err:
            raise renamed(refusal(list(err.errors()), fields), RENAMED) from None

    def input_items(self) -> list[dict]:
        """The input as items (a text is a user message), as a stored conversation keeps them."""
        items = [InputMessage(role="user", content=self.input)] if isinstance(self.input, str) else self.input
        return [item.model_dump(mode="json", exclude_none=True) for item in items]

    def _turns(self, earlier: list[dict]) -> list[dict]:
        turns = [{"role": "system", "content": self.instructions}] if self.instructions is not None else []
        for item in _ITEMS.validate_python([*earlier, *self.input_items()]):
            if isinstance(item, InputMessage):
                turns.append({"role": item.role, "content": item.text()})
            elif isinstance(item, InputFunctionCall):
                call = {"id": item.call_id, "type": "function",
                        "function": {"name": item.name, "arguments": item.arguments}}
                if turns and turns[-1]["role"] == "assistant":  # the calls of the reply just before
                    turns[-1].setdefault("tool_calls", []).append(call)
                else:
                    turns.append({"role": "assistant", "content": "", "tool_calls": [call]})
            elif isinstance(item, InputFunctionCallOutput):
                output = item.output if isinstance(item.output, str) else "".join(p.text for p in item.output)
                turns.append({"role": "tool", "tool_call_id": item.call_id, "content": output})
        if not turns:
            raise RequestError("input", "input holds nothing the model reads (earlier reasoning is not shown to it): "
                                        "send a message")
        return turns

    def echoed(self) -> dict:
        """What a response repeats of its request."""
        tool_choice = self.tool_choice.model_dump() if isinstance(self.tool_choice, NamedFunction) else self.tool_choice
        form = self.text.format.type if self.text is not None and self.text.format is not None else "text"
        return {"instructions": self.instructions, "max_output_tokens": self.max_output_tokens,
                "temperature": self.temperature, "top_p": self.top_p,
                "parallel_tool_calls": self.parallel_tool_calls is not False, "tool_choice": tool_choice or "auto",
                "tools": [tool.model_dump(exclude_none=True) for tool in self.tools or ()],
                "text": TextConfig(format=TextFormat(type=form)), "metadata": self.metadata or {}}


_ITEMS = TypeAdapter(list[InputItem])

ResponsesRequest = create_model("ResponsesRequest", __base__=_ResponsesBody, **{
    name: (ChatRequest.model_fields[name].annotation, ChatRequest.model_fields[name]) for name in PASSED})


def _hex() -> str:
    return uuid.uuid4().hex


def _usage(info: dict | None) -> ResponseUsage | None:
    """A chat reply's usage -> the Responses form."""
    if info is None:
        return None
    details = info.get("completion_tokens_details") or {}
    return ResponseUsage(input_tokens=info["prompt_tokens"], output_tokens=info["completion_tokens"],
                         total_tokens=info["total_tokens"],
                         input_tokens_details=InputTokensDetails(
                             cached_tokens=(info.get("prompt_tokens_details") or {}).get("cached_tokens", 0)),
                         output_tokens_details=OutputTokensDetails(reasoning_tokens=details.get("reasoning_tokens", 0)),
                         acceptance_lengths=info.get("acceptance_lengths", []))


ITEM_PREFIXES = {"message": "msg_", "function_call": "fc_", "function_call_output": "fco_", "reasoning": "rs_"}


def _listed(item: dict) -> dict:
    """An input item as input_items lists it: with an id (its own, or a new one) and a message's text as a
    content part."""
    listed = {"id": ITEM_PREFIXES[item["type"]] + _hex(), **item}
    if item["type"] == "message" and isinstance(item["content"], str):
        part = "output_text" if item["role"] == "assistant" else "input_text"
        listed["content"] = [{"type": part, "text": item["content"]}]
    return listed


class ResponseRender:
    """One response's identity and its output, built from the chat reply it runs as."""

    def __init__(self, request: ResponsesRequest, model: str, store: ResponseStore | None = None,
                 earlier: list[dict] = ()):
        """`store`: where the finished response is kept (None or `store: false`: nowhere); `earlier`: the
        conversation it continues (previous_response_id's)."""
        self.request, self.model = request, model
        self.store = store if request.store is not False and store is not None and store.capacity > 0 else None
        self.earlier = earlier
        self.inputs = [_listed(item) for item in request.input_items()] if self.store is not None else []
        self.id = "resp_" + _hex()
        self.created_at = int(time.time())
        self.logprobs = LOGPROBS in (request.include or ())

    def _object(self, status: str, output: list, usage: dict | None = None, finish: str | None = None,
                error: ResponseError | None = None) -> dict:
        """The Response object as it stands; stored once it has ended (FINAL)."""
        incomplete = IncompleteDetails(reason="max_output_tokens") if finish == "length" else None
        body = dump(ResponseObject(id=self.id, object="response", created_at=self.created_at, status=status,
                                   background=bool(self.request.background), model=self.model, output=output,
                                   usage=_usage(usage), error=error, incomplete_details=incomplete,
                                   store=self.store is not None, previous_response_id=self.request.previous_response_id,
                                   **self.request.echoed()))
        if self.store is not None and status in FINAL:
            self.store.put(self.id, StoredResponse(body, [*self.earlier, *self.inputs, *body["output"]], self.inputs))
        return body

    def queued(self, cancel) -> dict:
        """A background response, stored as queued until it runs; `cancel` stops it (and waits)."""
        body = self._object("queued", [])
        self.store.put(self.id, StoredResponse(body, [], self.inputs, cancel))
        return body

    def running(self, cancel) -> None:
        self.store.put(self.id, StoredResponse(self._object("in_progress", []), [], self.inputs, cancel))

    def failed(self, code: str, message: str) -> dict:
        """A response that a refusal (background ones) or the inference server's failure ended."""
        return self._object("failed", [], error=ResponseError(code=code, message=message))

    def cancelled(self) -> dict:
        return self._object("cancelled", [])

    def whole(self, chat: dict) -> dict:
        """A chat completion (one choice) -> the Response object."""
        choice = chat["choices"][0]
        message, finish = choice["message"], choice["finish_reason"]
        status = "incomplete" if finish == "length" else "completed"
        output = []
        calls = message.get("tool_calls") or []
        if message.get("reasoning_content"):  # cut short only if nothing came after it
            thought = "incomplete" if finish == "length" and not message.get("content") and not calls else "completed"
            output.append(ReasoningItem(id="rs_" + _hex(), type="reasoning", status=thought,
                                        content=[ReasoningText(type="reasoning_text",
                                                               text=message["reasoning_content"])]))
        if message.get("content") or not calls:
            logprobs = (choice.get("logprobs") or {}).get("content") or [] if self.logprobs else None
            output.append(MessageItem(id="msg_" + _hex(), type="message", status=status, role="assistant",
                                      content=[OutputText(type="output_text", text=message.get("content") or "",
                                                          **({"logprobs": logprobs} if self.logprobs else {}))]))
        for call in calls:
            output.append(FunctionCallItem(id="fc_" + _hex(), type="function_call", status="completed",
                                           call_id=call["id"], name=call["function"]["name"],
                                           arguments=call["function"]["arguments"]))
        return self._object(status, output, chat.get("usage"), finish)

    def events(self, chunks: AsyncIterator[dict | str]) -> AsyncIterator[dict]:
        """A chat stream's chunks -> the Responses stream's Server-Sent Events."""
        stream = _EventStream(self)
        return translated(chunks, stream.start(), stream.feed)


class _EventStream:
    """The open output item and everything sent, as the chat chunks come (each a whole tool call)."""

    def __init__(self, render: ResponseRender):
        self.render = render
        self.sequence = 0
        self.output: list = []  # the items, completed ones and the open one
        self.open: str | None = None  # "reasoning" or "message" while its text grows
        self.finish: str | None = None
        self.usage: dict | None = None
        self.entries: list = []  # logprobs of tokens no text was sent for yet (held bytes, reasoning)

    def _event(self, kind: str, **fields) -> dict:
        data = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return {"event": kind, "data": json.dumps(data)}

    def start(self) -> list[dict]:
        head = self.render._object("in_progress", [])
        return [self._event("response.created", response=head), self._event("response.in_progress", response=head)]

    def feed(self, chunk: dict | str) -> list[dict]:
        if chunk == "[DONE]":
            return self._close() + self._end()
        if "error" in chunk:  # mid-stream: the status line has gone already
            error = chunk["error"]
            if error["type"] == "server_error":  # the engine failed it (NaN logits, a failed step): stored so
                return [self._event("response.failed", response=self.render.failed("server_error", error["message"]))]
            return [self._event("error", code=error.get("code") or error["type"], message=error["message"],
                                param=error.get("param"))]
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        events = []
        for choice in chunk["choices"]:
            delta = choice["delta"]
            # a chunk's logprobs are its tokens' (the reply's, reasoning included, as the whole form's):
            # they go with the next output text
            self.entries += (choice.get("logprobs") or {}).get("content") or []
            if delta.get("reasoning_content"):
                events += self._text("reasoning", delta["reasoning_content"])
            if delta.get("content") or (self.entries and not delta.get("reasoning_content")):
                events += self._text("message", delta.get("content") or "", self.entries)
                self.entries = []
            for call in delta.get("tool_calls") or ():
                events += self._close() + self._call(call)
            if choice.get("finish_reason"):
                self.finish = choice["finish_reason"]
        return events

    def _text(self, kind: str, text: str, entries: list | None = None) -> list[dict]:
        events = [] if self.open == kind else self._close() + self._open(kind)
        item = self.output[-1]
        at = {"item_id": item.id, "output_index": len(self.output) - 1, "content_index": 0}
        item.content[0].text += text
        if kind == "reasoning":
            return events + [self._event("response.reasoning_text.delta", **at, delta=text)]
        logprobs = entries if self.render.logprobs else []
        if self.render.logprobs:
            item.content[0].logprobs += [TokenLogprob.model_validate(entry) for entry in entries]
        return events + [self._event("response.output_text.delta", **at, delta=text, logprobs=logprobs)]

    def _open(self, kind: str) -> list[dict]:
        self.open = kind
        if kind == "reasoning":
            item, part = ReasoningItem(id="rs_" + _hex(), type="reasoning", status="in_progress", content=[]), \
                ReasoningText(type="reasoning_text", text="")
        else:
            item = MessageItem(id="msg_" + _hex(), type="message", status="in_progress", role="assistant", content=[])
            part = OutputText(type="output_text", text="", **({"logprobs": []} if self.render.logprobs else {}))
        self.output.append(item)
        index = len(self.output) - 1
        events = [self._event("response.output_item.added", output_index=index, item=dump(item))]
        item.content.append(part)
        return events + [self._event("response.content_part.added", item_id=item.id, output_index=index,
                                     content_index=0, part=dump(part))]

    def _close(self) -> list[dict]:
        """Finish the item whose text was growing, if any."""
        if self.open is None:
            return []
        item, index = self.output[-1], len(self.output) - 1
        part = item.content[0]
        done = "response.reasoning_text.done" if self.open == "reasoning" else "response.output_text.done"
        self.open = None
        item.status = "incomplete" if self.finish == "length" else "completed"
        at = {"item_id": item.id, "output_index": index, "content_index": 0}
        return [self._event(done, **at, text=part.text),
                self._event("response.content_part.done", **at, part=dump(part)),
                self._event("response.output_item.done", output_index=index, item=dump(item))]

    def _call(self, call: dict) -> list[dict]:
        function = call["function"]
        item = FunctionCallItem(id="fc_" + _hex(), type="function_call", status="in_progress", call_id=call["id"],
                                name=function["name"], arguments="")
        self.output.append(item)
        index = len(self.output) - 1
        events = [self._event("response.output_item.added", output_index=index, item=dump(item))]
        item.arguments, item.status = function["arguments"], "completed"
        at = {"item_id": item.id, "output_index": index}
        return events + [self._event("response.function_call_arguments.delta", **at, delta=item.arguments),
                         self._event("response.function_call_arguments.done", **at, arguments=item.arguments),
                         self._event("response.output_item.done", output_index=index, item=dump(item))]

    def _end(self) -> list[dict]:
        events = [] if self.output else self._open("message") + self._close()  # an empty reply is still a message
        status = "incomplete" if self.finish == "length" else "completed"
        final = self.render._object(status, self.output, self.usage, self.finish)
        return events + [self._event("response.incomplete" if status == "incomplete" else "response.completed",
                                     response=final)]

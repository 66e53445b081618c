"""OpenAI request bodies: pydantic models, parsed strictly, every refusal naming its field.

Fields OpenAI clients send that change nothing here (user, metadata, ...) are accepted and ignored;
fields that would change the reply in a way we cannot honour (a completion's suffix, the deprecated
functions) are refused unless they hold the value that changes nothing (frameworks send the defaults
explicitly), never silently dropped.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StringConstraints,
    WithJsonSchema,
    model_validator,
)

from dflash_trt.models.chat import ENDINGS
from dflash_trt.serve.reply_text import forced_schema
from dflash_trt.serve.requests import RequestError, beam_search_params, sampling_params, template_kwargs
from dflash_trt.spec.sampling import RANGES


class _Open(BaseModel):
    """A part of a request body: fields it does not name are accepted (clients send more than we read)."""

    model_config = ConfigDict(extra="allow")


class ContentPart(_Open):
    type: Literal["text"]
    text: str


class FunctionCall(_Open):
    name: str
    arguments: str = Field(description="the arguments as a JSON object's text")


class MessageToolCall(_Open):
    """A tool call of an earlier assistant turn, as this server (or OpenAI) returned it."""

    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(_Open):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    tool_calls: list[MessageToolCall] | None = None  # an assistant turn's
    tool_call_id: str | None = None  # a tool turn's: the call it answers
    name: str | None = None

    def text(self) -> str:
        if self.content is None or isinstance(self.content, str):
            return self.content or ""
        return "".join(part.text for part in self.content)

    def for_template(self) -> dict:
        """The turn as chat templates read it: a call's arguments as an object (Qwen's and Llama's
        templates print them as JSON, or iterate over them)."""
        turn = {"role": self.role, "content": self.text()}
        if self.tool_calls:
            turn["tool_calls"] = [{"id": call.id, "type": "function", "function": {
                "name": call.function.name, "arguments": _arguments(call.function.arguments)}}
                for call in self.tool_calls]
        for key in ("tool_call_id", "name"):
            if getattr(self, key) is not None:
                turn[key] = getattr(self, key)
        return turn


def _arguments(text: str) -> dict | str:
    """A call's arguments as chat templates read them: an object when the text is one ("" is none),
    else the text itself (a template may print it as it is)."""
    if not text.strip():
        return {}
    try:
        value = json.loads(text)
    except ValueError:
        return text
    return value if isinstance(value, dict) else text


# OpenAI's function names
FunctionName = Annotated[str, StringConstraints(pattern=r"^[a-zA-Z0-9_-]{1,64}$")]


class FunctionDefinition(_Open):
    name: FunctionName
    description: str | None = None
    parameters: dict[str, Any] | None = Field(None, description="the arguments' JSON schema")
    strict: bool | None = Field(None, description="true needs tool_choice 'required' or this function named "
                                                  "(their arguments are held to the schema while decoding)")


class NamedFunction(_Open):
    name: str


class NamedToolChoice(_Open):
    type: Literal["function"]
    function: NamedFunction


class Tool(_Open):
    type: Literal["function"]
    function: FunctionDefinition


class StreamOptions(_Open):
    include_usage: bool = False
    # vLLM's: with include_usage, every chunk also carries its choice's usage so far
    continuous_usage_stats: bool = False


def _integral(value: Any) -> Any:
    """JSON has one number type: 16.0 and 1.6e1 are the integer 16 (as JSON Schema's "integer" says);
    any other float stays a float, which an integer field refuses."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


# an integer field of a request body (strict otherwise: "16" or true is not an integer)
JsonInt = Annotated[int, BeforeValidator(_integral)]
# a token id (the vocabulary's bound is the model's, checked by the engine)
TokenId = Annotated[JsonInt, Field(ge=0), WithJsonSchema({"type": "integer", "minimum": 0})]
# a stop string: SamplingParams refuses empty ones; the schema says so
StopString = Annotated[str, WithJsonSchema({"type": "string", "minLength": 1})]


# Each field this server does not implement -> the values that change nothing (frameworks send them
# explicitly): OpenAI's, then vLLM's and SGLang's extensions that change the distribution or constrain
# the output. Any other value is refused (`_Sampling.check_unsupported`).
NO_OP_VALUES = {
    "functions": ([],), "function_call": ("none",), "suffix": ("",),
    "prediction": (), "web_search_options": (), "modalities": (["text"],), "audio": (), "verbosity": ("medium",),
    # vLLM's extensions beyond SamplingParams
    "spaces_between_special_tokens": (True,),
    "logits_processors": (),
    "mm_processor_kwargs": (), "kv_transfer_params": (),
    "vllm_xargs": (),
    # SGLang's
    "stop_regex": (), "lora_path": (), "custom_logit_processor": (),
    "return_hidden_states": (False,),
}


MAX_CHOICES = 64  # n: each choice takes a KV slot of its own


def _json_type(value: Any) -> str:
    return {bool: "boolean", int: "number", float: "number", str: "string", list: "array"}[type(value)]


def _no_op(name: str) -> Any:
    """The type of the unimplemented field `name`: its no-op values or null, as the schema says (typed:
    JSON's true is not 1)."""
    return Annotated[Any, WithJsonSchema({
        "anyOf": [*({"type": _json_type(v), "const": v} for v in NO_OP_VALUES[name]), {"type": "null"}],
        "description": "not supported by this server: accepted only as a value that changes nothing"})]


def only(value: bool) -> Any:
    """A boolean field that takes `value` alone, strictly (pydantic's Literal[False] takes 0), as the schema
    says."""
    def check(given: bool) -> bool:
        if given is not value:
            raise ValueError(f"Input should be {json.dumps(value)}")
        return given

    return Annotated[bool, Field(strict=True), AfterValidator(check), WithJsonSchema({"type": "boolean", "const": value})]


def _same(value: Any, expected: Any) -> bool:
    """JSON equality: 0 and 0.0 are one number; false is not 0."""
    if isinstance(value, bool) or isinstance(expected, bool):
        return value is expected
    return value == expected


def _has_lone_surrogate(value: Any) -> bool:
    if isinstance(value, str):
        return any("\ud800" <= ch <= "\udfff" for ch in value)
    if isinstance(value, dict):
        return any(_has_lone_surrogate(k) or _has_lone_surrogate(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_has_lone_surrogate(v) for v in value)
    return False


class JsonSchema(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)
    name: str | None = None
    description: str | None = None
    schema_: dict[str, Any] = Field(alias="schema", description="the reply's JSON schema")
    strict: bool | None = Field(None, description="the reply always follows the schema here (the grammar is "
                                                  "enforced while decoding)")


class ResponseFormat(_Open):
    """OpenAI's: text, any JSON object, or JSON following a schema (enforced while decoding)."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchema | None = None


# Where a request may ask for structured output -> SamplingParams.structured_output's field it sets:
# OpenAI's response_format, vLLM's structured_outputs (all its fields) and its older guided_* fields.
# SGLang's ebnf is a grammar too (GBNF).
GUIDED = {"guided_json": "json", "guided_regex": "regex", "guided_choice": "choice", "guided_grammar": "grammar",
          "ebnf": "grammar"}


# OpenAI's: token ids (as strings, JSON's keys) -> a bias added to their logits
LogitBias = Annotated[dict[Annotated[str, StringConstraints(pattern=r"^(0|[1-9][0-9]*)$")],
                           Annotated[float, Field(ge=-100, le=100)]],
                      WithJsonSchema({"type": "object", "additionalProperties": False, "patternProperties": {
                          "^(0|[1-9][0-9]*)$": {"type": "number", **RANGES["logit_bias"]}}})]


class _Sampling(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)
    model: str
    # Types only: their values are checked by SamplingParams itself (`check_sampling`), as everywhere;
    # the schema publishes its ranges (top_k -1 is "none", mapped to 0 in requests.sampling_params).
    max_tokens: JsonInt | None = Field(None, json_schema_extra=RANGES["max_tokens"])
    temperature: float | None = Field(None, json_schema_extra=RANGES["temperature"])
    top_p: float | None = Field(None, json_schema_extra=RANGES["top_p"])
    top_k: JsonInt | None = Field(None, json_schema_extra={**RANGES["top_k"], "minimum": -1})
    # SamplingParams takes [0, 2**64); the schema promises JSON's exact integers, which clients can send
    seed: JsonInt | None = Field(None, json_schema_extra={"minimum": 0, "maximum": 2**53 - 1})
    stop: StopString | list[StopString] | None = None
    n: JsonInt = Field(1, ge=1, le=MAX_CHOICES, description="choices: each a request of its own in the engine; "
                                                             "choice i samples with seed + i")
    stream: bool = False
    stream_options: StreamOptions | None = None
    # SGLang's extension, which the DFlash authors' benchmark client sends: the reply then carries
    # `meta_info` with the verify steps and the mean acceptance length
    return_meta_info: bool = False
    # vLLM's and SGLang's sampling extensions that SamplingParams has (benchmark clients send ignore_eos
    # for replies of a fixed length)
    ignore_eos: bool | None = None
    stop_token_ids: list[JsonInt] | None = None
    # OpenAI's penalties and vLLM's repetition_penalty (SamplingParams: on the raw logits, greedy too)
    presence_penalty: float | None = Field(None, json_schema_extra=RANGES["presence_penalty"])
    frequency_penalty: float | None = Field(None, json_schema_extra=RANGES["frequency_penalty"])
    repetition_penalty: float | None = Field(None, json_schema_extra=RANGES["repetition_penalty"])
    logit_bias: LogitBias | None = None
    min_tokens: JsonInt | None = Field(None, json_schema_extra=RANGES["min_tokens"])  # vLLM's
    min_p: float | None = Field(None, json_schema_extra=RANGES["min_p"])  # vLLM's
    # structured output (spec/structured.py), at most one of these
    response_format: ResponseFormat | None = None
    structured_outputs: dict[str, Any] | None = Field(None, description="vLLM's: one of json (a schema), regex, "
                                                                        "choice, grammar (Lark or GBNF), json_object; "
                                                                        "whitespace_pattern with json")
    guided_json: dict[str, Any] | Annotated[str, StringConstraints(min_length=1)] | None = None
    guided_regex: Annotated[str, StringConstraints(min_length=1)] | None = None
    guided_choice: Annotated[list[Annotated[str, StringConstraints(min_length=1)]], Field(min_length=1)] | None = None
    guided_grammar: Annotated[str, StringConstraints(min_length=1)] | None = Field(None, description="Lark or GBNF")
    ebnf: Annotated[str, StringConstraints(min_length=1)] | None = Field(None, description="SGLang's: a GBNF grammar")
    guided_whitespace_pattern: Annotated[str, StringConstraints(min_length=1)] | None = Field(
        None, description="vLLM's: with JSON output, the whitespace allowed between its tokens (a regex)")
    # vLLM's: each prompt token's log-probability (after the first) and the n most probable tokens' there
    prompt_logprobs: JsonInt | None = Field(None, json_schema_extra=RANGES["prompt_logprobs"])
    include_stop_str_in_output: bool | None = None  # vLLM's: the text keeps the stop string that ended it
    no_stop_trim: bool | None = None  # SGLang's name for it
    skip_special_tokens: bool | None = None  # vLLM's: false keeps special tokens in the text
    # vLLM's: the only tokens that may come, and words the reply may not hold
    allowed_token_ids: Annotated[list[TokenId], Field(min_length=1)] | None = None
    bad_words: list[Annotated[str, StringConstraints(pattern=r"\S")]] | None = None
    # vLLM's: the reply carries the prompt's and each choice's token ids (streamed: each chunk its new ones)
    return_token_ids: bool | None = None
    # vLLM's: the prompt's last n tokens only
    truncate_prompt_tokens: JsonInt | None = Field(None, json_schema_extra=RANGES["truncate_prompt_tokens"])
    # vLLM's: at most this many tokens inside a think block, then "</think>" is forced
    thinking_token_budget: JsonInt | None = Field(None, json_schema_extra=RANGES["thinking_token_budget"])
    num_speculative_tokens: JsonInt | None = Field(
        None, json_schema_extra=RANGES["num_speculative_tokens"],
        description="at most this many drafts a step verifies for this request (0: plain decoding; default: as "
                    "many as the server's block allows); a greedy reply is the same whatever k")
    # JSON's exact integers (the engine takes int64)
    priority: Annotated[JsonInt, Field(ge=-(2**53 - 1), le=2**53 - 1), WithJsonSchema(
        {"type": "integer", "minimum": -(2**53 - 1), "maximum": 2**53 - 1})] | None = Field(
        None, description="vLLM's: lower is served first, preempting running requests of a higher value; other "
                          "than 0 only on a server started with --scheduling-policy priority")
    # vLLM's: logprobs name their tokens "token_id:<id>" (some are no text JSON can hold whole)
    return_tokens_as_token_ids: bool | None = None
    # vLLM's: the reply's id is chatcmpl-<it> (cmpl- for a completion); default: the X-Request-Id header's
    request_id: Annotated[str, StringConstraints(min_length=1, max_length=256)] | None = None
    # vLLM's: the request reuses prefix-cached positions only of requests with the same salt
    cache_salt: Annotated[str, StringConstraints(min_length=1)] | None = None
    # vLLM's beam search: n is its width; length_penalty weighs a sequence's length in its score
    use_beam_search: bool | None = None
    length_penalty: float | None = None
    # what this server does not implement (NO_OP_VALUES): vLLM's and SGLang's other extensions
    spaces_between_special_tokens: _no_op("spaces_between_special_tokens") = None
    logits_processors: _no_op("logits_processors") = None
    kv_transfer_params: _no_op("kv_transfer_params") = None
    vllm_xargs: _no_op("vllm_xargs") = None
    stop_regex: _no_op("stop_regex") = None
    lora_path: _no_op("lora_path") = None
    custom_logit_processor: _no_op("custom_logit_processor") = None
    return_hidden_states: _no_op("return_hidden_states") = None

    @model_validator(mode="before")
    @classmethod
    def _text_only(cls, data: Any) -> Any:
        """JSON's \\ud800-style escapes decode to lone surrogates, which are not text: refused here, before
        they could reach the tokenizer or a reply."""
        if _has_lone_surrogate(data):
            raise ValueError("a string holds a lone UTF-16 surrogate escape (\\ud800-\\udfff), which is not text")
        return data

    def logprob_count(self) -> int | None:
        """How many top tokens' log-probabilities each output token carries (None: no logprobs)."""
        return None

    def flags(self) -> dict:
        """The Triton inputs beside the prompt and its sampling parameters that this body sets."""
        # a chunk's usage so far counts its prompt's ids, which come with a choice's first piece
        asks_ids = self.return_token_ids or (self.stream and self.continuous_usage)
        beams = {"beam_width": self.n, "length_penalty": 1.0 if self.length_penalty is None else self.length_penalty}
        return {**({"return_token_ids": True} if asks_ids else {}),
                **({"beam_search": json.dumps(beams)} if self.use_beam_search else {}),
                **({"cache_salt": self.cache_salt} if self.cache_salt else {}),
                **({"tokens_as_ids": True} if self.return_tokens_as_token_ids else {}),
                **({} if self.priority is None else {"priority": self.priority})}

    def prompt_top(self) -> int | None:
        """How many top tokens' log-probabilities each prompt token carries (None: none asked)."""
        return self.prompt_logprobs

    def choice_count(self) -> int:
        """The choices of the reply, each a request of its own in the engine."""
        return self.n

    def structured(self) -> tuple[str, dict] | None:
        """(the field that asked, SamplingParams.structured_output's fields) or None."""
        asked = []
        if self.response_format is not None and self.response_format.type != "text":
            if self.response_format.type == "json_object":
                asked.append(("response_format", {"json_object": True}))
            elif self.response_format.json_schema is None:
                raise RequestError("response_format.json_schema", "response_format json_schema needs its json_schema")
            else:
                asked.append(("response_format", {"json": self.response_format.json_schema.schema_}))
        if self.structured_outputs is not None:
            asked.append(("structured_outputs", dict(self.structured_outputs)))
        asked += [(name, {kind: getattr(self, name)}) for name, kind in GUIDED.items() if getattr(self, name) is not None]
        if len(asked) > 1:
            raise RequestError(asked[1][0], f"{asked[1][0]} and {asked[0][0]} both ask for structured output: send one")
        if self.guided_whitespace_pattern is not None:
            if not asked or not {"json", "json_object"} & asked[0][1].keys():
                raise RequestError("guided_whitespace_pattern", "guided_whitespace_pattern spaces JSON output: it "
                                                                "needs guided_json or a JSON response_format")
            asked[0] = asked[0][0], {**asked[0][1], "whitespace_pattern": self.guided_whitespace_pattern}
        return asked[0] if asked else None

    def keeps_stop(self) -> bool | None:
        """vLLM's include_stop_str_in_output, or SGLang's no_stop_trim (the same thing)."""
        if None not in (self.no_stop_trim, self.include_stop_str_in_output) and \
                self.no_stop_trim != self.include_stop_str_in_output:
            raise RequestError("no_stop_trim", "no_stop_trim and include_stop_str_in_output say the same thing "
                                               "and here disagree: send one")
        return self.no_stop_trim if self.include_stop_str_in_output is None else self.include_stop_str_in_output

    def sampling(self, max_tokens: int | None, choice: int = 0, after: str | None = None) -> dict:
        """The Triton model's sampling_parameters (None: its default) for choice `choice` of n: seeded,
        choice i draws with seed + i, so choice 0 is the reply of the same request with n = 1."""
        seed = None if self.seed is None else self.seed + choice
        values = {"max_tokens": max_tokens, "temperature": self.temperature, "top_p": self.top_p,
                  "top_k": self.top_k, "seed": seed, "stop": self.stop, "logprobs": self.logprob_count(),
                  "ignore_eos": self.ignore_eos, "stop_token_ids": self.stop_token_ids,
                  "presence_penalty": self.presence_penalty, "frequency_penalty": self.frequency_penalty,
                  "repetition_penalty": self.repetition_penalty, "logit_bias": self.logit_bias,
                  "min_tokens": self.min_tokens, "min_p": self.min_p, "prompt_logprobs": self.prompt_top(),
                  "include_stop_str_in_output": self.keeps_stop(),
                  "skip_special_tokens": self.skip_special_tokens, "allowed_token_ids": self.allowed_token_ids,
                  "bad_words": self.bad_words, "truncate_prompt_tokens": self.truncate_prompt_tokens,
                  "thinking_token_budget": self.thinking_token_budget,
                  "num_speculative_tokens": self.num_speculative_tokens,
                  "structured_output": (self.structured() or (None, None))[1]}
        if values["structured_output"] is not None and after is not None:  # the grammar starts after it
            values["structured_output"] = {**values["structured_output"], "after": after}
        return {k: v for k, v in values.items() if v is not None}

    def check_sampling(self) -> None:
        """The fields this server does not implement, then the sampling fields through SamplingParams'
        own checks (a grammar's refusal named by the field that sent it)."""
        self.check_unsupported()
        if self.stream and self.prompt_logprobs is not None:  # as vLLM
            raise RequestError("prompt_logprobs", "prompt_logprobs are not returned in streams: leave out one of "
                                                  "stream and prompt_logprobs")
        try:
            params = sampling_params(self.sampling(self.max_tokens))
            self._check_beams(params)
        except RequestError as err:
            if err.param is None or not err.param.startswith("structured_output"):
                raise
            field = self.structured()[0]
            raise RequestError(field, f"{field}: {err.message.removeprefix('structured_output').lstrip('.: ')}") \
                from None

    def _check_beams(self, params) -> None:
        """use_beam_search: n beams over what a beam search takes of the sampling fields (the Triton
        model's own check, before it); length_penalty only with it."""
        if not self.use_beam_search:
            if self.length_penalty not in (None, 1):
                raise RequestError("length_penalty", "length_penalty weighs beam search's scores: it goes with "
                                                     "use_beam_search")
            return
        try:
            beam_search_params(params, self.n, 1.0 if self.length_penalty is None else self.length_penalty)
        except RequestError as err:
            if err.param != "beam_width":
                raise
            raise RequestError("n", f"n is the beam width with use_beam_search: {err.message}") from None

    def check_unsupported(self) -> None:
        """A field this server does not implement, holding a value that would change the reply: refused."""
        for name, values in NO_OP_VALUES.items():
            # only this body's own no-op fields: another endpoint's (a chat's tools in a completion) are
            # extras, and one it implements (a completion's echo) is typed
            field = type(self).model_fields.get(name)
            value = getattr(self, name) if field is not None and field.annotation is Any else None
            if value is None or any(_same(value, v) for v in values):
                continue
            allowed = " or ".join(json.dumps(v) for v in values)
            raise RequestError(name, f"this server does not support {name}: leave it out"
                                     + (f" or send {allowed}" if allowed else ""))

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    @property
    def continuous_usage(self) -> bool:
        return self.include_usage and self.stream_options.continuous_usage_stats


class ChatRequest(_Sampling):
    # top_logprobs (when not null) needs logprobs: true, as OpenAI's API says; the schema says so too
    model_config = ConfigDict(**_Sampling.model_config, json_schema_extra={
        "if": {"required": ["top_logprobs"], "properties": {"top_logprobs": {"type": "integer"}}},
        "then": {"required": ["logprobs"], "properties": {"logprobs": {"const": True}}}})
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: JsonInt | None = Field(None, json_schema_extra=RANGES["max_tokens"])
    # extra variables for the chat template (vLLM's and SGLang's field), e.g. {"enable_thinking": false}
    chat_template_kwargs: dict[str, Any] | None = None
    # vLLM's: how the conversation ends for the model (models/chat.py ENDINGS)
    add_generation_prompt: bool | None = Field(None, description="default true: the assistant's turn is opened")
    continue_final_message: bool | None = Field(None, description="true: the reply continues the last message "
                                                                  "(its first words given); no turn is opened")
    logprobs: bool | None = None
    top_logprobs: JsonInt | None = Field(None, json_schema_extra=RANGES["logprobs"])
    # tool calling: the tools go to the chat template, the calls the model writes come back parsed
    # (tool_calls.py); "required" or a named function would need constrained decoding
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = Field(
        None, description="default: auto with tools; 'required' and a named function hold the reply to the "
                          "calls' JSON schema while decoding")
    parallel_tool_calls: bool | None = Field(None, description="false: at most the first call is returned")
    # the deprecated forms of tools
    functions: _no_op("functions") = None
    function_call: _no_op("function_call") = None
    # OpenAI's, as vLLM and SGLang take it: a variable of the chat template (one that reads it, e.g.
    # gpt-oss's; a template that does not is refused by the Triton model, naming it)
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = None
    # OpenAI's fields that would change a reply and that this server does not implement
    prediction: _no_op("prediction") = None
    web_search_options: _no_op("web_search_options") = None
    modalities: _no_op("modalities") = None
    audio: _no_op("audio") = None
    verbosity: _no_op("verbosity") = None
    # vLLM's: a template of the request's own (on a server started with --trust-request-chat-template),
    # and documents for a template that cites them (RAG templates)
    chat_template: Annotated[str, StringConstraints(min_length=1)] | None = None
    documents: list[dict[str, str]] | None = None
    # vLLM's chat-only extension this server does not implement
    mm_processor_kwargs: _no_op("mm_processor_kwargs") = None
    echo: bool | None = Field(None, description="vLLM's: the reply's content begins with the last message's "
                                                "when that is the assistant's (continue_final_message)")

    def logprob_count(self) -> int | None:
        if self.top_logprobs is not None and not self.logprobs:
            raise RequestError("top_logprobs", "top_logprobs needs logprobs: true")
        return (self.top_logprobs or 0) if self.logprobs else None

    def forced_tool(self) -> str | None:
        """The function a tool_choice names, "required", or None when the model decides (or none is offered)."""
        if isinstance(self.tool_choice, NamedToolChoice):
            return self.tool_choice.function.name
        return "required" if self.tool_choice == "required" else None

    def structured(self) -> tuple[str, dict] | None:
        forced = self.forced_tool()
        asked = super().structured()
        if forced is None:
            return asked
        if asked is not None:
            raise RequestError(asked[0], f"{asked[0]} and tool_choice both ask for structured output: send one")
        schema = forced_schema(self.offered_tools(), forced, self.parallel_tool_calls is False)
        return "tool_choice", {"json": schema}

    def echoed(self, choice: int = 0) -> str:
        """What `echo` puts before each choice's content: the last message's text when it is the
        assistant's, the turn the reply continues ("" otherwise, or without echo)."""
        last = self.messages[-1]
        return last.text() if self.echo and last.role == "assistant" else ""

    def template_variables(self) -> dict:
        """What the chat template gets beside the turns: chat_template_kwargs and how the conversation ends."""
        endings = {name: getattr(self, name) for name in ENDINGS if getattr(self, name) is not None}
        effort = {} if self.reasoning_effort is None else {"reasoning_effort": self.reasoning_effort}
        return {**(self.chat_template_kwargs or {}), **effort, **endings}

    def check_sampling(self) -> None:
        template_kwargs(json.dumps(self.template_variables()))  # the Triton model's own check, before it
        forced = self.forced_tool()
        if forced is not None and not self.tools:
            raise RequestError("tool_choice", "tool_choice forces a call, and the request offers no tools")
        if forced not in (None, "required") and forced not in self.offered_tools():
            raise RequestError("tool_choice.function.name", f"tool_choice names '{forced}', which tools does not offer")
        strict = [i for i, tool in enumerate(self.tools or []) if tool.function.strict]
        if strict and forced is None and self.offered_tools():
            raise RequestError(f"tools[{strict[0]}].function.strict", "strict: true holds arguments to the schema, "
                               "which needs tool_choice 'required' or this function named (with 'auto' the model "
                               "writes its calls freely)")
        try:
            super().check_sampling()
        except RequestError as err:  # the chat API names the count top_logprobs
            if err.param != "logprobs":
                raise
            raise RequestError("top_logprobs", err.message.replace("logprobs", "top_logprobs", 1)) from None
        if self.max_completion_tokens is not None:
            try:
                sampling_params({"max_tokens": self.max_completion_tokens})
            except RequestError as err:
                raise RequestError("max_completion_tokens", err.message.replace("max_tokens", "max_completion_tokens",
                                                                                1)) from None

    def offered_tools(self) -> dict[str, dict]:
        """The functions the model may call, by name ({}: none; tool_choice "none" offers none)."""
        if not self.tools or self.tool_choice == "none":
            return {}
        return {tool.function.name: tool.function.model_dump(exclude_none=True) for tool in self.tools}

    def triton_inputs(self, choice: int = 0, after: str | None = None) -> dict:
        """`after`: the token a grammar starts after (the end of a think block the prompt opened)."""
        tokens = self.max_completion_tokens or self.max_tokens
        inputs = chat_inputs(self.messages, self.template_variables(), self.tools if self.offered_tools() else None,
                             self.documents, self.chat_template)
        inputs["sampling_parameters"] = json.dumps(self.sampling(tokens, choice, after))
        return {**inputs, **self.flags()}


def chat_inputs(messages: list[ChatMessage], variables: dict, tools: list[Tool] | None,
                documents: list[dict] | None, template: str | None) -> dict:
    """The Triton model's inputs that render a chat: its turns, the template's variables, the tools it
    offers, the documents it cites, a template of the request's own."""
    inputs = {"messages": json.dumps([m.for_template() for m in messages])}
    if variables:
        inputs["chat_template_kwargs"] = json.dumps(variables)
    if tools:
        inputs["tools"] = json.dumps([tool.model_dump(exclude_none=True) for tool in tools])
    if documents:
        inputs["documents"] = json.dumps(documents)
    if template is not None:
        inputs["chat_template"] = template
    return inputs


class CompletionRequest(_Sampling):
    prompt: (str | Annotated[list[JsonInt], Field(min_length=1)] | Annotated[list[str], Field(min_length=1)]
             | Annotated[list[Annotated[list[JsonInt], Field(min_length=1)]], Field(min_length=1)]) = Field(
        description="a prompt (text or token ids) or a list of them: n choices each, choice i * n + j "
                    "of prompt i sampling with seed + j")
    max_tokens: JsonInt | None = Field(16, json_schema_extra=RANGES["max_tokens"])  # OpenAI's default for completions
    echo: bool | None = Field(None, description="the reply's text begins with the prompt, and with logprobs "
                                                "its tokens begin with the prompt's (the first with none)")
    suffix: _no_op("suffix") = None
    # no server-side best-of: each of the n choices is returned
    best_of: JsonInt | None = Field(None, ge=1, le=1, json_schema_extra={"minimum": 1, "maximum": 1})
    logprobs: JsonInt | None = Field(None, json_schema_extra=RANGES["logprobs"])

    def logprob_count(self) -> int | None:
        return self.logprobs

    def prompts(self) -> list[str | list[int]]:
        """Each prompt of the request (one, or a list of texts or of token-id lists)."""
        prompt = self.prompt  # the schema refuses empty lists
        return list(prompt) if isinstance(prompt, list) and isinstance(prompt[0], (str, list)) else [prompt]

    def choice_count(self) -> int:
        count = len(self.prompts()) * self.n
        if count > MAX_CHOICES:
            raise RequestError("prompt", f"{len(self.prompts())} prompts x n {self.n} is {count} choices; at most "
                                         f"{MAX_CHOICES} per request: send fewer")
        return count

    def prompt_top(self) -> int | None:
        """echo with logprobs asks for the prompt's, as vLLM's prompt_logprobs does."""
        asked = [n for n in (self.prompt_logprobs, self.logprobs if self.echo else None) if n is not None]
        return max(asked) if asked else None

    def check_sampling(self) -> None:
        super().check_sampling()
        self.choice_count()

    def echoed(self, choice: int) -> str | None:
        """What `echo` puts before choice `choice`'s text: its text prompt, "" without echo, None for token
        ids or a truncated prompt (the Triton model decodes what it keeps)."""
        if not self.echo:
            return ""
        prompt = self.prompts()[choice // self.n]
        # a truncated prompt's text is what its kept tokens decode to
        return prompt if isinstance(prompt, str) and self.truncate_prompt_tokens is None else None

    def triton_inputs(self, choice: int = 0, after: str | None = None) -> dict:
        prompt = self.prompts()[choice // self.n]
        key = "text_input" if isinstance(prompt, str) else "input_ids"
        inputs = {key: prompt, "sampling_parameters": json.dumps(self.sampling(self.max_tokens, choice % self.n))}
        return {**inputs, **self.flags(), **({"echo": True} if self.echo else {})}


def refusal(errors: list[dict], data: Any) -> RequestError:
    """The validation errors FastAPI reports for a request body `data` (the front's handler) -> one
    RequestError naming the first bad field by its JSON path."""
    first = errors[0]
    loc = [str(part) for part in first["loc"]]
    if loc[:1] == ["body"]:  # FastAPI's locations start at the body
        loc = loc[1:]
    if first["type"] == "json_invalid":
        return RequestError(None, "the request body is not valid JSON")
    if not isinstance(data, dict):
        return RequestError(None, "the request body must be a JSON object")
    # a union reports one error per member type; its first path element after the field is the type
    param = _param(loc, data)
    return RequestError(param, f"{param}: {first['msg']}" if param else first["msg"])


def renamed(err: RequestError, names: dict[str, str]) -> RequestError:
    """A refusal the chat path worded for a request another API's body converted to, named by that body's
    fields (`names`: a chat field -> its name there). A path into `messages` is dropped: the chat's turns
    do not line up with the other body's items (a system turn first, tool results turns of their own)."""
    if err.param is None:
        return err
    head, dot, rest = err.param.partition(".")
    head, _, index = head.partition("[")
    if head not in names:
        return err
    param = names[head] + ("" if head == "messages" else ("[" + index if index else "") + dot + rest)
    return RequestError(param, err.message.replace(head, names[head], 1), err.status)


def _param(loc: list[str], data: dict) -> str:
    """pydantic's location (with union member names in it) -> the JSON path of the field."""
    path, node = [], data
    for part in loc:
        if isinstance(node, dict) and part in node:
            path.append(part)
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            path.append(f"[{part}]")
            node = node[int(part)]
    # nothing of it in the body (a missing field, maybe under a union member's name): the field itself
    return ".".join(path).replace(".[", "[") or (loc[-1] if loc else None)

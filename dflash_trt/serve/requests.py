"""Turning a Triton request's JSON sampling parameters into SamplingParams, or an error naming the field.

Runs inside the Triton model, so Triton users of /v2/models/dflash/generate get the same checks as
the OpenAI front; errors travel back as JSON in the Triton error message (`RequestError.to_json`).
"""

from __future__ import annotations

import json
from dataclasses import fields

from dflash_trt.errors import DFlashError
from dflash_trt.models.chat import ENDINGS
from dflash_trt.runtime.beam_search import BeamSearchParams, from_sampling
from dflash_trt.spec.sampling import SamplingParams

FIELDS = [f.name for f in fields(SamplingParams)]


class RequestError(Exception):
    """A request the server refuses: HTTP status, the offending field, one line of why."""

    def __init__(self, param: str | None, message: str, status: int = 400):
        super().__init__(message)
        self.param, self.message, self.status = param, message, status

    def __eq__(self, other) -> bool:
        return isinstance(other, RequestError) and (self.param, self.message, self.status) == \
            (other.param, other.message, other.status)

    __hash__ = Exception.__hash__

    def to_json(self) -> str:
        return json.dumps({"param": self.param, "message": self.message, "status": self.status})

    @classmethod
    def from_json(cls, text: str) -> RequestError | None:
        try:
            data = json.loads(text)
        except ValueError:
            return None
        if not isinstance(data, dict) or "message" not in data:
            return None
        return cls(data.get("param"), str(data["message"]), int(data.get("status", 400)))


# what a request gets for a field neither it nor the model's generation config sets, where SamplingParams'
# own default differs: OpenAI's temperature (vLLM's and SGLang's too), not greedy decoding
SERVER_DEFAULTS = {"temperature": 1.0}


def parse_sampling(text: str | None, prompt_tokens: int, capacity: int, defaults: dict | None = None) -> SamplingParams:
    """JSON object -> SamplingParams. A field it leaves out takes `defaults` (the model's generation
    config, models/generation_defaults.py), else SERVER_DEFAULTS, else SamplingParams'; max_tokens
    defaults to what the context has left, and a default max_tokens caps it (vLLM's rule)."""
    try:
        raw = json.loads(text) if text else {}
    except ValueError:
        raise RequestError("sampling_parameters", "sampling_parameters is not valid JSON") from None
    if not isinstance(raw, dict):
        raise RequestError("sampling_parameters", "sampling_parameters must be a JSON object")
    unknown = [name for name in raw if name not in FIELDS]
    if unknown:
        raise RequestError(unknown[0], f"unknown sampling parameter '{unknown[0]}' (known: {', '.join(FIELDS)})")
    values = {name: value for name, value in raw.items() if value is not None}
    cut = values.get("truncate_prompt_tokens")
    if isinstance(cut, int) and not isinstance(cut, bool) and cut >= 1:  # the engine keeps the last `cut`
        prompt_tokens = min(prompt_tokens, cut)
    left = capacity - prompt_tokens
    if prompt_tokens >= capacity:
        raise RequestError("prompt", f"the prompt has {prompt_tokens} tokens; the context capacity is {capacity} "
                                     "tokens (prompt + max_tokens): shorten it")
    max_tokens = values.setdefault("max_tokens", left)
    if isinstance(max_tokens, int) and max_tokens > left:
        raise RequestError("max_tokens", f"max_tokens {max_tokens} is more than the context has left for this "
                                         f"prompt ({prompt_tokens} + {max_tokens} > capacity {capacity})")
    defaults = {**SERVER_DEFAULTS, **(defaults or {})}
    cap = defaults.pop("max_tokens", None)
    if cap is not None and isinstance(max_tokens, int):
        values["max_tokens"] = min(max_tokens, cap)
    return sampling_params({**defaults, **values})


def sampling_params(values: dict) -> SamplingParams:
    """SamplingParams(**values), its refusal as a RequestError naming the field. top_k -1 is vLLM's and
    OpenAI clients' spelling of "no top-k" (0 here)."""
    if values.get("top_k") == -1:
        values = {**values, "top_k": 0}
    try:
        return SamplingParams(**values)
    except DFlashError as err:  # "SamplingParams.<field> must ..."
        message = str(err).removeprefix("SamplingParams.")
        raise RequestError(message.split(" ", 1)[0], message) from None


def beam_search_params(params: SamplingParams, width, length_penalty) -> BeamSearchParams:
    """A request's SamplingParams searched by `width` beams (vLLM's use_beam_search) -> the search's
    parameters; its refusal a RequestError naming the field (a sampling field the search does not take,
    or beam_width / length_penalty)."""
    try:
        return from_sampling(params, width, length_penalty)
    except DFlashError as err:  # "BeamSearchParams.<field> must ..." or "<field>: ..."
        message = str(err).removeprefix("BeamSearchParams.")
        raise RequestError(message.split(" ", 1)[0].rstrip(":"), message) from None


# apply_chat_template's own arguments: a template variable must not take their place (but for how the
# conversation ends, models/chat.py's ENDINGS, which the OpenAI front sends among them, as vLLM merges them)
TEMPLATE_ARGUMENTS = {"conversation", "tools", "documents", "chat_template", "tokenize", "padding", "truncation",
                      "max_length", "return_tensors", "return_dict", "return_assistant_tokens_mask",
                      "tokenizer_kwargs"}


def template_kwargs(text: str | None) -> dict:
    """chat_template_kwargs (a JSON object) -> the chat template's extra variables, e.g.
    {"enable_thinking": false} for Qwen3.5's template; None: none."""
    if not text:
        return {}
    try:
        values = json.loads(text)
    except ValueError:
        raise RequestError("chat_template_kwargs", "chat_template_kwargs is not valid JSON") from None
    if not isinstance(values, dict):
        raise RequestError("chat_template_kwargs", "chat_template_kwargs must be a JSON object")
    taken = sorted(TEMPLATE_ARGUMENTS & values.keys())
    if taken:
        raise RequestError("chat_template_kwargs", f"chat_template_kwargs may not set {taken[0]!r}, an argument of "
                                                   "the chat template call itself")
    for name in ENDINGS:
        if name in values and not isinstance(values[name], bool):
            raise RequestError("chat_template_kwargs", f"chat_template_kwargs' {name} must be true or false")
    if values.get("continue_final_message") and values.get("add_generation_prompt"):
        raise RequestError("continue_final_message", "continue_final_message continues the last message, and "
                                                     "add_generation_prompt opens a new turn: send one")
    return values


# template variables that are request fields of their own (OpenAI's reasoning_effort): a template that never
# reads one would drop it silently
NAMED_VARIABLES = ("reasoning_effort",)


def check_template_reads(variables: dict, chat_template: str | None) -> None:
    """Refuse a NAMED_VARIABLES field the chat template never reads, naming it."""
    for name in NAMED_VARIABLES:
        if name in variables and name not in (chat_template or ""):
            raise RequestError(name, f"this chat template reads no {name}: leave it out (or serve with "
                                     "--chat-template, a template that does)")


def _template_list(name: str, text: str | None, chat_template: str | None, fits, shape: str) -> list | None:
    """A JSON list the chat template gets as `name` (each item `fits`); None: none. A template that never
    reads `name` would drop it silently: refused."""
    if not text:
        return None
    try:
        values = json.loads(text)
    except ValueError:
        raise RequestError(name, f"{name} is not valid JSON") from None
    if not isinstance(values, list) or not all(map(fits, values)):
        raise RequestError(name, f"{name} must be a JSON list of {shape}")
    if not values:
        return None
    if not chat_template or name not in chat_template:
        raise RequestError(name, f"this chat template does not render {name}: serve with --chat-template FILE, a "
                                 "template that does (or send one as chat_template, --trust-request-chat-template)")
    return values


def template_documents(text: str | None, chat_template: str | None) -> list | None:
    """The request's documents (e.g. {"title", "text"} objects) for the chat template; None: none."""
    return _template_list("documents", text, chat_template,
                          lambda doc: isinstance(doc, dict) and all(isinstance(v, str) for v in doc.values()),
                          "objects of strings")


def template_tools(text: str | None, chat_template: str | None) -> list | None:
    """The request's tools (OpenAI tool objects) for the chat template; None: none."""
    return _template_list("tools", text, chat_template, lambda tool: isinstance(tool, dict), "objects")

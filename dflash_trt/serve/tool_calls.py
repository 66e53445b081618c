"""Tool calls in a chat reply's text -> OpenAI `tool_calls`.

Three formats, named as vLLM's `--tool-call-parser` names them:
- hermes: a JSON object `{"name": ..., "arguments": {...}}` in each `<tool_call>...</tool_call>` block
  (Qwen2.5, Qwen3, Hermes);
- qwen3_coder: `<function=NAME>` with `<parameter=KEY>` value `</parameter>` lines in each block
  (Qwen3.5, Qwen3.6, Qwen3-Coder), each value typed by the tool's JSON schema;
- llama3_json: the whole reply is `{"name": ..., "parameters": {...}}` objects joined by ";" (after an
  optional `<|python_tag|>`: Llama 3.1 to 3.3); a reply that is not is all content.

A block that does not parse, or names a tool the request did not offer, stays text. The text around
the calls is the reply's content, less the whitespace next to a call. `split` returns for a running
reply only what no later token can change (a block still open, a possible block start and trailing
whitespace are held back), so a stream's deltas add up to the whole reply's content and calls
(serve/reply_text.py).
"""

from __future__ import annotations

import ast
import json
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

START, END = "<tool_call>", "</tool_call>"
PARSERS = ("hermes", "qwen3_coder", "llama3_json")
PYTHON_TAG = "<|python_tag|>"


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: str  # a JSON object's text, as OpenAI sends it
    id: str = field(default_factory=lambda: "call_" + uuid.uuid4().hex[:24], compare=False)


def detect_parser(chat_template: str | None) -> str | None:
    """The format a chat template teaches its model (None: none we parse)."""
    if not chat_template:
        return None
    if "<function=" in chat_template:
        return "qwen3_coder"
    if START in chat_template:
        return "hermes"
    if PYTHON_TAG in chat_template:
        return "llama3_json"
    return None


def _hermes(body: str, tools: dict[str, dict]) -> ToolCall | None:
    try:
        call = json.loads(body)
    except ValueError:
        return None
    if not isinstance(call, dict) or call.get("name") not in tools:
        return None
    arguments = call.get("arguments", {})
    if not isinstance(arguments, dict):
        return None
    return ToolCall(call["name"], json.dumps(arguments, ensure_ascii=False))


_FUNCTION = re.compile(r"\s*<function=([^>\n]+)>(.*)</function>\s*", re.DOTALL)
_PARAMETER = re.compile(r"<parameter=([^>\n]+)>(.*?)</parameter>", re.DOTALL)


def _typed(value: str, schema: dict) -> object:
    """A qwen3_coder parameter's text -> the JSON value its schema's type says (text when it does not fit)."""
    kind = schema.get("type") if isinstance(schema, dict) else None
    kinds = kind if isinstance(kind, list) else [kind]
    if value == "null" and ("null" in kinds or "string" not in kinds):  # a plain string keeps the word
        return None
    for kind in kinds:
        try:
            if kind == "integer":
                return int(value)
            if kind == "number":
                number = float(value)
                return int(number) if number.is_integer() and "." not in value and "e" not in value.lower() else number
            if kind == "boolean" and value.lower() in ("true", "false"):
                return value.lower() == "true"
            if kind in ("object", "array"):
                try:
                    return json.loads(value)
                except ValueError:
                    return ast.literal_eval(value)  # Python literals the model wrote (single quotes, True)
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            continue
    return value


def _qwen3_coder(body: str, tools: dict[str, dict]) -> ToolCall | None:
    function = _FUNCTION.fullmatch(body)
    if function is None or function.group(1).strip() not in tools:
        return None
    name, inner = function.group(1).strip(), function.group(2)
    properties = (tools[name].get("parameters") or {}).get("properties") or {}
    arguments = {}
    for match in _PARAMETER.finditer(inner):
        key, value = match.group(1).strip(), match.group(2)
        value = value.removeprefix("\n").removesuffix("\n")  # the format puts the value on lines of its own
        arguments[key] = _typed(value, properties.get(key, {}))
    if _PARAMETER.sub("", inner).strip():  # text outside the parameters: not this format
        return None
    return ToolCall(name, json.dumps(arguments, ensure_ascii=False))


BODY_PARSERS: dict[str, Callable[[str, dict[str, dict]], ToolCall | None]] = {
    "hermes": _hermes, "qwen3_coder": _qwen3_coder}


def partial_tail(text: str, tag: str) -> int:
    """How many characters at the end of `text` could begin `tag`."""
    return max((n for n in range(1, len(tag)) if text.endswith(tag[:n])), default=0)


def _json_calls(text: str, tools: dict[str, dict], final: bool) -> tuple[str, list[ToolCall]]:
    """llama3_json: (content, calls) of a reply that is calls or none (held back while it may be)."""
    body = text.lstrip().removeprefix(PYTHON_TAG).lstrip()
    if not final:  # a reply that begins as calls would is known only at its end
        head = text.lstrip()
        return ("", []) if body.startswith("{") or PYTHON_TAG.startswith(head) or head.startswith(PYTHON_TAG) \
            else (text, [])
    calls, decoder, at = [], json.JSONDecoder(), 0
    while at < len(body):
        try:
            call, at = decoder.raw_decode(body, at)
        except ValueError:
            return text, []
        arguments = call.get("parameters", call.get("arguments", {})) if isinstance(call, dict) else None
        if not isinstance(arguments, dict) or call.get("name") not in tools:
            return text, []
        calls.append(ToolCall(call["name"], json.dumps(arguments, ensure_ascii=False)))
        rest = body[at:].lstrip()
        if rest and not rest.startswith(";"):
            return text, []
        at = len(body) - len(rest.removeprefix(";").lstrip())
    return ("", calls) if calls else (text, [])


def split(text: str, parser: str, tools: dict[str, dict], final: bool) -> tuple[str, list[ToolCall]]:
    """(content, calls) of a reply's text; `tools`: the request's functions by name (their definitions).
    Not final: only what no later text can change."""
    if parser == "llama3_json":
        return _json_calls(text, tools, final)
    parse = BODY_PARSERS[parser]
    segments: list[str] = []
    calls: list[ToolCall] = []
    text_from = search_from = 0  # where the current text segment starts; where to look for a block
    after_call = False
    while True:
        start = text.find(START, search_from)
        end = -1 if start < 0 else text.find(END, start + len(START))
        if end < 0:
            break
        call = parse(text[start + len(START):end], tools)
        search_from = end + len(END)
        if call is None:  # stays text
            continue
        segment = text[text_from:start].rstrip()
        segments.append(segment.lstrip() if after_call else segment)
        calls.append(call)
        text_from, after_call = search_from, True
    tail = text[text_from:]
    if not final:
        open_block = tail.find(START, max(0, search_from - text_from))
        tail = tail[:open_block] if open_block >= 0 else tail[:len(tail) - partial_tail(tail, START)]
        tail = tail.rstrip()  # a block may still follow it
    segments.append(tail.lstrip() if after_call else tail)
    return "".join(segments), calls

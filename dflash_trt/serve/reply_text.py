"""A chat reply's text -> its reasoning, its content and its tool calls, whole or as stream deltas.

Reasoning (`--reasoning-parser qwen3`, the `<think>...</think>` of Qwen3, Qwen3.5 and DeepSeek-R1
style models) is the text up to `</think>`: from the reply's start when the prompt left a think block
open (Qwen3.5's template opens one unless `enable_thinking` is false), or after a `<think>` the reply
begins with. A reply cut before `</think>` is all reasoning. What follows is the content, where tool
calls are parsed (tool_calls.py). A running reply yields only what no later text can change, so the
deltas of a stream add up to the whole reply.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from dflash_trt.runtime.token_rules import THINK, UNTHINK
from dflash_trt.serve.tool_calls import ToolCall, partial_tail, split

REASONING_PARSERS = ("qwen3",)


def opens_thinking(prompt: str) -> bool:
    """Whether a rendered prompt ends inside a think block (its last <think> after its last </think>)."""
    return prompt.rfind(THINK) > prompt.rfind(UNTHINK)


def split_reasoning(text: str, thinking: bool, final: bool) -> tuple[str | None, str]:
    """(reasoning or None, the content's text) of a reply; `thinking`: the prompt left a block open."""
    start = 0
    if not thinking:
        head = text.lstrip()
        if not head.startswith(THINK):
            if not final and THINK.startswith(head):  # it may yet open one
                return None, ""
            return None, text
        start = len(text) - len(head) + len(THINK)
    end = text.find(UNTHINK, start)
    if end < 0:
        thought = text[start:] if final else text[start:len(text) - partial_tail(text, UNTHINK)]
        return thought, ""
    return text[start:end], text[end + len(UNTHINK):].lstrip()


@dataclass
class Delta:
    reasoning: str = ""
    content: str = ""
    calls: list[ToolCall] = field(default_factory=list)


class ReplyText:
    """One choice of a chat reply: its cumulative text -> what is new of each part.

    `thinking`: None without a reasoning parser, else whether the prompt left a think block open;
    `parser` and `tools`: the tool-call format and the offered functions by name (none: no parsing);
    `max_calls`: 1 for parallel_tool_calls false; `forced`: a tool_choice that forces calls (a function's
    name, or "required"), whose reply is JSON the grammar held to (forced_schema): read once it ends."""

    def __init__(self, thinking: bool | None = None, parser: str | None = None, tools: dict | None = None,
                 max_calls: int | None = None, forced: str | None = None):
        self.thinking, self.parser, self.tools, self.max_calls = thinking, parser, tools or {}, max_calls
        self.forced = forced
        self.reasoning: str | None = None
        self.content = ""
        self.calls: list[ToolCall] = []

    def next(self, text: str, final: bool) -> Delta:
        reasoning, content = (None, text) if self.thinking is None else split_reasoning(text, self.thinking, final)
        if self.forced is not None:  # the content is the calls' JSON, read once the reply ends
            content, calls = self._forced(content) if final else ("", [])
        elif self.tools:
            content, calls = split(content, self.parser, self.tools, final)
            calls = calls[:self.max_calls]
        else:
            calls = []
        # each part's running value is a prefix of its later ones
        delta = Delta(_new(self.reasoning or "", reasoning or ""), _new(self.content, content),
                      calls[len(self.calls):])
        if reasoning is not None:
            self.reasoning = (self.reasoning or "") + delta.reasoning
        self.content += delta.content
        self.calls += delta.calls
        return delta

    def _forced(self, text: str) -> tuple[str, list[ToolCall]]:
        """A forced reply's (content, calls): its calls, or (cut short: not the calls' JSON) its text."""
        try:
            value = json.loads(text)
            if self.forced != "required":  # the named function's arguments
                value = [{"name": self.forced, "parameters": value}]
            return "", [ToolCall(call["name"], json.dumps(call["parameters"], ensure_ascii=False)) for call in value]
        except (ValueError, TypeError, KeyError):
            return text, []


def forced_schema(tools: dict[str, dict], forced: str, one: bool) -> dict:
    """The JSON schema a forced reply follows (vLLM's forms): a named function's arguments; for
    "required", a list of {"name", "parameters"} calls of the offered functions (at most one if `one`)."""
    def arguments(name: str) -> dict:
        return tools[name].get("parameters") or {"type": "object"}

    if forced != "required":
        return arguments(forced)
    calls = [{"type": "object", "properties": {"name": {"const": name}, "parameters": arguments(name)},
              "required": ["name", "parameters"], "additionalProperties": False} for name in tools]
    return {"type": "array", "minItems": 1, **({"maxItems": 1} if one else {}), "items": {"anyOf": calls}}


def _new(sent: str, now: str) -> str:
    return now[len(sent):] if now.startswith(sent) else ""


def reasoning_tokens(tokenizer, ids: list[int], end: str) -> int:
    """How many of a reply's first tokens it took to write its reasoning: the fewest whose text holds
    `end` (the reasoning closes there), all of them when it never does. Whether a prefix's text holds it
    only grows with the prefix, so a binary search decodes log2(len) prefixes."""
    def holds(k: int) -> bool:
        return end in tokenizer.decode(ids[:k], skip_special_tokens=False)

    if not holds(len(ids)):
        return len(ids)
    low, high = 1, len(ids)
    while low < high:
        middle = (low + high) // 2
        low, high = (low, middle) if holds(middle) else (middle + 1, high)
    return low

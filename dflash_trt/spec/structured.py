"""Structured output: a grammar a reply must follow, given as vLLM's `structured_outputs` are: one of a
JSON schema, any JSON object, a regular expression, a list of choices or a grammar (llguidance's Lark
dialect, or llama.cpp's GBNF, which vLLM's xgrammar and SGLang's `ebnf` take: converted to Lark). llguidance compiles it and, per position, says which
tokens may come next (runtime/constraints.py); the core turns the others to -inf before any decision,
so greedy, sampled and speculative decoding follow it alike (csrc/constraint.h).

llguidance is imported only when a grammar is checked or compiled, so nothing else needs it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields

from dflash_trt.errors import DFlashError

KINDS = ("json", "json_object", "regex", "choice", "grammar")


@dataclass(frozen=True)
class StructuredOutput:
    json: str | None = None  # a JSON schema (a dict is accepted, kept as its canonical text)
    json_object: bool = False  # any JSON object (OpenAI's response_format json_object)
    regex: str | None = None
    choice: tuple[str, ...] | None = None  # the reply is exactly one of these
    grammar: str | None = None  # Lark or GBNF
    # JSON kinds: the whitespace allowed between tokens (vLLM's guided_whitespace_pattern, a regex); None:
    # llguidance's default (any JSON whitespace)
    whitespace_pattern: str | None = None
    # the grammar starts after this token (one token of the target's tokenizer: a reasoning model's end of
    # thinking, "</think>"); before it any token may come. None: from the reply's first token
    after: str | None = None

    def __post_init__(self):
        def bad(rule: str, value) -> DFlashError:
            return DFlashError(f"SamplingParams.structured_output {rule}, got {value!r}")

        if isinstance(self.json, (dict, bool)):
            object.__setattr__(self, "json", json.dumps(self.json, sort_keys=True))
        if self.choice is not None:
            if not isinstance(self.choice, (list, tuple)) or not self.choice or not all(
                    isinstance(c, str) and c for c in self.choice):
                raise bad("choice must be a non-empty list of non-empty strings", self.choice)
            object.__setattr__(self, "choice", tuple(self.choice))
        for name in ("json", "regex", "grammar", "after", "whitespace_pattern"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise bad(f"{name} must be a non-empty string", value)
        if not isinstance(self.json_object, bool):
            raise bad("json_object must be a bool", self.json_object)
        chosen = [name for name in KINDS if getattr(self, name) not in (None, False)]
        if len(chosen) != 1:
            raise bad(f"must set exactly one of {', '.join(KINDS)}", chosen or None)
        if self.whitespace_pattern is not None and chosen[0] not in ("json", "json_object"):
            raise bad("whitespace_pattern applies to JSON output (json, json_object)", chosen[0])
        error = _llguidance().LLMatcher.validate_grammar(self.lark())
        if error:
            raise DFlashError(f"SamplingParams.structured_output.{chosen[0]} does not compile: "
                              f"{error.strip().splitlines()[0]}")

    @classmethod
    def of(cls, value) -> StructuredOutput | None:
        """A StructuredOutput, a dict of its fields (what JSON requests carry) or None."""
        if value is None or isinstance(value, cls):
            return value
        if not isinstance(value, dict):
            raise DFlashError(f"SamplingParams.structured_output must be a dict of one of {', '.join(KINDS)}, "
                              f"got {value!r}")
        unknown = sorted(set(value) - {f.name for f in fields(cls)})
        if unknown:
            raise DFlashError(f"SamplingParams.structured_output has no field {unknown[0]!r} "
                              f"(known: {', '.join(KINDS)})")
        return cls(**value)

    def lark(self) -> str:
        """The grammar in llguidance's form."""
        matcher = _llguidance().LLMatcher
        spacing = {} if self.whitespace_pattern is None else {"overrides": {"whitespace_pattern": self.whitespace_pattern}}
        if self.json is not None:
            return matcher.grammar_from_json_schema(self.json, **spacing)
        if self.json_object:
            return matcher.grammar_from_json_schema({"type": "object"}, **spacing)
        if self.regex is not None:
            return matcher.grammar_from_regex(self.regex)
        if self.choice is not None:  # an alternation of the literal strings (Lark's lexer refuses control characters)
            return matcher.grammar_from_regex("|".join(f"(?:{_literal(c)})" for c in self.choice))
        from llguidance.gbnf_to_lark import any_to_lark

        try:
            return matcher.grammar_from_lark(any_to_lark(self.grammar))
        except Exception as err:  # the converter's own refusal of a GBNF text
            raise DFlashError(f"SamplingParams.structured_output.grammar does not compile: {err}") from None


def _literal(text: str) -> str:
    """`text` as a regular expression (llguidance's is Rust's regex syntax) that matches it alone."""
    return "".join("\\" + ch if ch in "\\.+*?()|[]{}^$#&-~" else ch for ch in text)


def _llguidance():
    import llguidance

    return llguidance

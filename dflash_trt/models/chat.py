"""Prompt text -> token ids the way the target was trained to see them (its chat template)."""

from __future__ import annotations

from transformers import PreTrainedTokenizerBase


def encode_chat(tokenizer: PreTrainedTokenizerBase, turns: list[dict], tools: list[dict] | None = None,
                template_kwargs: dict | None = None) -> list[int]:
    """Conversation turns through the chat template, with the tools it offers (OpenAI tool objects) and
    its extra variables (e.g. {"enable_thinking": False}), up to the assistant's turn."""
    text = tokenizer.apply_chat_template(turns, tools=tools or None, add_generation_prompt=True, tokenize=False,
                                         **(template_kwargs or {}))
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def encode_prompt(tokenizer: PreTrainedTokenizerBase, prompt: str) -> list[int]:
    """A user turn through the chat template when there is one, else the plain text."""
    if not tokenizer.chat_template:
        return tokenizer(prompt)["input_ids"]
    return encode_chat(tokenizer, [{"role": "user", "content": prompt}])

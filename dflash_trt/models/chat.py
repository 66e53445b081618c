"""Prompt text -> token ids the way the target was trained to see them (its chat template)."""

from __future__ import annotations

from transformers import PreTrainedTokenizerBase


def encode_prompt(tokenizer: PreTrainedTokenizerBase, prompt: str) -> list[int]:
    """A user turn through the chat template when there is one, else the plain text."""
    if not tokenizer.chat_template:
        return tokenizer(prompt)["input_ids"]
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=False
    )
    return tokenizer(text, add_special_tokens=False)["input_ids"]

"""Prompt text -> token ids the way the target was trained to see them (its chat template)."""

from __future__ import annotations

from transformers import PreTrainedTokenizerBase


# How a conversation ends (vLLM's request fields, carried among the template's kwargs): the assistant's
# turn opened (add_generation_prompt, the default), or its last message left open to be continued
# (continue_final_message: a reply's first words given; then no turn is opened unless asked).
ENDINGS = ("add_generation_prompt", "continue_final_message")


def encode_chat(tokenizer: PreTrainedTokenizerBase, turns: list[dict], tools: list[dict] | None = None,
                template_kwargs: dict | None = None, documents: list[dict] | None = None,
                chat_template: str | None = None) -> list[int]:
    """Conversation turns through the chat template (`chat_template`, or the tokenizer's), with the tools
    it offers (OpenAI tool objects), the documents it cites (RAG templates: {"title", "text"} objects)
    and its extra variables (e.g. {"enable_thinking": False}), up to the assistant's turn (or into the
    last message: ENDINGS). ValueError for both endings at once."""
    variables = dict(template_kwargs or {})
    continued = bool(variables.pop("continue_final_message", False))
    opened = bool(variables.pop("add_generation_prompt", not continued))
    if continued and opened:
        raise ValueError("continue_final_message and add_generation_prompt cannot both be true")
    text = tokenizer.apply_chat_template(turns, tools=tools or None, documents=documents or None,
                                         chat_template=chat_template, add_generation_prompt=opened,
                                         continue_final_message=continued, tokenize=False, **variables)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def encode_prompt(tokenizer: PreTrainedTokenizerBase, prompt: str) -> list[int]:
    """A user turn through the chat template when there is one, else the plain text."""
    if not tokenizer.chat_template:
        return tokenizer(prompt)["input_ids"]
    return encode_chat(tokenizer, [{"role": "user", "content": prompt}])

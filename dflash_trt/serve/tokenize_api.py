"""vLLM's /tokenize and /detokenize: a prompt (text, or chat messages through the chat template, as a
chat request renders them) to the token ids the model would read, and token ids back to text. The
Triton model does both (its `tokenize_only` input), with the tokenizer and template it serves with."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from dflash_trt.serve.protocol import ChatMessage, JsonInt, TokenId, Tool, chat_inputs, only


class _Tokenize(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    model: str | None = None
    return_token_strs: only(False) | None = Field(None, description="token strings are not returned")


class TokenizePrompt(_Tokenize):
    """A completion's prompt: its text, the tokenizer's special tokens added."""

    prompt: str
    add_special_tokens: only(True) | None = None

    def triton_inputs(self) -> dict:
        return {"text_input": self.prompt, "tokenize_only": True}


class TokenizeChat(_Tokenize):
    """A chat's messages through the chat template (which writes the special tokens), with its
    `chat_template_kwargs`, `tools`, `documents`, a `chat_template` of its own and how the turns end, as a
    chat request renders them."""

    messages: list[ChatMessage] = Field(min_length=1)
    add_special_tokens: only(False) | None = None
    add_generation_prompt: bool | None = None
    continue_final_message: bool | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    tools: list[Tool] | None = None
    documents: list[dict[str, str]] | None = None
    chat_template: Annotated[str, StringConstraints(min_length=1)] | None = None

    def triton_inputs(self) -> dict:
        endings = {name: getattr(self, name) for name in ("add_generation_prompt", "continue_final_message")
                   if getattr(self, name) is not None}
        variables = {**(self.chat_template_kwargs or {}), **endings}
        return {**chat_inputs(self.messages, variables, self.tools, self.documents, self.chat_template),
                "tokenize_only": True}


TokenizeRequest = TokenizePrompt | TokenizeChat


class DetokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    model: str | None = None
    tokens: list[TokenId] = Field(min_length=1)

    def triton_inputs(self) -> dict:
        return {"input_ids": list(self.tokens), "tokenize_only": True}


class TokenizeResponse(BaseModel):
    count: int
    max_model_len: JsonInt = Field(description="the tokens a request may hold: prompt + max_tokens")
    tokens: list[int]
    token_strs: None = None


class DetokenizeResponse(BaseModel):
    prompt: str = Field(description="the tokens' text, special tokens kept")

"""Loading a checkpoint's tokenizer, and a request's incremental detokenizer: light on purpose (no
model code), so a bundle can use them too."""

from __future__ import annotations

from pathlib import Path

from tokenizers.decoders import DecodeStream
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from dflash_trt.errors import DFlashError

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def load_tokenizer(source: str) -> PreTrainedTokenizerBase | None:
    """The checkpoint's tokenizer; None if it ships none. Files that are there but broken are an error."""
    path = Path(source)
    if path.is_dir() and not any((path / name).is_file() for name in TOKENIZER_FILES):
        return None
    try:
        return AutoTokenizer.from_pretrained(source, trust_remote_code=False)
    except (OSError, ValueError) as err:
        if path.is_dir():
            reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise DFlashError(f"{path}: tokenizer files are present but do not load ({reason})") from None
        return None  # a hub repository without a tokenizer


def token_text(tokenizer: PreTrainedTokenizerBase | None, token: int) -> str:
    """One token's text, decoded alone (what a logprob entry names it by; its id's digits without a
    tokenizer)."""
    return tokenizer.decode([token]) if tokenizer is not None else str(token)


class TextStream:
    """One request's output text, a token at a time (tokenizers' DecodeStream, special tokens skipped
    unless asked): each token costs a bounded amount of work, where decoding all ids again would grow
    with the output. A token that ends inside a multi-byte character adds "" until it completes."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, skip_special_tokens: bool = True):
        self._tokenizer = tokenizer.backend_tokenizer
        self._stream = DecodeStream(skip_special_tokens=skip_special_tokens)

    def step(self, token: int) -> str:
        return self._stream.step(self._tokenizer, token) or ""

"""Loading a checkpoint's tokenizer: light on purpose (no model code), so a bundle can use it too."""

from __future__ import annotations

from pathlib import Path

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

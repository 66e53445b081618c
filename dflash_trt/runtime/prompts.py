"""vLLM's prompt dicts: TextPrompt {"prompt": text}, whose text is tokenized as it is (no chat template:
a plain string prompt gets the target's), and TokensPrompt {"prompt_token_ids": [...]}."""

from __future__ import annotations

from dflash_trt.errors import DFlashError


class RawText(str):
    """A text prompt tokenized as it is, without the chat template (what a TextPrompt holds)."""


def from_dict(prompt: dict) -> RawText | list[int]:
    """A vLLM prompt dict -> its raw text or its token ids; any other key is refused in one line."""
    unknown = sorted(map(str, set(prompt) - {"prompt", "prompt_token_ids"}))
    if unknown:
        raise DFlashError(f"prompt key {unknown[0]!r} is not supported: send {{'prompt': text}} (tokenized as it "
                          "is, no chat template) or {'prompt_token_ids': [ids]}")
    if len(prompt) != 1:
        raise DFlashError("a prompt dict holds one of 'prompt' (text) and 'prompt_token_ids', not both")
    if "prompt" in prompt:
        if not isinstance(prompt["prompt"], str):
            raise DFlashError(f"prompt['prompt'] must be a string, got {type(prompt['prompt']).__name__}")
        return RawText(prompt["prompt"])
    ids = prompt["prompt_token_ids"]
    if not isinstance(ids, (list, tuple)):
        raise DFlashError(f"prompt['prompt_token_ids'] must be a list of token ids, got {type(ids).__name__}")
    return list(ids)


def given(prompt):
    """What an output reports as its prompt: a dict's text or ids, anything else as given."""
    return from_dict(prompt) if isinstance(prompt, dict) else prompt

"""vLLM's names for the LLM's settings: LLM(model=, speculative_config={...}, max_model_len=, max_num_seqs=,
enable_prefix_caching=), and serve's --speculative-config, which say what target, drafter, block,
capacity, batch and prefix caching say here."""

from __future__ import annotations

from dflash_trt.errors import DFlashError


def speculative_fields(fields: dict, draft: str | None, block_size: int | None,
                       name: str = "speculative_config") -> tuple[str | None, int | None]:
    """vLLM's speculative config -> (draft, block size): its "model" and "num_speculative_tokens" + 1 (the
    verify block holds the drafts and the token before them); "method" must be dflash. Each may be given
    once, here or by our own name."""
    if not isinstance(fields, dict):
        raise DFlashError(f"{name} must be a JSON object, got {fields!r}")
    unknown = sorted(map(str, set(fields) - {"method", "model", "num_speculative_tokens"}))
    if unknown:
        raise DFlashError(f"{name}: {unknown[0]!r} is not supported here (method, model, num_speculative_tokens)")
    if fields.get("method", "dflash") != "dflash":
        raise DFlashError(f"{name}: method {fields['method']!r}: dflash-trt runs dflash drafters")
    if "model" in fields:
        if draft is not None:
            raise DFlashError(f"pass the drafter once: draft or {name}'s model")
        draft = fields["model"]
    if "num_speculative_tokens" in fields:
        tokens = fields["num_speculative_tokens"]
        if not isinstance(tokens, int) or isinstance(tokens, bool) or tokens < 1:
            raise DFlashError(f"{name}: num_speculative_tokens must be an integer >= 1, got {tokens!r}")
        if block_size is not None:
            raise DFlashError(f"pass the block once: block_size or {name}'s num_speculative_tokens")
        block_size = tokens + 1
    return draft, block_size


def either(ours: str, value, default, theirs: str, alias):
    """Our setting or vLLM's name for it (`alias`, None: not given); both is refused."""
    if alias is None:
        return value
    if value != default:
        raise DFlashError(f"pass {ours} once: {ours} or {theirs} (vLLM's name), not both")
    return alias

"""The sampling defaults a model's creator ships in its generation_config.json, applied as vLLM does.

vLLM's `--generation-config`: "auto" (its default) takes temperature, top_p, top_k, min_p,
repetition_penalty and max_new_tokens from the model's generation config where that sets them (Qwen3:
temperature 0.6, top_p 0.95, top_k 20); "vllm" takes none; a directory takes its generation_config.json.
`--override-generation-config` sets some of them over what was found. A request's own values win; the
config's max_new_tokens caps every request's max_tokens (vLLM takes the least of the two).
"""

from __future__ import annotations

import json
from pathlib import Path

from dflash_trt.errors import DFlashError

AUTO, NEUTRAL = "auto", "vllm"  # vLLM's names: the model's own defaults, or none
# the generation config's names -> SamplingParams' (vLLM's list)
FIELDS = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k", "min_p": "min_p",
          "repetition_penalty": "repetition_penalty", "max_new_tokens": "max_tokens"}
FILE = "generation_config.json"


def _found(source: str | Path) -> dict:
    """The generation config's values of FIELDS that differ from transformers' own defaults (what
    vLLM reads): from its generation_config.json, else from config.json (old checkpoints kept them
    there), else none."""
    from transformers import AutoConfig, GenerationConfig

    try:
        config = GenerationConfig.from_pretrained(source)
    except ValueError as err:
        if not (Path(source) / FILE).is_file():  # no model transformers can find: its loader says why
            return {}
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise DFlashError(f"{source}'s generation config: {reason}") from None  # one it refuses (max_new_tokens 0)
    except OSError:  # none there
        try:
            config = GenerationConfig.from_model_config(AutoConfig.from_pretrained(source))
        except (OSError, ValueError):  # a bundle holds no config.json; an unknown model type
            return {}
    diff = config.to_diff_dict()
    return {name: diff[name] for name in FIELDS if diff.get(name) is not None}


def check_setting(setting: str | Path) -> None:
    """vLLM's --generation-config: auto, vllm, or a directory holding a generation_config.json; else one line."""
    if str(setting) not in (AUTO, NEUTRAL) and not (Path(setting) / FILE).is_file():
        raise DFlashError(f"--generation-config must be auto, vllm or a directory holding a {FILE}, got {str(setting)!r}")


def parse_overrides(text: str | dict | None) -> dict:
    """vLLM's --override-generation-config: a JSON object of generation-config names (FIELDS); any other
    key, or not an object, is refused in one line."""
    where = "--override-generation-config"
    if text is None:
        return {}
    if isinstance(text, str):
        try:
            text = json.loads(text)
        except ValueError:
            raise DFlashError(f"{where} is not valid JSON: {text!r}") from None
    if not isinstance(text, dict):
        raise DFlashError(f"{where} must be a JSON object, e.g. '{{\"temperature\": 0.6}}'")
    unknown = [key for key in text if key not in FIELDS]
    if unknown:
        raise DFlashError(f"{where}: {unknown[0]!r} is not a sampling default (one of {', '.join(FIELDS)})")
    return dict(text)


def sampling_defaults(model: str | Path, setting: str | Path = AUTO, overrides: str | dict | None = None) -> dict:
    """The defaults under SamplingParams' names ({} for none) for the model at `model` (a checkpoint
    directory or hub id, or a bundle export wrote): `setting` "auto" (its own), "vllm" (none), or a
    directory holding a generation_config.json. Values SamplingParams refuses are refused here, in one
    line naming where they came from, before any request."""
    from dflash_trt.spec.sampling import SamplingParams

    check_setting(setting)
    if str(setting) == NEUTRAL:
        found, where = {}, None
    elif str(setting) == AUTO:
        found, where = _found(model), f"{model}'s generation config"
    else:
        found, where = _found(setting), f"{Path(setting) / FILE}"
    overrides = parse_overrides(overrides)
    found.update(overrides)
    values = {FIELDS[name]: value for name, value in found.items()}
    if values.get("top_k") == -1:  # vLLM's spelling of "no top-k"
        values["top_k"] = 0
    try:
        SamplingParams(**values)
    except DFlashError as err:  # "SamplingParams.<field> must be ..."
        field = str(err).removeprefix("SamplingParams.").split(" ", 1)[0]
        source = "--override-generation-config" if any(FIELDS[name] == field for name in overrides) else where
        raise DFlashError(f"{source}: {err}") from None
    return values


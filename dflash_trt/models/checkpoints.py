"""Loading HF-format checkpoints: targets (dir, hub id or alias) and DFlash drafters (safetensors only)."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file
from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedTokenizerBase

from dflash_trt.errors import DFlashError
from dflash_trt.models import embedded
from dflash_trt.models.draft_config import DraftConfig
from dflash_trt.models.draft_vocab import DRAFT_VOCAB_FILE, read_draft_vocab, write_draft_vocab
from dflash_trt.models.drafter import DFlashDrafter
from dflash_trt.models.pairing import TargetShape, validate_pair
from dflash_trt.models.target import TargetModel, check_model_type
from dflash_trt.models.tokenizers import load_tokenizer

# Vision-language checkpoints whose text model is a supported target (config.json's `text_config`);
# transformers' AutoModelForCausalLM maps these to the text model's *ForCausalLM.
VISION_LANGUAGE = frozenset({"qwen3_5", "qwen3_5_moe"})


def safetensors_files(path: Path, what: str) -> list[Path]:
    """The directory's *.safetensors files, each header read (not its tensors): a corrupt or
    truncated file is refused here in one line, before any loader meets it."""
    files = sorted(path.glob("*.safetensors"))
    for file in files:
        try:
            with safe_open(file, framework="pt"):
                pass
        except (OSError, SafetensorError) as err:
            raise DFlashError(f"{file}: not a readable safetensors file ({str(err).splitlines()[0]})") from None
    if files:
        return files
    pickled = [p.name for p in path.iterdir() if p.suffix in (".bin", ".pt", ".pth", ".ckpt")]
    if pickled:
        raise DFlashError(
            f"{path}: {what} weights are pickled ({pickled[0]}); only *.safetensors are loaded "
            "(convert them with safetensors' save_file)"
        )
    raise DFlashError(f"{path}: no *.safetensors weights found for the {what}")


def resolve_target(spec: str) -> str:
    """An alias becomes its local directory; directories and hub ids pass through."""
    if spec in embedded.TARGET_ALIASES:
        return str(embedded.embedded_target_dir(spec))
    return spec


def _target_config(spec: str, weights: bool):
    """(source, config) for a target spec, from its config.json; `weights`: a directory must hold
    safetensors too."""
    source = resolve_target(spec)
    path = Path(source)
    if path.exists():
        if not (path / "config.json").is_file():
            raise DFlashError(f"{path}: not an HF checkpoint directory (no config.json)")
        if weights:
            safetensors_files(path, "target")
    elif source.startswith((".", "/", "~")) or source.count("/") != 1:
        raise DFlashError(
            f"target '{spec}' is neither a directory, a hub id (org/name) nor an alias "
            f"({', '.join(embedded.TARGET_ALIASES)})"
        )
    try:
        return source, AutoConfig.from_pretrained(source, trust_remote_code=False)
    except (OSError, ValueError) as err:  # offline, unknown repo, a model_type transformers does not know
        raise DFlashError(f"target '{spec}': cannot load its config ({str(err).splitlines()[0]})") from None


def text_model_config(config, where: str):
    """The config of the causal LM a target checkpoint loads as: its own, or for a vision-language
    checkpoint (VISION_LANGUAGE) its text model's. Any other model type is refused in one line."""
    if config.model_type not in VISION_LANGUAGE:
        check_model_type(config.model_type, where)
        return config
    text = config.get_text_config()
    check_model_type(text.model_type, where)
    # The VL model ties its LM head by its own (top-level) flag; the text config may not repeat it,
    # and a text model built untied would start from a random head where the checkpoint has none.
    text.tie_word_embeddings = config.tie_word_embeddings
    return text


def target_source(spec: str):
    """(source, text config) for a target spec, checked without loading any weights."""
    source, config = _target_config(spec, weights=True)
    return source, text_model_config(config, f"target '{spec}'")


def read_target_config(spec: str):
    """(source, text config) from config.json alone, for a plan made before downloading: a directory
    needs no weights, a hub id fetches config.json only. A checkpoint with a vision tower (Qwen3.5)
    gives its text model's config."""
    source, config = _target_config(spec, weights=False)
    return source, text_model_config(config, f"target '{spec}'")


def read_draft_config(spec: str | Path) -> DraftConfig:
    """A drafter's config from config.json alone: a directory needs no weights, a hub id (org/name)
    fetches config.json only."""
    path = Path(spec)
    if path.exists() or str(spec).startswith((".", "/", "~")) or str(spec).count("/") != 1:
        return DraftConfig.from_dir(path)
    import json

    from huggingface_hub import hf_hub_download

    try:
        file = hf_hub_download(str(spec), "config.json")
    except Exception as err:  # offline, unknown repo, gated: all one line for the user
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise DFlashError(f"drafter '{spec}': not a local directory and its config.json not fetched ({first})") from None
    return DraftConfig.from_dict(json.loads(Path(file).read_text()), where=f"{spec}/config.json")


def check_pair_configs(target_spec: str, draft_spec: str | Path):
    """Validate a pair from its two config.json files alone (no weights, no tokenizers: what a user
    can check before downloading) -> (target text config, DraftConfig)."""
    _, config = read_target_config(target_spec)
    draft = read_draft_config(draft_spec)
    validate_pair(TargetShape.of(config), draft)
    return config, draft


def load_target(spec: str, dtype: torch.dtype = torch.float32) -> tuple[TargetModel, PreTrainedTokenizerBase | None]:
    """The target's causal LM and tokenizer. From a vision-language checkpoint only the text model is
    built: transformers strips its `model.language_model.` prefix and never reads `model.visual.*`."""
    source, config = target_source(spec)
    model, info = AutoModelForCausalLM.from_pretrained(
        source, config=config, dtype=dtype, use_safetensors=True, trust_remote_code=False,
        output_loading_info=True,
    )
    missing = sorted(info["missing_keys"])
    if missing:  # transformers would run them from random init, silently
        raise DFlashError(f"target '{spec}': weights missing from the checkpoint ({missing[0]}; {len(missing)} in all)")
    tokenizer = load_tokenizer(source)
    return TargetModel(model), tokenizer


def check_pair(target_spec: str, draft_path: str | Path) -> None:
    """Validate a (target, drafter) pair from their configs and tokenizers, before any weights load."""
    source, config = target_source(target_spec)
    draft_path = resolve_draft(draft_path)
    if not draft_path.is_dir():
        raise DFlashError(f"drafter '{draft_path}' is not a directory (expected config.json + *.safetensors)")
    draft_config = DraftConfig.from_dir(draft_path)
    safetensors_files(draft_path, "drafter")
    read_draft_vocab(draft_path, getattr(config, "vocab_size", None))
    validate_pair(TargetShape.of(config), draft_config, load_tokenizer(source), load_tokenizer(str(draft_path)))


def resolve_draft(spec: str | Path) -> Path:
    """A drafter directory, or a hub id (org/name) fetched into the HF cache: safetensors, configs and
    tokenizer files only (never pickles or code)."""
    path = Path(spec)
    if path.exists() or str(spec).startswith((".", "/", "~")) or str(spec).count("/") != 1:
        return path
    from huggingface_hub import snapshot_download

    try:
        local = snapshot_download(str(spec), allow_patterns=["*.json", "*.safetensors", "tokenizer*", "*.jinja"])
    except Exception as err:  # offline, unknown repo, gated: all one line for the user
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise DFlashError(f"drafter '{spec}': not a local directory and not fetched from the hub ({first})") from None
    return Path(local)


BARE_CODEBOOKS = ("candidate_selector.predecessor_codebook", "candidate_selector.successor_codebook")
DFLASH2_WEIGHTS = (".attention_conv.", ".mlp_conv.", "candidate_selector.")


def _check_method(path: Path, config: DraftConfig, state: dict) -> None:
    """A config that claims one method over the other's weights, refused in one line naming why."""
    parts = next((name for name in sorted(state) if any(p in f".{name}" for p in DFLASH2_WEIGHTS)), None)
    if config.method == "dflash" and parts is not None:
        raise DFlashError(f"{path}: the weights are a DFlash2 drafter's ({parts}) but config.json has no "
                          f"conv_kernel_size / selector fields (a DFlash config)")
    if config.method == "dflash2" and parts is None:
        raise DFlashError(f"{path}: config.json describes a DFlash2 drafter (conv_kernel_size "
                          f"{config.conv_kernel_size}) but the weights have no convolutions or candidate selector "
                          f"(a DFlash checkpoint)")


def load_drafter(path: str | Path, dtype: torch.dtype = torch.float32) -> DFlashDrafter:
    path = resolve_draft(path)
    if not path.is_dir():
        raise DFlashError(f"drafter '{path}' is not a directory (expected config.json + *.safetensors)")
    config = DraftConfig.from_dir(path)
    drafter = DFlashDrafter(config)
    state: dict[str, torch.Tensor] = {}
    for file in safetensors_files(path, "drafter"):
        state.update(load_file(file))
    # published DFlash2 checkpoints store the selector's codebooks bare; the authors' module as .weight
    state = {name.removesuffix(".weight") if name.startswith(BARE_CODEBOOKS) else name: tensor
             for name, tensor in state.items()}
    _check_method(path, config, state)
    expected = set(drafter.state_dict())
    missing, unexpected = sorted(expected - set(state)), sorted(set(state) - expected)
    if missing or unexpected:
        detail = f"missing {missing[0]}" if missing else f"unexpected {unexpected[0]}"
        raise DFlashError(
            f"{path}: drafter weights do not match its config ({detail}; "
            f"{len(missing)} missing, {len(unexpected)} unexpected)"
        )
    for name, tensor in drafter.state_dict().items():
        if state[name].shape != tensor.shape:
            raise DFlashError(
                f"{path}: weight {name} has shape {tuple(state[name].shape)}, config says {tuple(tensor.shape)}"
            )
    drafter.load_state_dict(state)
    drafter.draft_vocab = read_draft_vocab(path, config.vocab_size)
    return drafter.to(dtype).eval()


def save_drafter(
    drafter: DFlashDrafter, path: str | Path, dtype: torch.dtype = torch.bfloat16, vocab_source: str = ""
) -> None:
    """Write z-lab HF format: config.json + model.safetensors (no embedding, no LM head), plus
    draft_vocab.json when the drafter has a draft vocabulary."""
    import json

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().to(dtype).contiguous() for k, v in drafter.state_dict().items()}
    save_file(state, str(path / "model.safetensors"), metadata={"format": "pt"})
    config = drafter.config.to_dict()
    config["torch_dtype"] = str(dtype).removeprefix("torch.")
    (path / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    if drafter.draft_vocab is not None:
        write_draft_vocab(path, drafter.draft_vocab, vocab_source)
    else:  # a folder written over keeps no stale list
        (path / DRAFT_VOCAB_FILE).unlink(missing_ok=True)

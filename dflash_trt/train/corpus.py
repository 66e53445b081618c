"""Build (or resume) a training corpus: prompts -> target responses + features, in shards."""

from __future__ import annotations

import json
import random
import shutil
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from tqdm import tqdm

from dflash_trt.errors import DFlashError
from dflash_trt.models.chat import encode_prompt
from dflash_trt.models.target import TargetModel
from dflash_trt.train import prompts as sources
from dflash_trt.train.data import generate_batch, read_shard, self_instruct, write_shard


@dataclass(frozen=True)
class CorpusConfig:
    taps: tuple[int, ...]
    num_prompts: int = 1600
    code_share: float = 0.35
    math_share: float = 0.15
    assistant_share: float = 0.35  # templated everyday requests; the rest: self-instructed chat prompts
    batch_size: int = 48
    max_new_tokens: int = 256
    seed: int = 0
    store_features: bool = True  # False: tokens only; the trainer recomputes features (GPU)
    length_sorted: bool = True  # batches of prompts of similar length (see `answer_order`)


# Settings older corpora were built with before the key existed: no assistant source (c6 and
# later have one), prompts answered in list order (c8 and earlier).
LEGACY_SETTINGS = {"assistant_share": 0.0, "length_sorted": False}
SORT_WINDOW = 8  # batches whose prompts are ordered by length together

MIX_SOURCES = ("code", "math", "assistant", "chat")


def parse_mix(text: str) -> dict[str, float]:
    """"code=0.35,math=0.15,assistant=0.35,chat=0.15" -> CorpusConfig share fields. A source not
    named gets none, except chat, which gets whatever the named shares leave."""
    shares = {}
    for part in text.split(","):
        name, _, value = part.partition("=")
        name = name.strip()
        if name not in MIX_SOURCES:
            raise DFlashError(f"--mix: unknown source '{name}' (expected {', '.join(MIX_SOURCES)})")
        try:
            shares[name] = float(value)
        except ValueError:
            raise DFlashError(f"--mix: '{part}' is not source=share") from None
        if shares[name] < 0:
            raise DFlashError(f"--mix: the share of {name} is negative")
    total = sum(shares.values())
    # chat takes what the others leave; named, the shares must add up to 1 exactly
    if total > 1 + 1e-6 or ("chat" in shares and abs(total - 1) > 1e-6):
        raise DFlashError(f"--mix: the shares add up to {total:g}, not 1")
    return {f"{name}_share": shares.get(name, 0.0) for name in MIX_SOURCES if name != "chat"}


def build_prompts(target: TargetModel, tokenizer, config: CorpusConfig) -> list[str]:
    n_code = int(config.num_prompts * config.code_share)
    n_math = int(config.num_prompts * config.math_share)
    n_assistant = int(config.num_prompts * config.assistant_share)
    n_chat = config.num_prompts - n_code - n_math - n_assistant
    with tqdm(total=n_chat, desc="self-instruct prompts", unit="prompt") as bar:
        chat = self_instruct(
            target.model, tokenizer, n_chat, config.seed, batch_size=config.batch_size, progress=bar.update
        )
    mixed = (sources.code_prompts(n_code, config.seed) + sources.math_prompts(n_math, config.seed)
             + sources.assistant_prompts(n_assistant, config.seed) + chat)
    random.Random(config.seed).shuffle(mixed)  # every prefix of the corpus has the same mix
    return mixed


def saved_settings(meta_file: Path) -> dict:
    """The settings a corpus was built with, the keys it predates filled with what they meant then."""
    return {**LEGACY_SETTINGS, **json.loads(meta_file.read_text())}


def check_settings(meta_file: Path, config: CorpusConfig) -> None:
    """A corpus is resumed only with the settings it was built with (its prompts and shards follow them)."""
    saved = saved_settings(meta_file)
    wanted = json.loads(json.dumps(asdict(config)))
    if saved != wanted:
        differ = ", ".join(f"{key} {saved.get(key)} (now {wanted.get(key)})"
                           for key in sorted(set(saved) | set(wanted)) if saved.get(key) != wanted.get(key))
        raise DFlashError(f"{meta_file}: corpus was built with other settings: {differ}; use a new directory")


def answer_order(prompt_lengths: list[int], config: CorpusConfig) -> list[list[int]]:
    """Prompt indices of each batch, in shard order.

    The target pads a batch's prompts on the left to its longest one, and the prefill pays for
    every pad token: with shuffled prompts (a median of 70 tokens, some over 240) that was about a
    third of a batch's time on our CPU. So within each window of `SORT_WINDOW` batches prompts go
    by length; a window is a slice of the shuffled list, so a corpus stopped at any window keeps
    its prompt mix.
    """
    indices = list(range(len(prompt_lengths)))
    if config.length_sorted:
        window = config.batch_size * SORT_WINDOW
        indices = [i for begin in range(0, len(indices), window)
                   for i in sorted(indices[begin : begin + window], key=lambda i: (prompt_lengths[i], i))]
    return [indices[begin : begin + config.batch_size] for begin in range(0, len(indices), config.batch_size)]


def build_corpus(target: TargetModel, tokenizer, out: Path, config: CorpusConfig, deadline_s: float | None = None) -> Path:
    """Write shards under out/ until all prompts are done or `deadline_s` seconds have passed.

    Re-running with the same directory resumes: finished shards are kept, the config must match.
    """
    if tokenizer is None or not tokenizer.chat_template:
        raise DFlashError("training data needs a target with a tokenizer and a chat template")
    out.mkdir(parents=True, exist_ok=True)
    meta_file, prompt_file = out / "corpus.json", out / "prompts.jsonl"
    if meta_file.exists():
        # The answering order is the corpus's own, not a user's choice: older corpora resume in list order.
        config = replace(config, length_sorted=saved_settings(meta_file)["length_sorted"])
        check_settings(meta_file, config)
    if not prompt_file.exists():
        prompts = build_prompts(target, tokenizer, config)
        prompt_file.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts))
        meta_file.write_text(json.dumps(asdict(config)))
    prompts = [json.loads(line)["prompt"] for line in prompt_file.read_text().splitlines()]
    stop = {tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<|im_end|>")} - {None}
    encoded = [encode_prompt(tokenizer, p) for p in prompts]
    started = time.monotonic()
    batches = answer_order([len(ids) for ids in encoded], config)
    with tqdm(total=len(batches), desc="target responses", unit="batch") as bar:
        for index, rows in enumerate(batches):
            shard = out / f"shard-{index:05d}.safetensors"
            bar.update(1)
            if shard.exists():
                continue
            if deadline_s is not None and time.monotonic() - started > deadline_s:
                break
            batch = [encoded[i] for i in rows]
            taps = config.taps if config.store_features else ()
            results = generate_batch(
                target.model, batch, config.max_new_tokens, stop, taps, pad_id=tokenizer.pad_token_id or 0
            )
            write_shard(shard, batch, results)
    return out


def pack_corpus(src: Path, dst: Path) -> int:
    """Copy a corpus without its stored target features: ~4 bytes a token instead of ~6 KB, small
    enough to share or commit. Training on the copy recomputes the features (a tokens-only corpus),
    and building into it resumes as a tokens-only corpus. Returns the number of sequences."""
    meta_file = src / "corpus.json"
    if not meta_file.is_file():
        raise DFlashError(f"{src}: not a corpus (no corpus.json)")
    if dst.exists():
        raise DFlashError(f"{dst}: already exists; pack into a new directory")
    tmp = dst.with_name(dst.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    meta = json.loads(meta_file.read_text())
    (tmp / "corpus.json").write_text(json.dumps({**meta, "store_features": False}))
    for name in ("prompts.jsonl", "split.json"):
        if (src / name).exists():
            shutil.copyfile(src / name, tmp / name)
    count = 0
    for shard in sorted(src.glob("shard-*.safetensors")):
        sequences = read_shard(shard)
        prompts = [seq["tokens"][: seq["prompt_len"]].tolist() for seq in sequences]
        results = [(seq["tokens"][seq["prompt_len"] :].tolist(), None) for seq in sequences]
        write_shard(tmp / shard.name, prompts, results)
        count += len(sequences)
    tmp.rename(dst)  # a half-written copy never looks like a corpus
    return count

"""`dflash-trt draft-vocab`: choose a drafter's draft vocabulary from training corpora."""

from __future__ import annotations

import json
from pathlib import Path

from dflash_trt.models.draft_config import DraftConfig
from dflash_trt.models.draft_vocab import DRAFT_VOCAB_FILE, most_frequent, response_counts, write_draft_vocab
from dflash_trt.train.trainer import SPLIT_FILE, load_corpus


def split_corpus(corpus: Path) -> tuple[list[dict], list[dict]]:
    """(training, held-out) sequences; all are training ones when no run has split the corpus yet."""
    sequences = load_corpus(corpus)
    split = corpus / SPLIT_FILE
    held = set(json.loads(split.read_text())["validation"]) if split.is_file() else set()
    return [s for s in sequences if s["key"] not in held], [s for s in sequences if s["key"] in held]


def set_draft_vocab(draft: Path, corpora: list[Path], size: int) -> str:
    """Write (or with size 0 remove) DRAFT/draft_vocab.json; returns what was done, with coverage."""
    config = DraftConfig.from_dir(draft)  # a drafter folder, checked before any corpus is read
    if size == 0:
        (draft / DRAFT_VOCAB_FILE).unlink(missing_ok=True)
        return f"{draft}: no draft vocabulary (the drafter proposes any token)"
    parts = [split_corpus(corpus) for corpus in corpora]
    train = [s for part in parts for s in part[0]]
    held = [s for part in parts for s in part[1]]
    vocab_size = config.vocab_size or 1 + max(int(s["tokens"].max()) for s in train + held)
    counts = response_counts(train, vocab_size)
    ids = most_frequent(counts, size)
    names = ", ".join(corpus.name for corpus in corpora)
    write_draft_vocab(draft, ids, f"the (at most) {size} most frequent response tokens of {names} (training splits)")
    report = (f"{draft / DRAFT_VOCAB_FILE}: {ids.shape[0]} token ids ({int((counts > 0).sum())} seen); they cover "
              f"{_coverage(counts, ids):.2%} of the {int(counts.sum())} training response tokens")
    if held:
        report += f" and {_coverage(response_counts(held, vocab_size), ids):.2%} of the held-out ones"
    return report


def _coverage(counts, ids) -> float:
    return float(counts[ids].sum()) / max(1, int(counts.sum()))

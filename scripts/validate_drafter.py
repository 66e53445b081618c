"""Greedy acceptance of a trained drafter on a corpus's held-out split, optionally with taps zeroed.

    python scripts/validate_drafter.py --corpus runs/c8 [--draft DIR] [--sequences N] [--zero-taps 1,8 ...] [--walk]

Prints the mean acceptance length of blocks at random response positions (as the trainer's
`val_tau`), the first slot's acceptance, and with --walk the per-decoding-step τ (`val_tau_decode`,
the number to compare with `bench`). Zeroing taps shows which target layers the drafter relies on.
The corpus must be one the drafter's taps fit (its `corpus.json` names them); a tokens-only corpus
works too, with features recomputed (slower). Runs on the CPU; nothing is trained or written but
the corpus's `split.json` (as training would write it).
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from dflash_trt.models.checkpoints import load_target, resolve_draft
from dflash_trt.models.draft_config import DraftConfig
from dflash_trt.models.draft_vocab import read_draft_vocab
from dflash_trt.models.embedded import DEFAULT_TARGET, default_drafter
from dflash_trt.train.trainer import SPLIT_FILE, TrainConfig, Trainer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--corpus", type=Path, required=True)
    parser.add_argument("--target", default=DEFAULT_TARGET)
    parser.add_argument("--draft", default=None, help="drafter directory (default: the target's shipped one)")
    parser.add_argument("--sequences", type=int, default=None, help="only the first N held-out sequences")
    parser.add_argument("--anchors", type=int, default=32, help="random blocks per sequence")
    parser.add_argument("--zero-taps", action="append", help="target layer ids whose features are zeroed, e.g. 1,8; "
                        "repeat for several ablations on the same blocks (an empty value: none zeroed)")
    parser.add_argument("--walk", action="store_true", help="also walk each response as greedy decoding does")
    parser.add_argument("--block-size", type=int, default=None,
                        help="verify block size to measure (default: the drafter's); smaller blocks as decoding runs them")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    draft = args.draft or str(default_drafter(args.target))
    folder = resolve_draft(draft)
    shape = DraftConfig.from_dir(folder)
    ablations = [[int(t) for t in text.split(",") if t.strip()] for text in args.zero_taps or [""]]
    for zeroed in ablations:
        unknown = set(zeroed) - set(shape.target_layer_ids)
        if unknown:
            parser.error(f"--zero-taps {sorted(unknown)}: the drafter taps {list(shape.target_layer_ids)}")
    if args.block_size is not None and not 2 <= args.block_size <= shape.block_size:
        parser.error(f"--block-size {args.block_size}: between 2 and the drafter's {shape.block_size}")
    target, _ = load_target(args.target)
    split = args.corpus / SPLIT_FILE  # the held-out share the corpus was split with, once chosen
    val_share = json.loads(split.read_text())["val_share"] if split.exists() else TrainConfig.val_share
    config = TrainConfig(layers=shape.num_layers, block_size=shape.block_size, mask_token_id=shape.mask_token_id,
                         seed=args.seed, init_drafter=draft, val_share=val_share,
                         draft_vocab=0)  # no list from this corpus: the drafter's own is set below
    with tempfile.TemporaryDirectory() as scratch:
        trainer = Trainer(target, args.corpus, Path(scratch), config, device="cpu")
    trainer.use_draft_vocab(read_draft_vocab(folder, target.vocab_size))  # the drafter's own list (file only, no weights)
    for zeroed in ablations:
        result = measure(trainer, trainer.val[: args.sequences], [shape.target_layer_ids.index(t) for t in zeroed],
                         shape.hidden_size, args)
        print(json.dumps({"draft": args.draft or "shipped", "corpus": str(args.corpus), "zeroed_taps": zeroed,
                          "block_size": args.block_size or shape.block_size, **result}))


def measure(trainer: Trainer, held_out: list[dict], columns: list[int], width: int, args) -> dict:
    """The trainer's held-out acceptance with the features of the tap `columns` zeroed; the same
    blocks for every call."""

    def batch(chosen, lengths=None):
        made = Trainer._batch(trainer, chosen, lengths)
        for column in columns:
            made.features[..., column * width : (column + 1) * width] = 0
        return made

    trainer._batch = batch  # every block below, random or walked, sees the edited features
    tau, tokens, steps = trainer.held_out_acceptance(held_out, args.anchors, walk=args.walk, size=args.block_size)
    # greedy τ is 1 + the matching prefix: the first slot was accepted wherever τ > 1
    result = {"sequences": len(held_out), "tau_block": round(tau.mean().item(), 3),
              "first_slot": round((tau > 1).float().mean().item(), 3)}
    if args.walk:
        result["tau_decode"] = round(tokens / max(1, steps), 3)
    return result


if __name__ == "__main__":
    main()

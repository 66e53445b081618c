"""What DFlash2's parts add to a draft step on the C++ onnxruntime executor: the embedded pair's
drafter (its weights, its draft vocabulary) against its DFlash2 twin (the same weights plus the
in-block convolutions and the candidate selector at the published settings: 2 taps per 16
channels, selector rank 256, top-16 candidates; random, since only the cost is measured), both
exported as `slots` bundles with the embedded SmolLM2-135M target and timed by
bench_ort_executor.measure (draft: the block pass and the selector walk; verify; a whole step).

    .venv/bin/python scripts/dflash2_bench.py [--blocks 4,16] [--cached 256] [--parts] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from bench_ort_executor import measure  # noqa: E402

PUBLISHED = dict(conv_kernel_size=2, conv_group_size=16, selector_rank=256, selector_top_k=16)


def twin_bundles(root: Path, parts: bool = False) -> dict[str, Path]:
    """The v1 drafter and its DFlash2 twin as slots bundles; with `parts`, also the twin with its
    convolutions alone ("convolutions": no selector, argmax drafts) and with its selector alone
    ("selector": no convolutions), to see which part costs what."""
    from dflash_trt.export.bundle import export_bundle
    from dflash_trt.models import embedded
    from dflash_trt.models.checkpoints import load_drafter, load_target
    from dflash_trt.models.drafter import DFlashDrafter

    target, tokenizer = load_target(str(embedded.embedded_target_dir(embedded.DEFAULT_TARGET)))
    v1 = load_drafter(embedded.default_drafter(embedded.DEFAULT_TARGET))
    config = replace(v1.config, **PUBLISHED, vocab_size=v1.config.vocab_size or target.vocab_size)

    def twin():
        torch.manual_seed(0)
        v2 = DFlashDrafter(config)
        v2.load_state_dict(v1.state_dict(), strict=False)  # the shared weights; conv and selector stay random
        v2.draft_vocab = v1.draft_vocab
        return v2.eval()

    drafters = {"dflash": v1, "dflash2": twin()}
    if parts:
        drafters["convolutions"] = convolutions = twin()
        del convolutions.candidate_selector
        convolutions.config = v1.config  # a DFlash head (argmax drafts); its layers keep their convolutions
        drafters["selector"] = selector = twin()
        for layer in selector.layers:
            del layer.attention_conv, layer.mlp_conv
    return {name: export_bundle(target, drafter, tokenizer, root / name, flavour="slots", check=False)
            for name, drafter in drafters.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--blocks", default="4,16")
    parser.add_argument("--cached", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--parts", action="store_true",
                        help="also the twin with only its convolutions and with only its selector")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        bundles = twin_bundles(Path(tmp), args.parts)
        for block in (int(b) for b in args.blocks.split(",")):
            for method, bundle in bundles.items():
                rows.append({"method": method, **measure(bundle, 1, args.cached, block, args.repeats, None)})
    print(f"embedded pair, 1 row, {args.cached} cached ({platform.processor() or platform.machine()}); "
          f"ms, median / min")
    print(f"{'method':>12} {'B':>3} {'draft ms':>17} {'verify ms':>17} {'step ms':>17}")
    for r in rows:
        times = " ".join(f"{r[f'{p}_ms']:>8.2f} /{r[f'{p}_min_ms']:>7.2f}" for p in ("draft", "verify", "step"))
        print(f"{r['method']:>12} {r['block']:>3} {times}")
    if args.json:
        args.json.write_text(json.dumps({"command": " ".join(sys.argv), "published_settings": PUBLISHED,
                                         "results": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()

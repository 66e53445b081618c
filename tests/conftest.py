"""Shared fixtures: tiny random (target, drafter) pairs on disk, built once per session."""

from __future__ import annotations

import pytest
from factories import POISON, make_drafter, make_poisoned_target, make_target

from dflash_trt.export import op_library
from dflash_trt.export.bundle import export_bundle
from dflash_trt.models.checkpoints import load_drafter, load_target


@pytest.fixture(scope="session")
def tiny_pairs(tmp_path_factory):
    """family -> (target dir, drafter dir) for each supported attention-only family. The llama
    drafter has a draft vocabulary (every third id of 264, and the mask), the others propose any id."""
    root = tmp_path_factory.mktemp("pairs")
    pairs = {}
    for seed, family in enumerate(["llama", "qwen3", "qwen3_moe"]):
        target = make_target(root / family, family, seed=seed)
        vocab = sorted(set(range(0, 264, 3)) | {259}) if family == "llama" else None
        drafter = make_drafter(root / f"{family}-draft", seed=seed, draft_vocab=vocab, block_size=4,
                               target_layer_ids=[1, 2])
        pairs[family] = (target, drafter)
    return pairs


@pytest.fixture(scope="session")
def poisoned_pair(tmp_path_factory):
    """(target dir, drafter dir): a qwen3 target whose logits are NaN from token POISON on (factories'
    make_poisoned_target), and a drafter for it."""
    root = tmp_path_factory.mktemp("poisoned")
    return (make_poisoned_target(root / "target", POISON, seed=1),
            make_drafter(root / "draft", seed=1, block_size=4, target_layer_ids=[1, 2]))


@pytest.fixture(scope="session")
def small_vocab_pair(tmp_path_factory):
    """(target dir, drafter dir) over a 6-token vocabulary (no tokenizer; MASK is id 5). Export must
    draw its example ids from so small a vocabulary, and greedy drafts of this pair are often accepted."""
    root = tmp_path_factory.mktemp("small-vocab")
    target = make_target(root / "target", "qwen3", seed=5, tokenizer=False, vocab_size=6)
    drafter = make_drafter(root / "draft", seed=5, block_size=4, target_layer_ids=[1, 2], mask_token_id=5)
    return target, drafter


@pytest.fixture(scope="session")
def hybrid_target(tmp_path_factory):
    """A tiny Qwen3-Next target: Gated DeltaNet (recurrent) + full attention layers."""
    return make_target(tmp_path_factory.mktemp("hybrid") / "qwen3_next", "qwen3_next", seed=7)


@pytest.fixture(scope="session")
def bundles(tiny_pairs, tmp_path_factory):
    """family -> (ONNX bundle dir, TargetModel, DFlashDrafter), exported without the polygraphy check."""
    root = tmp_path_factory.mktemp("bundles")
    made = {}
    for family in ("llama", "qwen3"):
        target_dir, draft_dir = tiny_pairs[family]
        target, tokenizer = load_target(str(target_dir))
        drafter = load_drafter(draft_dir)
        made[family] = (export_bundle(target, drafter, tokenizer, root / family, check=False), target, drafter)
        if family == "qwen3" and op_library.LIBRARY.is_file():
            plugin = export_bundle(target, drafter, tokenizer, root / "qwen3-plugin", flavour="plugin", check=False)
            made["qwen3-plugin"] = (plugin, target, drafter)
    return made


@pytest.fixture(scope="session")
def slots_bundles(tiny_pairs, tmp_path_factory):
    """family -> slots-flavour bundle dir (graph contract 2, what the runtime runs) of the llama and
    qwen3 tiny pairs, exported without the polygraphy check."""
    root = tmp_path_factory.mktemp("slots-bundles")
    made = {}
    for family in ("llama", "qwen3"):
        target_dir, draft_dir = tiny_pairs[family]
        target, tokenizer = load_target(str(target_dir))
        made[family] = export_bundle(target, load_drafter(draft_dir), tokenizer, root / family, flavour="slots",
                                     check=False)
    return made


@pytest.fixture(scope="session")
def half_bundles(tiny_pairs, tmp_path_factory):
    """(family, dtype) -> (ONNX bundle dir, TargetModel, DFlashDrafter) for float16 and bfloat16
    exports, with the polygraphy check (onnxruntime skips what it cannot run)."""
    root = tmp_path_factory.mktemp("half-bundles")
    made = {}
    for family, dtype in (("llama", "float16"), ("qwen3", "float16"), ("qwen3", "bfloat16")):
        target_dir, draft_dir = tiny_pairs[family]
        target, tokenizer = load_target(str(target_dir))
        drafter = load_drafter(draft_dir)
        path = export_bundle(target, drafter, tokenizer, root / f"{family}-{dtype}", dtype=dtype, check=True)
        made[family, dtype] = (path, target, drafter)
    return made


@pytest.fixture
def plugin_bundle(bundles):
    if "qwen3-plugin" not in bundles:
        pytest.skip("dflash op library not built (bash scripts/build_plugins.sh)")
    return bundles["qwen3-plugin"]


HYBRID_FAMILIES = ("qwen3_next", "qwen3_5_text", "qwen3_5_moe_text")


@pytest.fixture(scope="session")
def hybrid_bundles(tmp_path_factory):
    """family -> (target dir, drafter dir, portable bundle exported with the polygraphy check,
    TargetModel) for tiny random hybrid targets: layers [linear, full, linear, full], taps 1 and 2."""
    root = tmp_path_factory.mktemp("hybrid-bundles")
    made = {}
    for seed, family in enumerate(HYBRID_FAMILIES):
        target_dir = make_target(root / family, family, seed=20 + seed)
        draft_dir = make_drafter(root / f"{family}-draft", seed=seed, block_size=4, target_layer_ids=[1, 2])
        target, tokenizer = load_target(str(target_dir))
        bundle = export_bundle(target, load_drafter(draft_dir), tokenizer, root / f"{family}-portable", check=True)
        made[family] = (target_dir, draft_dir, bundle, target)
    return made

"""Shared fixtures: tiny random (target, drafter) pairs on disk, built once per session."""

from __future__ import annotations

import pytest
from factories import make_drafter, make_target


@pytest.fixture(scope="session")
def tiny_pairs(tmp_path_factory):
    """family -> (target dir, drafter dir) for each supported attention-only family."""
    root = tmp_path_factory.mktemp("pairs")
    pairs = {}
    for seed, family in enumerate(["llama", "qwen3", "qwen3_moe"]):
        target = make_target(root / family, family, seed=seed)
        drafter = make_drafter(root / f"{family}-draft", seed=seed, block_size=4, target_layer_ids=[1, 2])
        pairs[family] = (target, drafter)
    return pairs


@pytest.fixture(scope="session")
def hybrid_target(tmp_path_factory):
    """A tiny Qwen3-Next target: Gated DeltaNet (recurrent) + full attention layers."""
    return make_target(tmp_path_factory.mktemp("hybrid") / "qwen3_next", "qwen3_next", seed=7)

"""The in-place growing KV cache is a drop-in DynamicCache: same logits through prefill, decode,
crop (rollback) and dropping finished rows, across several capacity doublings."""

import pytest
import torch
from transformers import DynamicCache

from dflash_trt.models.checkpoints import load_target
from dflash_trt.models.kv_cache import GrowingLayer, growing_cache


def run(model, cache, script):
    """Apply (op, arg) steps to a cache; return the logits of every forward."""
    outs = []
    for op, arg in script:
        if op == "feed":
            start = cache.get_seq_length()
            positions = torch.arange(start, start + arg.shape[1])[None].expand(arg.shape[0], -1)
            out = model(input_ids=arg, position_ids=positions, past_key_values=cache, use_cache=True)
            outs.append(out.logits)
        elif op == "crop":
            cache.crop(-arg)
        elif op == "select":
            cache.batch_select_indices(arg)
    return outs


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_growing_cache_equals_dynamic_cache(tiny_pairs, family):
    target, _ = load_target(str(tiny_pairs[family][0]))
    gen = torch.Generator().manual_seed(3)
    ids = lambda b, n: torch.randint(0, 256, (b, n), generator=gen)  # noqa: E731
    script = [("feed", ids(3, 40))] + [("feed", ids(3, 1)) for _ in range(30)]  # past the first capacity (64)
    script += [("crop", 7), ("feed", ids(3, 9)), ("select", torch.tensor([0, 2])), ("feed", ids(2, 5))]
    script += [("feed", ids(2, 1)) for _ in range(70)] + [("crop", 50), ("feed", ids(2, 3))]
    with torch.no_grad():
        expected = run(target.model, DynamicCache(config=target.config), script)
        cache = growing_cache(target.config)
        got = run(target.model, cache, script)
    assert all(isinstance(layer, GrowingLayer) for layer in cache.layers)
    assert cache.get_seq_length() == 40 + 30 - 7 + 9 + 5 + 70 - 50 + 3
    for a, b in zip(got, expected, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_hybrid_models_keep_their_own_layer_classes(hybrid_target):
    target, _ = load_target(str(hybrid_target))
    cache = growing_cache(target.config)
    kinds = {type(layer).__name__ for layer in cache.layers}
    assert "GrowingLayer" in kinds and len(kinds) == 2  # attention layers grow; linear-attention ones stay

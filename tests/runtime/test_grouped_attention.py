"""Grouped K/V heads handed to SDPA as they are: what HF's sdpa attention computes, without its
per-group copies of the cache; the runtime uses it and still decodes losslessly
(tests/test_embedded_pair.py, tests/runtime/test_llm.py)."""

import pytest
import torch
from transformers.integrations import sdpa_attention

from dflash_trt import LLM
from dflash_trt.models.checkpoints import load_target
from dflash_trt.runtime.grouped_attention import NAME, use_grouped_attention


def prefill_then_verify(target, taps=(1, 2)):
    """A 7-token prefill, then a 4-token verify over that cache: (logits, features) of both."""
    cache = target.new_cache()
    first = target.forward([3, 14, 15, 92, 65, 35, 89], cache, taps)
    target.commit(cache, 7)
    return first, target.forward([79, 32, 38, 46], cache, taps)


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_grouped_attention_computes_what_hf_sdpa_does(tiny_pairs, family):
    target, _ = load_target(str(tiny_pairs[family][0]))
    assert target.config.num_attention_heads > target.config.num_key_value_heads  # grouped: 4 over 2
    expected = prefill_then_verify(target)
    assert use_grouped_attention(target.model) and target.model.config._attn_implementation == NAME
    got = prefill_then_verify(target)
    for want, have in zip(expected, got, strict=True):
        for a, b in zip(want, have, strict=True):
            torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5)


def test_a_verify_no_longer_copies_kv_heads_per_query_group(tiny_pairs, monkeypatch):
    copies = []
    real = sdpa_attention.repeat_kv
    monkeypatch.setattr(sdpa_attention, "repeat_kv", lambda *a: copies.append(a[1]) or real(*a))
    target, _ = load_target(str(tiny_pairs["qwen3"][0]))
    prefill_then_verify(target)
    assert copies  # HF's sdpa repeats the heads for a masked verify...
    copies.clear()
    use_grouped_attention(target.model)
    prefill_then_verify(target)
    assert copies == []  # ...the grouped path never does


def test_an_implementation_other_than_sdpa_is_left_alone(tiny_pairs):
    target, _ = load_target(str(tiny_pairs["llama"][0]))
    target.model.set_attn_implementation("eager")
    assert not use_grouped_attention(target.model)
    assert target.model.config._attn_implementation == "eager"


def test_the_torch_runtime_runs_its_target_with_grouped_attention(tiny_pairs):
    llm = LLM(*map(str, tiny_pairs["qwen3"]), backend="torch")
    assert llm.target.model.config._attn_implementation == NAME

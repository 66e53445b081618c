"""Target adapter: tapped features are HF hidden_states[k + 1]; rollback equals a fresh forward."""

import pytest
import torch
from factories import make_target

from dflash_trt.errors import DFlashError
from dflash_trt.models.checkpoints import load_target

TAPS = (0, 1, 3)


@pytest.mark.parametrize("family", ["llama", "qwen3", "qwen3_moe"])
def test_features_are_residual_outputs_of_the_tapped_layers(tiny_pairs, family):
    target, _ = load_target(str(tiny_pairs[family][0]))
    ids = list(range(20, 33))
    cache = target.new_cache()
    logits, features = target.forward(ids, cache, TAPS)
    with torch.no_grad():
        ref = target.model(torch.tensor([ids]), output_hidden_states=True)
    expected = torch.cat([ref.hidden_states[k + 1][0] for k in TAPS], dim=-1)
    torch.testing.assert_close(features, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(logits, ref.logits[0], rtol=1e-5, atol=1e-5)
    # A tap is a layer's output, not its input: the off-by-one would match hidden_states[k].
    assert not torch.allclose(features[:, :64], ref.hidden_states[0][0], atol=1e-3)


def rollback_case(target, prefix, block, keep, follow):
    """Prefill, verify a block, keep `keep` of it, feed `follow`: logits of that last forward."""
    cache = target.new_cache()
    target.forward(prefix, cache)
    target.commit(cache, len(prefix))
    target.forward(block, cache, TAPS)
    target.commit(cache, keep)
    logits, features = target.forward(follow, cache, TAPS)
    target.commit(cache, len(follow))
    assert cache.length == len(prefix) + keep + len(follow)
    return logits, features


def fresh(target, ids, n_last):
    cache = target.new_cache()
    logits, features = target.forward(ids, cache, TAPS)
    return logits[-n_last:], features[-n_last:]


@pytest.fixture(scope="module")
def qwen3_5_target(tmp_path_factory):
    """A tiny Qwen3.5 text model: Gated DeltaNet + full attention, without Qwen3-Next's MoE."""
    from factories import make_target

    return make_target(tmp_path_factory.mktemp("qwen3_5") / "t", "qwen3_5_text", seed=9)


@pytest.mark.parametrize("family", ["llama", "qwen3", "qwen3_moe", "qwen3_next", "qwen3_5_text"])
@pytest.mark.parametrize("keep", [0, 1, 3, 6])
def test_rollback_equals_fresh_forward(tiny_pairs, hybrid_target, qwen3_5_target, family, keep):
    hybrids = {"qwen3_next": hybrid_target, "qwen3_5_text": qwen3_5_target}
    path = hybrids.get(family) or tiny_pairs[family][0]
    target, _ = load_target(str(path))
    prefix, block, follow = list(range(40, 51)), list(range(100, 106)), [7, 9, 11]
    got = rollback_case(target, prefix, block, keep, follow)
    expected = fresh(target, prefix + block[:keep] + follow, len(follow))
    torch.testing.assert_close(got[0], expected[0], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(got[1], expected[1], rtol=1e-4, atol=1e-4)


def test_hybrid_rollback_needs_the_snapshot(hybrid_target):
    """Cropping alone leaves the recurrent state advanced: the snapshot path is what makes it exact."""
    target, _ = load_target(str(hybrid_target))
    assert target.is_stateful
    prefix, block, follow = list(range(40, 51)), list(range(100, 106)), [7, 9, 11]
    cache = target.new_cache()
    cache.kv.activate_past_recording()  # lets HF crop attention K/V and conv windows
    target.forward(prefix, cache)
    target.commit(cache, len(prefix))
    target.forward(block, cache)
    cache.kv.crop(-(len(block) - 2))  # the attention-only rollback, by hand (commit() refuses it)
    cache.snapshot, cache.pending, cache.length = None, [], cache.length + 2
    logits, _ = target.forward(follow, cache)
    expected, _ = fresh(target, prefix + block[:2] + follow, len(follow))
    assert (logits - expected).abs().max() > 1e-4


def test_unsupported_model_type_is_refused(tmp_path):
    from transformers import GPT2Config, GPT2LMHeadModel

    GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=50)).save_pretrained(tmp_path)
    with pytest.raises(DFlashError, match="model_type 'gpt2' is not supported"):
        load_target(str(tmp_path))


def test_target_load_errors(tmp_path):
    with pytest.raises(DFlashError, match="neither a directory"):
        load_target("no/such/thing/here")
    (tmp_path / "empty").mkdir()
    with pytest.raises(DFlashError, match="no config.json"):
        load_target(str(tmp_path / "empty"))
    path = make_target(tmp_path / "pickled", "llama")
    (path / "model.safetensors").rename(path / "pytorch_model.bin")
    with pytest.raises(DFlashError, match="pickled"):
        load_target(str(path))


def test_a_stateful_rollback_without_its_snapshot_is_refused(hybrid_target):
    target, _ = load_target(str(hybrid_target))
    cache = target.new_cache()
    target.forward([5, 6, 7], cache)
    target.commit(cache, 3)
    target.forward([8], cache)  # one token: no snapshot is taken
    with pytest.raises(AssertionError, match="without a snapshot"):
        target.commit(cache, 0)

"""Portable and plugin bundles (graph contract 1, written for engine builds) decode as the torch
models do: the reference loop over their graphs on onnxruntime (tests/contract1_runner.py) is token-
and step-identical to the same loop on torch."""

import numpy as np
import pytest
import torch
from contract1_runner import OrtBundle, OrtTargetSession, generate
from reference import reference_output

from dflash_trt import LLM, SamplingParams
from dflash_trt.export import op_library
from dflash_trt.export.bundle import export_bundle
from dflash_trt.models.checkpoints import load_drafter, load_target

PARAMS = SamplingParams(max_tokens=24, ignore_eos=True)


def same_as_torch(path, torch_llm, prompts, block):
    for prompt in prompts:
        ids = torch_llm.encode(prompt)
        tokens, taus = generate(path, ids, PARAMS, block)
        want = reference_output(torch_llm, prompt, PARAMS, speculative=True, block_size=block)
        assert tokens == want.token_ids, prompt
        assert taus == want.metrics.acceptance_lengths  # identical drafts: the same acceptance every step
        assert generate(path, ids, PARAMS)[0] == tokens  # and autoregressive on the same graphs


@pytest.mark.parametrize("family", ["llama", "qwen3"])
@pytest.mark.parametrize("block", [2, 16])
def test_greedy_portable_graphs_equal_torch_and_autoregressive(bundles, tiny_pairs, family, block):
    same_as_torch(bundles[family][0], LLM(*map(str, tiny_pairs[family]), backend="torch"), ["hello there", [5, 6, 7]],
                  block)


@pytest.mark.parametrize("block", [4, 16])
def test_greedy_plugin_graphs_equal_torch(plugin_bundle, tiny_pairs, block):
    same_as_torch(plugin_bundle[0], LLM(*map(str, tiny_pairs["qwen3"]), backend="torch"), ["hello there", [9, 8, 7, 6]],
                  block)


def test_plugin_graphs_with_a_draft_vocabulary_equal_torch(tiny_pairs, tmp_path):
    """The llama drafter drafts from 89 of 264 ids: its plugin-flavour bundle passes the polygraphy
    check and decodes what the torch models do, step for step."""
    if not op_library.LIBRARY.is_file():
        pytest.skip("dflash op library not built (bash scripts/build_plugins.sh)")
    target_dir, draft_dir = tiny_pairs["llama"]
    target, tokenizer = load_target(str(target_dir))
    drafter = load_drafter(draft_dir)
    assert drafter.draft_vocab is not None
    path = export_bundle(target, drafter, tokenizer, tmp_path / "b", flavour="plugin", check=True)
    same_as_torch(path, LLM(str(target_dir), str(draft_dir), backend="torch"), ["hello there", [9, 8, 7, 6]], 4)


def test_a_drafter_tapping_the_last_layer_decodes_as_on_torch(tiny_pairs, tmp_path):
    """A tap on the last layer is the hidden state before the final norm (as HF's hidden_states
    gives it, not the normed output): the graphs' features equal torch's there."""
    from factories import make_drafter

    target_dir, _ = tiny_pairs["qwen3"]
    target, tokenizer = load_target(str(target_dir))
    last = target.num_layers - 1
    draft_dir = make_drafter(tmp_path / "draft", seed=3, block_size=4, target_layer_ids=[1, last])
    path = export_bundle(target, load_drafter(draft_dir), tokenizer, tmp_path / "bundle", check=False)
    prompt = [5, 9, 17, 33, 2, 71]
    _, ours = OrtTargetSession(OrtBundle(path)).prefill(prompt)
    _, ref = target.forward(prompt, target.new_cache(), (1, last))
    np.testing.assert_allclose(ours.numpy(), ref.numpy(), atol=1e-4, rtol=0)
    same_as_torch(path, LLM(str(target_dir), str(draft_dir), backend="torch"), [[9, 8, 7, 6]], 4)


@pytest.mark.parametrize("pair", ["llama", "qwen3", "small-vocab"])
def test_greedy_dflash_on_a_float16_bundle_equals_autoregressive_decoding_on_it(half_bundles, small_vocab_pair,
                                                                                 tmp_path, pair):
    """Caches, features and context K/V stay float16 from step to step, through every rollback. The
    6-token pair gets drafts accepted (the random tiny drafters of the others rarely do), so the
    accepted-prefix path runs on float16 caches too."""
    if pair == "small-vocab":
        target_dir, draft_dir = small_vocab_pair
        target, _ = load_target(str(target_dir))
        path = export_bundle(target, load_drafter(draft_dir), None, tmp_path / "b", dtype="float16", check=False)
        prompts = [[1, 2, 3], [0, 4, 1, 1], [2]]
    else:
        path = half_bundles[pair, "float16"][0]
        prompts = [[7, 8, 9, 10], [5, 6, 7]]
    bundle = OrtBundle(path)
    target = OrtTargetSession(bundle)
    logits, features = target.prefill([1, 2, 3])
    assert logits.dtype == torch.float32 and features.dtype == torch.float16 and target.past[0].dtype == np.float16
    accepted = []
    for block in (2, 4):
        for prompt in prompts:
            tokens, taus = generate(bundle, prompt, SamplingParams(max_tokens=40, ignore_eos=True), block)
            assert tokens == generate(bundle, prompt, SamplingParams(max_tokens=40, ignore_eos=True))[0]
            accepted += taus
    if pair == "small-vocab":
        assert max(accepted) == 4  # a whole B=4 block accepted, at least once

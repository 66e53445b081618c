"""Each exported graph on onnxruntime against the PyTorch reference: ragged batches, several lengths."""

import numpy as np
import onnxruntime as ort
import pytest
import torch

from dflash_trt.export.graphs import kv_names
from block_logits import run_with_logits

ATOL = 1e-4  # float32 graphs on the same CPU: differences are reduction-order round-off


def session(bundle, name):
    return ort.InferenceSession(str(bundle / f"{name}.onnx"), providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("family", ["llama", "qwen3"])
@pytest.mark.parametrize(
    "first, kept, new", [(5, (5, 3), 4), (1, (1, 0), 1), (7, (2, 7), 6), (6, (4,), 3), (4, (4, 1, 2), 5)]
)
def test_target_graph_matches_the_target_on_ragged_rows(bundles, family, first, kept, new):
    """len(kept) rows (batch 1, 2 and 3) share one call; row r keeps only `kept[r]` of its `first`
    cached tokens (a rollback)."""
    bundle, target, drafter = bundles[family]
    taps = tuple(drafter.config.target_layer_ids)
    rows = len(kept)
    g = torch.Generator().manual_seed(first * 10 + new)
    prefix = torch.randint(0, target.vocab_size, (rows, first), generator=g)
    suffix = torch.randint(0, target.vocab_size, (rows, new), generator=g)
    s = session(bundle, "target")
    cfg = target.config
    empty = np.zeros((rows, cfg.num_key_value_heads, 0, cfg.head_dim), np.float32)
    feed = {"input_ids": prefix.numpy(), "past_lengths": np.zeros(rows, np.int64), "logits_from": np.array(0)}
    feed |= {n: empty for n in kv_names("past", target.num_layers)}
    first_out = s.run(None, feed)
    feed = {"input_ids": suffix.numpy(), "past_lengths": np.array(kept, np.int64), "logits_from": np.array(new - 1)}
    feed |= dict(zip(kv_names("past", target.num_layers), first_out[2:], strict=True))
    logits, features, *present = s.run(None, feed)
    for row in range(rows):
        ids = prefix[row, : kept[row]].tolist() + suffix[row].tolist()
        ref_logits, ref_features = target.forward(ids, target.new_cache(), taps)
        np.testing.assert_allclose(logits[row], ref_logits[-1:].numpy(), atol=ATOL, rtol=0)  # logits_from: last only
        np.testing.assert_allclose(features[row], ref_features[-new:].numpy(), atol=ATOL, rtol=0)
        ref_first, _ = target.forward(prefix[row].tolist(), target.new_cache(), taps)
        np.testing.assert_allclose(first_out[0][row], ref_first.numpy(), atol=ATOL, rtol=0)
    assert present[0].shape[2] == first + new  # present = past ++ new; the host slices to roll back


@pytest.mark.parametrize("family", ["llama", "qwen3"])
@pytest.mark.parametrize("n, rows", [(1, 2), (3, 1), (9, 2), (4, 3)])
def test_draft_context_graph_matches_kv_injection(bundles, family, n, rows):
    bundle, _, drafter = bundles[family]
    g = torch.Generator().manual_seed(n)
    features = torch.randn(rows, n, drafter.fc.in_features, generator=g)
    positions = torch.stack([torch.arange(4 + 7 * r, 4 + 7 * r + n) for r in range(rows)])
    out = session(bundle, "draft_context").run(None, {"features": features.numpy(), "positions": positions.numpy()})
    with torch.no_grad():
        ref = [t for pair in drafter.inject_context(features, positions) for t in pair]
    for got, want in zip(out, ref, strict=True):
        np.testing.assert_allclose(got, want.numpy(), atol=ATOL, rtol=0)


@pytest.mark.parametrize("family", ["llama", "qwen3"])
@pytest.mark.parametrize("block, lengths", [(2, (3, 3)), (4, (6, 2)), (8, (9, 5)), (16, (7,)), (4, (5, 1, 8))])
def test_draft_block_graph_matches_the_block_pass(bundles, family, block, lengths):
    """Row r (of 1 to 3) sees only its first lengths[r] context positions; padding must not leak in."""
    bundle, target, drafter = bundles[family]
    rows = len(lengths)
    g = torch.Generator().manual_seed(block)
    cap = max(lengths)
    arch = drafter.config.arch
    context = [torch.randn(rows, arch.num_key_value_heads, cap, arch.head_dim, generator=g)
               for _ in range(2 * drafter.config.num_layers)]
    block_ids = torch.randint(0, target.vocab_size, (rows, block), generator=g)
    feed = {"block_ids": block_ids.numpy(), "context_lengths": np.array(lengths, np.int64)}
    feed |= {n: t.numpy() for n, t in zip(kv_names("context", drafter.config.num_layers), context, strict=True)}
    logits, tokens = run_with_logits(bundle / "draft_block.onnx", feed)
    assert tokens.shape == (rows, block - 1)
    for row, length in enumerate(lengths):
        pairs = [(context[2 * i][row : row + 1, :, :length], context[2 * i + 1][row : row + 1, :, :length])
                 for i in range(drafter.config.num_layers)]
        with torch.no_grad():
            hidden = drafter.block_hidden(target.embed(block_ids[row : row + 1]),
                                          torch.arange(length, length + block)[None], pairs, torch.arange(length)[None])
            ref, ref_tokens = drafter.head(target.lm_head)(hidden[:, 1:])
        np.testing.assert_allclose(logits[row], ref[0].numpy(), atol=ATOL, rtol=0)
        assert tokens[row].tolist() == ref_tokens[0].tolist()
    if drafter.draft_vocab is not None:  # the llama pair: only listed ids are ever drafted
        assert logits.shape[-1] == drafter.draft_vocab.shape[0]
        assert set(tokens.flatten().tolist()) <= set(drafter.draft_vocab.tolist())


@pytest.mark.parametrize("block, lengths", [(4, (6, 2)), (16, (20, 9)), (8, (11,))])
def test_plugin_flavour_graphs_compute_what_the_portable_ones_do(bundles, plugin_bundle, block, lengths):
    from dflash_trt.export.op_library import session_options

    portable = bundles["qwen3"][0]
    plugin, target, drafter = plugin_bundle
    arch = drafter.config.arch
    g = torch.Generator().manual_seed(block)

    def both(name, feed):
        if name == "draft_block":
            return run_with_logits(portable / f"{name}.onnx", feed), run_with_logits(plugin / f"{name}.onnx", feed,
                                                                                     session_options(True))
        ours = ort.InferenceSession(str(plugin / f"{name}.onnx"), session_options(True), providers=["CPUExecutionProvider"])
        return session(portable, name).run(None, feed), ours.run(None, feed)

    rows = len(lengths)
    features = torch.randn(rows, 5, drafter.fc.in_features, generator=g).numpy()
    positions = np.stack([np.arange(3, 8), np.arange(0, 5)][:rows])
    for a, b in zip(*both("draft_context", {"features": features, "positions": positions}), strict=True):
        np.testing.assert_allclose(b, a, atol=ATOL, rtol=0)
    cap = max(lengths)
    feed = {"block_ids": torch.randint(0, target.vocab_size, (rows, block), generator=g).numpy(),
            "context_lengths": np.array(lengths, np.int64)}
    feed |= {n: torch.randn(rows, arch.num_key_value_heads, cap, arch.head_dim, generator=g).numpy()
             for n in kv_names("context", drafter.config.num_layers)}
    (logits_a, tokens_a), (logits_b, tokens_b) = both("draft_block", feed)
    np.testing.assert_allclose(logits_b, logits_a, atol=ATOL, rtol=0)
    assert (tokens_a == tokens_b).all()

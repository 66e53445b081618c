"""Distillation's soft labels are the target's own distributions, recomputed from the deepest tap."""

import pytest
import torch
from torch.nn import functional as F

from dflash_trt.errors import DFlashError
from dflash_trt.models.checkpoints import load_target
from dflash_trt.train.data import tapped_features
from dflash_trt.train.objective import IGNORE, make_blocks, stack_blocks, weighted_loss
from dflash_trt.train.teacher import check_distillable, final_hidden, teacher_logprobs

BLOCK = 4


def sequences(lengths, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 256, (n,), generator=gen) for n in lengths]


@pytest.mark.parametrize("family", ["llama", "qwen3", "qwen3_moe"])
def test_the_layers_after_the_tap_give_the_full_forwards_final_hidden_state(tiny_pairs, family):
    """Right-padded rows of different lengths, so the causal mask is what keeps them apart."""
    target, _ = load_target(str(tiny_pairs[family][0]))
    seqs = sequences([9, 14, 6])
    taps = (1,)  # of 4 layers: layers 2 and 3 are re-run
    tapped = tapped_features(target.model, seqs, taps)
    padded = torch.nn.utils.rnn.pad_sequence(tapped, batch_first=True)
    final = final_hidden(target.model, padded, tap_layer=1)
    for row, seq in enumerate(seqs):
        with torch.no_grad():
            full = target.model.get_decoder()(input_ids=seq[None, :-1]).last_hidden_state[0]
        torch.testing.assert_close(final[row, : seq.shape[0] - 1], full, rtol=1e-5, atol=1e-5)


def test_teacher_slot_k_is_the_targets_distribution_for_the_token_at_anchor_plus_k(tiny_pairs):
    target, _ = load_target(str(tiny_pairs["llama"][0]))
    seqs = sequences([12, 16])
    items = []
    for seq in seqs:
        feats = tapped_features(target.model, [seq], (1, 3))[0]
        items.append((feats, make_blocks(seq, torch.tensor([2, 7, 10]), BLOCK, 259, feats.shape[0])))
    batch = stack_blocks(items, 259)
    tap3 = batch.features[..., 64:]  # the deepest tap is the second
    final = final_hidden(target.model, tap3, tap_layer=3)
    head = target.lm_head.weight
    vocab = torch.tensor([3, 40, 41, 200, 258])
    got = teacher_logprobs(final, batch.positions, BLOCK, head[vocab])
    assert got.shape == (2 * 3, BLOCK - 1, vocab.shape[0])
    n = 3
    for i, seq in enumerate(seqs):
        with torch.no_grad():
            logits = target.model(input_ids=seq[None]).logits[0]
        for b, anchor in enumerate([2, 7, 10]):
            for k in range(1, BLOCK):
                if anchor + k >= seq.shape[0]:  # no label there: the row is clamped and ignored
                    assert batch.labels[i * n + b, k - 1] == IGNORE
                    continue
                want = F.log_softmax(logits[anchor + k - 1, vocab], dim=-1)
                torch.testing.assert_close(got[i * n + b, k - 1], want, rtol=1e-4, atol=1e-4)


def test_the_soft_loss_blends_in_and_a_one_hot_teacher_is_the_hard_label():
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(3, BLOCK - 1, 7, generator=gen)
    labels = torch.randint(0, 7, (3, BLOCK - 1), generator=gen)
    labels[2, 2] = IGNORE
    weights = torch.tensor([1.0, 0.5, 0.25])
    hard = weighted_loss(logits, labels, weights)
    one_hot = torch.log(F.one_hot(labels.clamp(min=0), 7).float())
    torch.testing.assert_close(weighted_loss(logits, labels, weights, one_hot, 1.0), hard)
    uniform = torch.full_like(logits, -torch.log(torch.tensor(7.0)))
    soft = weighted_loss(logits, labels, weights, uniform, 1.0)
    assert not torch.isclose(soft, hard)
    torch.testing.assert_close(weighted_loss(logits, labels, weights, uniform, 0.25), 0.75 * hard + 0.25 * soft)
    torch.testing.assert_close(weighted_loss(logits, labels, weights, uniform, 0.0), hard)


def test_a_recurrent_target_is_refused_for_distillation(hybrid_target):
    target, _ = load_target(str(hybrid_target))
    with pytest.raises(DFlashError, match="attention-only target; 'qwen3_next'"):
        check_distillable(target.model)

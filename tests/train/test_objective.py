"""The training objective sees exactly what inference sees (the usual cause of trained drafters
that never get accepted), and the corpus features are the target's own."""

import pytest
import torch
from factories import make_drafter

from dflash_trt.models.checkpoints import load_drafter, load_target
from dflash_trt.runtime.torch_backend import TorchDraftSession
from dflash_trt.train.data import generate_batch
from dflash_trt.train.objective import (
    IGNORE,
    block_logits,
    decode_walk,
    greedy_acceptance,
    make_blocks,
    sample_anchors,
    stack_blocks,
)

BLOCK = 4
TAPS = (1, 2)


@pytest.fixture(scope="module")
def pair(tiny_pairs, tmp_path_factory):
    target, _ = load_target(str(tiny_pairs["qwen3"][0]))
    drafter = load_drafter(make_drafter(tmp_path_factory.mktemp("d") / "d", seed=3, block_size=BLOCK))
    return target, drafter


def test_blocks_see_only_earlier_context_and_their_own_block():
    tokens = torch.arange(100, 112)
    blocks = make_blocks(tokens, torch.tensor([3, 9]), BLOCK, mask_id=7, ctx_len=11)
    assert blocks.ids.tolist() == [103, 7, 7, 7, 109, 7, 7, 7]
    assert blocks.positions.tolist() == [3, 4, 5, 6, 9, 10, 11, 12]
    assert blocks.labels.tolist() == [[104, 105, 106], [110, 111, IGNORE]]  # same position, cut at the end
    visible = blocks.visible[0, 0]
    assert visible[0, :11].tolist() == [True] * 3 + [False] * 8  # strictly before anchor 3
    assert visible[5, :11].tolist() == [True] * 9 + [False] * 2
    assert visible[0, 11:].tolist() == [True] * 4 + [False] * 4
    assert visible[7, 11:].tolist() == [False] * 4 + [True] * 4


def test_anchors_are_response_positions_with_a_label():
    gen = torch.Generator().manual_seed(0)
    anchors = sample_anchors(seq_len=20, prompt_len=8, count=50, generator=gen)
    assert anchors.tolist() == list(range(8, 19))
    assert sample_anchors(9, 8, 5, gen).numel() == 0


def test_packed_training_pass_equals_the_inference_draft(pair):
    """Each packed block's logits equal what the inference session computes for that anchor."""
    target, drafter = pair
    tokens = torch.tensor([11, 52, 9, 200, 31, 7, 7, 64, 18, 90, 3, 44, 250, 16])
    _, features = target.forward(tokens[:-1].tolist(), target.new_cache(), TAPS)
    anchors = torch.tensor([2, 5, 6, 10])
    blocks = make_blocks(tokens, anchors, BLOCK, drafter.config.mask_token_id, features.shape[0])
    with torch.no_grad():
        packed = block_logits(drafter, target.model.get_input_embeddings().weight, target.lm_head.weight,
                              stack_blocks([(features, blocks)], drafter.config.mask_token_id))
    for row, anchor in enumerate(anchors.tolist()):
        session = TorchDraftSession(drafter, target)
        # inference: context = features strictly before the anchor, bonus = the anchor token
        drafts = session.draft(features[:anchor], int(tokens[anchor]), BLOCK)
        assert packed[row].argmax(-1).tolist() == drafts


def test_shorter_blocks_train_what_a_smaller_verify_block_drafts(pair):
    """A block of length L < B in a B-slot packed pass gives the logits an inference draft with
    block size L gives: its padding slots are invisible and carry no label."""
    target, drafter = pair
    tokens = torch.tensor([11, 52, 9, 200, 31, 7, 7, 64, 18, 90, 3, 44, 250, 16])
    _, features = target.forward(tokens[:-1].tolist(), target.new_cache(), TAPS)
    anchors, lengths = torch.tensor([2, 5, 6, 10]), torch.tensor([2, 3, 4, 3])
    mask_id = drafter.config.mask_token_id
    blocks = make_blocks(tokens, anchors, BLOCK, mask_id, features.shape[0], lengths)
    assert blocks.labels.tolist() == [[200, IGNORE, IGNORE], [7, 64, IGNORE], [64, 18, 90], [44, 250, IGNORE]]
    with torch.no_grad():
        packed = block_logits(drafter, target.model.get_input_embeddings().weight, target.lm_head.weight,
                              stack_blocks([(features, blocks)], mask_id))
        full = block_logits(drafter, target.model.get_input_embeddings().weight, target.lm_head.weight,
                            stack_blocks([(features, make_blocks(tokens, anchors, BLOCK, mask_id, features.shape[0]))],
                                         mask_id))
    for row, (anchor, length) in enumerate(zip(anchors.tolist(), lengths.tolist())):
        drafts = TorchDraftSession(drafter, target).draft(features[:anchor], int(tokens[anchor]), length)
        assert packed[row, : length - 1].argmax(-1).tolist() == drafts
    # and the length matters: a 2-slot block's first draft differs from the 4-slot block's
    assert not torch.allclose(packed[0, 0], full[0, 0])


def test_restricted_vocab_logits_are_a_column_subset(pair):
    target, drafter = pair
    tokens = torch.randint(0, 264, (12,), generator=torch.Generator().manual_seed(1))
    _, features = target.forward(tokens[:-1].tolist(), target.new_cache(), TAPS)
    blocks = make_blocks(tokens, torch.tensor([1, 4]), BLOCK, drafter.config.mask_token_id, features.shape[0])
    vocab = torch.tensor([3, 17, 100, 263])
    batch = stack_blocks([(features, blocks)], drafter.config.mask_token_id)
    args = (drafter, target.model.get_input_embeddings().weight, target.lm_head.weight, batch)
    with torch.no_grad():
        rows = (drafter, args[1], args[2][vocab], batch)  # the head's rows for those ids only
        torch.testing.assert_close(block_logits(*rows), block_logits(*args)[..., vocab])


def test_padded_batch_equals_each_sequence_alone(pair):
    """Sequences of different lengths and anchor counts padded into one step give the same logits
    for their real blocks as alone, and padding blocks are marked as not real."""
    target, drafter = pair
    head, embed = target.lm_head.weight, target.model.get_input_embeddings().weight
    mask_id = drafter.config.mask_token_id
    items = []
    for seed, length, anchors in ((4, 14, [2, 5, 9]), (5, 9, [3])):
        tokens = torch.randint(0, 264, (length,), generator=torch.Generator().manual_seed(seed))
        _, features = target.forward(tokens[:-1].tolist(), target.new_cache(), TAPS)
        items.append((features, make_blocks(tokens, torch.tensor(anchors), BLOCK, mask_id, features.shape[0])))
    batch = stack_blocks(items, mask_id)
    assert batch.real_blocks.tolist() == [True, True, True, True, False, False]
    with torch.no_grad():
        together = block_logits(drafter, embed, head, batch)
        first = block_logits(drafter, embed, head, stack_blocks(items[:1], mask_id))
        second = block_logits(drafter, embed, head, stack_blocks(items[1:], mask_id))
    torch.testing.assert_close(together[:3], first, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(together[3:4], second, rtol=1e-4, atol=1e-5)


def test_greedy_acceptance_counts_the_matching_prefix_plus_bonus():
    logits = torch.zeros(3, 3, 5)
    for block, tokens in enumerate([[1, 2, 3], [1, 0, 3], [4, 4, 4]]):
        for slot, token in enumerate(tokens):
            logits[block, slot, token] = 1
    labels = torch.tensor([[1, 2, 3], [1, 2, 3], [1, IGNORE, IGNORE]])
    assert greedy_acceptance(logits, labels).tolist() == [4, 2, 1]


def test_the_decode_walk_anchors_each_block_after_the_last_accepted_token():
    # anchors 0 (3 tokens) -> 3 (2) -> 5 (1) -> 6 (1): 7 tokens in 4 steps; anchors 1, 2, 4 unvisited
    assert decode_walk(torch.tensor([3, 9, 9, 2, 9, 1, 1])) == (7, 4)
    assert decode_walk(torch.tensor([1, 1, 1])) == (3, 3)
    assert decode_walk(torch.empty(0)) == (0, 0)


def test_batched_generation_matches_single_sequence_decoding(pair):
    """Left-padded batch decoding gives each prompt's own greedy response and exact features."""
    target, _ = pair
    prompts = [[5, 6, 7], [40, 41, 42, 43, 44, 45, 46], [9]]
    results = generate_batch(target.model, prompts, max_new_tokens=6, stop_ids=set(), taps=TAPS)
    for prompt, (response, features) in zip(prompts, results):
        cache = target.new_cache()
        expected = []
        logits, _ = target.forward(prompt, cache)
        target.commit(cache, len(prompt))
        for _ in range(6):
            expected.append(int(logits[-1].argmax()))
            logits, _ = target.forward(expected[-1:], cache)
            target.commit(cache, 1)
        assert response == expected
        _, fresh = target.forward(prompt + response[:-1], target.new_cache(), TAPS)
        torch.testing.assert_close(features.float(), fresh, rtol=2e-2, atol=2e-2)  # stored as bf16

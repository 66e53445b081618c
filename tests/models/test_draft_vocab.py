"""Draft vocabularies: the restricted head drafts what the full head would among the listed ids,
the file round-trips with the drafter, and a bad file is one clear error."""

import json

import pytest
import torch
from factories import make_drafter
from torch import nn

from dflash_trt.errors import DFlashError
from dflash_trt.models.checkpoints import load_drafter, save_drafter
from dflash_trt.models.draft_vocab import (
    DRAFT_VOCAB_FILE,
    DraftHead,
    most_frequent,
    read_draft_vocab,
    write_draft_vocab,
)


def lm_head(vocab=50, hidden=16, bias=False):
    torch.manual_seed(0)
    return nn.Linear(hidden, vocab, bias=bias)


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("softcap", [None, 3.0])
def test_the_restricted_head_drafts_the_best_listed_token(bias, softcap):
    full = lm_head(bias=bias)
    ids = torch.tensor([2, 3, 11, 17, 30, 49])
    head = DraftHead(full, ids, multiplier=0.5, softcap=softcap)
    hidden = torch.randn(3, 7, 16)
    logits, tokens = head(hidden)
    with torch.no_grad():
        reference = full(hidden)  # the full head, every id outside the list masked away
        masked = torch.full_like(reference, float("-inf"))
        masked[..., ids] = reference[..., ids]
    assert logits.shape == (3, 7, 6) and head.size == 6
    assert torch.equal(tokens, masked.argmax(-1))
    scaled = reference[..., ids] * 0.5
    torch.testing.assert_close(logits, torch.tanh(scaled / softcap) * softcap if softcap else scaled)


def test_without_a_list_the_head_is_the_targets_own():
    full = lm_head()
    head = DraftHead(full, None)
    hidden = torch.randn(2, 5, 16)
    _, tokens = head(hidden)
    assert head.proj is full and head.size == 50
    assert torch.equal(tokens, full(hidden).argmax(-1))


def test_a_draft_vocabulary_round_trips_with_the_drafter(tmp_path):
    path = make_drafter(tmp_path / "d", draft_vocab=[259, 3, 40, 7])
    drafter = load_drafter(path)
    assert drafter.draft_vocab.tolist() == [3, 7, 40, 259]
    assert json.loads((path / DRAFT_VOCAB_FILE).read_text())["size"] == 4
    drafter.draft_vocab = None  # saving over a folder must not leave the old list behind
    save_drafter(drafter, path)
    assert not (path / DRAFT_VOCAB_FILE).exists() and load_drafter(path).draft_vocab is None


@pytest.mark.parametrize(
    "content, message",
    [
        ("not json", "not a draft vocabulary"),
        ('{"ids": [1, 2]}', "not a draft vocabulary"),
        ('{"token_ids": []}', "non-empty list"),
        ('{"token_ids": [1, -2]}', "non-empty list"),
        ('{"token_ids": [1, 2.5]}', "non-empty list"),
        ('{"token_ids": [4, 2]}', "sorted and unique"),
        ('{"token_ids": [2, 2]}', "sorted and unique"),
        ('{"token_ids": [1, 300]}', r"outside the target's vocabulary \(264 tokens\)"),
    ],
)
def test_a_bad_draft_vocabulary_is_one_clear_error(tmp_path, content, message):
    (tmp_path / DRAFT_VOCAB_FILE).write_text(content)
    with pytest.raises(DFlashError, match=message):
        read_draft_vocab(tmp_path, vocab_size=264)


def test_most_frequent_keeps_the_top_counts_and_never_an_unseen_id():
    counts = torch.tensor([0, 5, 9, 5, 0, 1, 7])
    assert most_frequent(counts, 3).tolist() == [1, 2, 6]  # ties at 5: the smaller id
    assert most_frequent(counts, 100).tolist() == [1, 2, 3, 5, 6]  # only the seen ids
    with pytest.raises(DFlashError, match="no response tokens"):
        most_frequent(torch.zeros(4, dtype=torch.long), 2)


def test_a_pair_whose_draft_vocabulary_leaves_the_targets_is_refused_before_loading(tiny_pairs, tmp_path):
    import shutil

    from dflash_trt.models.checkpoints import check_pair

    target, draft = tiny_pairs["qwen3"]
    draft = shutil.copytree(draft, tmp_path / "d")
    (draft / DRAFT_VOCAB_FILE).write_text('{"token_ids": [3, 264]}')  # the tiny targets have 264 ids
    with pytest.raises(DFlashError, match="token id 264 is outside"):
        check_pair(str(target), draft)


def test_both_backends_report_how_many_ids_the_drafter_may_propose(tiny_pairs, slots_bundles):
    from dflash_trt import LLM

    assert LLM(*map(str, tiny_pairs["llama"]), backend="torch").draft_vocab_size == 89  # its list
    assert LLM.from_bundle(slots_bundles["llama"]).draft_vocab_size == 89
    assert LLM(*map(str, tiny_pairs["qwen3"]), backend="torch").draft_vocab_size == 264  # no list: the target's


def test_adding_or_changing_a_draft_vocabulary_gives_a_fresh_cached_bundle(tiny_pairs, tmp_path):
    """LLM(..., backend="onnxruntime") caches its export by the checkpoints' files: a new list must
    not be served a bundle whose draft graph was traced without it."""
    import shutil

    from dflash_trt.runtime.bundles import bundle_key

    target, draft = tiny_pairs["qwen3"]
    draft = shutil.copytree(draft, tmp_path / "d")
    before = bundle_key(str(target), str(draft))
    write_draft_vocab(draft, torch.tensor([1, 2, 3]), "test")
    listed = bundle_key(str(target), str(draft))
    write_draft_vocab(draft, torch.tensor([1, 2, 3, 4]), "test")
    assert len({before, listed, bundle_key(str(target), str(draft))}) == 3

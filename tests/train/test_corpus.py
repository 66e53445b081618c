"""Corpus settings: the prompt mix option, the answering order, and resuming corpora built
before a setting existed."""

import json
import random
from dataclasses import asdict, replace

import pytest

from dflash_trt.errors import DFlashError
from dflash_trt.train.corpus import (
    SORT_WINDOW,
    CorpusConfig,
    answer_order,
    build_corpus,
    check_settings,
    parse_mix,
)


def test_parse_mix_names_shares_and_gives_chat_the_rest():
    assert parse_mix("code=0.5,math=0.2") == {"code_share": 0.5, "math_share": 0.2, "assistant_share": 0.0}
    assert parse_mix("code=0.25,math=0.25,assistant=0.25,chat=0.25")["assistant_share"] == 0.25


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("code=0.5,poems=0.5", "unknown source 'poems'"),
        ("code=half", "'code=half' is not source=share"),
        ("code=0.8,math=0.4", "add up to 1.2, not 1"),
        ("code=0.5,chat=0.2", "add up to 0.7, not 1"),
        ("code=-0.1", "negative"),
    ],
)
def test_parse_mix_refuses_bad_input_with_one_line(text, message):
    with pytest.raises(DFlashError, match=message):
        parse_mix(text)


def test_a_corpus_from_before_the_assistant_source_resumes_with_its_own_mix(tmp_path):
    old = CorpusConfig(taps=(1, 2), code_share=0.45, math_share=0.25, assistant_share=0.0)
    saved = {k: v for k, v in json.loads(json.dumps(asdict(old))).items() if k != "assistant_share"}
    meta = tmp_path / "corpus.json"
    meta.write_text(json.dumps(saved))
    check_settings(meta, old)  # the same mix: resumed
    with pytest.raises(DFlashError, match=r"assistant_share 0.0 \(now 0.35\).*code_share 0.45 \(now 0.35\)"):
        check_settings(meta, CorpusConfig(taps=(1, 2)))  # today's default mix is another corpus


def test_a_packed_corpus_keeps_every_sequence_and_drops_only_the_features(tmp_path):
    import torch

    from dflash_trt.train.corpus import pack_corpus
    from dflash_trt.train.data import read_shard, write_shard

    src = tmp_path / "corpus"
    src.mkdir()
    gen = torch.Generator().manual_seed(0)
    for shard in range(2):
        prompts = [torch.randint(0, 500, (3 + i,), generator=gen).tolist() for i in range(4)]
        results = []
        for prompt in prompts:
            response = torch.randint(0, 500, (5,), generator=gen).tolist()
            results.append((response, torch.randn(len(prompt) + 4, 6).to(torch.bfloat16)))
        write_shard(src / f"shard-{shard:05d}.safetensors", prompts, results)
    meta = asdict(CorpusConfig(taps=(1, 2)))
    (src / "corpus.json").write_text(json.dumps(meta))
    (src / "prompts.jsonl").write_text('{"prompt": "hi"}\n')
    (src / "split.json").write_text('{"val_share": 0.05, "shards": [], "validation": []}\n')

    assert pack_corpus(src, tmp_path / "packed") == 8
    packed = tmp_path / "packed"
    assert json.loads((packed / "corpus.json").read_text()) == {**json.loads(json.dumps(meta)), "store_features": False}
    for name in ("prompts.jsonl", "split.json"):
        assert (packed / name).read_text() == (src / name).read_text()
    for shard in sorted(src.glob("shard-*")):
        before, after = read_shard(shard), read_shard(packed / shard.name)
        assert [(s["tokens"].tolist(), s["prompt_len"]) for s in before] == [
            (s["tokens"].tolist(), s["prompt_len"]) for s in after
        ]
        assert all(s["features"] is not None for s in before) and all(s["features"] is None for s in after)
    with pytest.raises(DFlashError, match="already exists"):
        pack_corpus(src, packed)
    with pytest.raises(DFlashError, match="not a corpus"):
        pack_corpus(tmp_path / "nothing", tmp_path / "other")
    assert not (tmp_path / "other").exists() and not list(tmp_path.glob("*.tmp"))


def test_answer_order_sorts_prompts_by_length_within_windows_of_the_list():
    config = CorpusConfig(taps=(1,), batch_size=3)
    rng = random.Random(0)
    lengths = [rng.randrange(5, 300) for _ in range(3 * SORT_WINDOW * 2 + 4)]
    batches = answer_order(lengths, config)
    flat = [i for batch in batches for i in batch]
    assert sorted(flat) == list(range(len(lengths)))  # every prompt answered once
    assert [len(batch) for batch in batches] == [3] * (len(batches) - 1) + [len(lengths) % 3 or 3]
    window = 3 * SORT_WINDOW
    for begin in range(0, len(lengths), window):
        chunk = flat[begin : begin + window]
        assert set(chunk) == set(range(begin, min(len(lengths), begin + window)))  # a slice of the list
        assert [lengths[i] for i in chunk] == sorted(lengths[i] for i in chunk)
    in_order = answer_order(lengths, replace(config, length_sorted=False))
    assert [i for batch in in_order for i in batch] == list(range(len(lengths)))


def _answered(corpus_dir, prompts, tokenizer):
    """Index in `prompts` of each sequence of the corpus, in shard order."""
    from dflash_trt.models.chat import encode_prompt
    from dflash_trt.train.trainer import load_corpus

    encoded = [encode_prompt(tokenizer, p) for p in prompts]
    return [encoded.index(seq["tokens"][: seq["prompt_len"]].tolist()) for seq in load_corpus(corpus_dir)]


@pytest.mark.parametrize("legacy", [False, True])
def test_a_corpus_is_answered_in_its_own_order_and_an_older_one_resumes_in_list_order(tiny_pairs, tmp_path, legacy):
    from dflash_trt.models.checkpoints import load_target

    target, tokenizer = load_target(str(tiny_pairs["llama"][0]))
    prompts = ["a" * n for n in (9, 2, 7, 1, 5, 3)]  # one byte token per character
    config = CorpusConfig(taps=(1, 2), num_prompts=len(prompts), batch_size=2, max_new_tokens=2)
    meta = json.loads(json.dumps(asdict(config)))
    if legacy:  # written before the setting existed
        del meta["length_sorted"]
    (tmp_path / "corpus.json").write_text(json.dumps(meta))
    (tmp_path / "prompts.jsonl").write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts))

    build_corpus(target, tokenizer, tmp_path, config)  # the CLI's config: length_sorted by default
    assert _answered(tmp_path, prompts, tokenizer) == ([0, 1, 2, 3, 4, 5] if legacy else [3, 1, 5, 4, 2, 0])
    assert json.loads((tmp_path / "corpus.json").read_text()) == meta  # settings untouched

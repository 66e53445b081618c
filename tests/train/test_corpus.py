"""Corpus settings: the prompt mix option, and resuming corpora built before a setting existed."""

import json
from dataclasses import asdict

import pytest

from dflash_trt.errors import DFlashError
from dflash_trt.train.corpus import CorpusConfig, check_settings, parse_mix


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

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

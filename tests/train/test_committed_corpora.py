"""The tokens-only corpora committed under data/: readable by the trainer, consistent with their
own prompt list and settings, and with a held-out split that names real sequences."""

import json
from collections import Counter
from pathlib import Path

import pytest

from dflash_trt.train.trainer import SPLIT_FILE, load_corpus

DATA = Path(__file__).resolve().parents[2] / "data"
CORPORA = sorted(path.parent for path in DATA.glob("*/corpus.json"))


@pytest.fixture(scope="module", params=CORPORA, ids=lambda path: path.name)
def corpus(request):
    path = request.param
    return path, json.loads((path / "corpus.json").read_text()), load_corpus(path)


def test_there_is_a_committed_corpus():
    assert CORPORA, f"no corpus under {DATA}"


def test_a_committed_corpus_is_tokens_only_and_within_its_settings(corpus):
    path, meta, sequences = corpus
    assert meta["store_features"] is False
    prompts = (path / "prompts.jsonl").read_text().splitlines()
    assert len(prompts) == meta["num_prompts"] and len(sequences) <= len(prompts)
    for seq in sequences:
        assert seq["features"] is None
        assert 0 < seq["prompt_len"] < len(seq["tokens"]) <= seq["prompt_len"] + meta["max_new_tokens"]
    per_shard = Counter(seq["key"].split(":")[0] for seq in sequences)
    sizes = [per_shard[shard.stem] for shard in sorted(path.glob("shard-*.safetensors"))]
    assert all(n == meta["batch_size"] for n in sizes[:-1])  # whole batches, one shard each


def test_the_held_out_split_names_sequences_of_the_corpus(corpus):
    path, _, sequences = corpus
    split = json.loads((path / SPLIT_FILE).read_text())
    keys = {seq["key"] for seq in sequences}
    assert split["validation"] and set(split["validation"]) <= keys
    assert set(split["shards"]) == {key.split(":")[0] for key in keys}


@pytest.mark.slow
def test_shards_hold_the_chat_encoding_of_the_prompt_list_in_answering_order(corpus):
    from dflash_trt.models.chat import encode_prompt
    from dflash_trt.models.checkpoints import resolve_target
    from dflash_trt.models.embedded import DEFAULT_TARGET
    from dflash_trt.models.tokenizers import load_tokenizer
    from dflash_trt.train.corpus import CorpusConfig, answer_order, saved_settings

    path, meta, sequences = corpus
    tokenizer = load_tokenizer(resolve_target(DEFAULT_TARGET))
    prompts = [json.loads(line)["prompt"] for line in (path / "prompts.jsonl").read_text().splitlines()]
    encoded = [encode_prompt(tokenizer, prompt) for prompt in prompts]
    config = CorpusConfig(**{**saved_settings(path / "corpus.json"), "taps": tuple(meta["taps"])})
    order = [i for batch in answer_order([len(ids) for ids in encoded], config) for i in batch]
    step = max(1, len(sequences) // 40)  # a sample across every shard keeps this a few seconds
    for index in range(0, len(sequences), step):
        seq = sequences[index]
        assert seq["tokens"][: seq["prompt_len"]].tolist() == encoded[order[index]], seq["key"]

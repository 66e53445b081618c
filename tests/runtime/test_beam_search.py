"""LLM.beam_search (vLLM's beam search, runtime/beam_search.py) against a beam search written here over
the HF model's own logits, and the algorithm's rules on a hand-made model."""

from types import SimpleNamespace

import pytest
import torch
from factories import make_target
from transformers import AutoModelForCausalLM, GenerationConfig

from dflash_trt import LLM, BeamSearchParams, DFlashError
from dflash_trt.runtime.beam_search import beam_search

pytest.importorskip("dflash_trt._core", reason="dflash_trt._core is not built: run `bash scripts/setup.sh`")


def reference(model, prompt, width, max_tokens, eos, length_penalty=1.0):
    """vLLM's rules, one full forward per beam and step: (tokens, cumulative logprob, ended by EOS)."""
    def score(seq):
        tokens, cum, _ = seq
        return cum / ((len(tokens) - (tokens[-1] in eos)) ** length_penalty)

    beams, ended = [(list(prompt), 0.0, False)], []
    for _ in range(max_tokens):
        grown = []
        for tokens, cum, _ in beams:
            with torch.no_grad():
                logprobs = torch.log_softmax(model(torch.tensor([tokens])).logits[0, -1].float(), -1)
            top = torch.topk(logprobs, 2 * width)
            for logprob, token in zip(top.values.tolist(), top.indices.tolist(), strict=True):
                child = (tokens + [token], cum + logprob, token in eos)
                (ended if token in eos else grown).append(child)
        beams = sorted(grown, key=score, reverse=True)[:width]
    return sorted(ended + beams, key=score, reverse=True)[:width]


@pytest.mark.parametrize("pair, width, length_penalty", [("qwen3", 3, 1.0), ("small", 2, 0.5), ("small", 3, 2.0)])
def test_beam_search_equals_a_beam_search_over_the_hf_model_s_logits(tiny_pairs, tmp_path, pair, width,
                                                                       length_penalty):
    """"small": a 6-token vocabulary whose id 0 is EOS, among most steps' candidates, so sequences
    end by it too; a target alone (beam search drafts nothing)."""
    if pair == "qwen3":
        target, draft = (str(path) for path in tiny_pairs["qwen3"])
    else:
        target, draft = make_target(tmp_path / "t", "qwen3", seed=5, tokenizer=False, vocab_size=6), None
        GenerationConfig(eos_token_id=0).save_pretrained(target)
        target = str(target)
    llm = LLM(target, draft, backend="torch", max_batch=4)
    assert set(llm.eos_token_ids) == ({0} if pair == "small" else {258})  # the byte tokenizer's
    model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).eval()
    prompts = [[5, 6, 7, 8], [3, 1, 4]] if pair == "qwen3" else [[1, 2], [3, 4, 1, 2]]
    params = BeamSearchParams(beam_width=width, max_tokens=6, length_penalty=length_penalty)
    outputs = llm.beam_search(prompts, params)
    eos = set(llm.eos_token_ids)
    ended_by_eos = 0
    for prompt, output in zip(prompts, outputs, strict=True):
        want = reference(model, prompt, width, 6, eos, length_penalty)
        assert [s.tokens for s in output.sequences] == [tokens for tokens, _, _ in want]
        assert [s.cum_logprob for s in output.sequences] == pytest.approx([cum for _, cum, _ in want], abs=1e-4)
        assert [s.finish_reason for s in output.sequences] == ["stop" if e else "length" for _, _, e in want]
        ended_by_eos += sum(e for _, _, e in want)
    if pair == "small" and length_penalty < 1:  # short sequences favoured: some of the best end by EOS
        assert ended_by_eos


def test_each_step_prefills_only_the_new_token_of_a_beam(tiny_pairs):
    """Every step after the first finds its beam's prefix in a KV slot (prefix caching)."""
    target, draft = tiny_pairs["qwen3"]
    llm = LLM(str(target), str(draft), backend="torch", max_batch=8)
    llm.beam_search([[5, 6, 7, 8, 9, 10]], BeamSearchParams(beam_width=2, max_tokens=4))
    stats = llm._runner().stats()
    # 1 + 3 steps x 2 beams = 7 requests; the 6 after the first step reuse all but their last token
    assert stats["prompt_tokens_total"] - stats["prefix_cache_hits_total"] <= 6 + 6 * 1


def fake_step(tables):
    """A model given by hand: the last token -> {next token: logprob}; each output as generate's."""
    def generate(prompts, params):
        assert params.max_tokens == 1 and params.logprobs == 4
        return [SimpleNamespace(logprobs=[dict(tables[tokens[-1]])], finish_reason="length") for tokens in prompts]
    return generate


def test_the_rules_on_a_hand_made_model():
    """Width 2. From prompt [0]: 1 (-0.1), EOS 9 (-0.5), 2 (-1.0), 3 (-3.0). After 1: 2 (-0.2) ... After
    2: 9 (-0.1) ... Scores are cum / len: the sequence [0, 9] ended by EOS scores -0.5 / 1."""
    tables = {0: {1: -0.1, 9: -0.5, 2: -1.0, 3: -3.0}, 1: {2: -0.2, 3: -2.0, 9: -4.0, 4: -5.0},
              2: {9: -0.1, 4: -0.3, 1: -6.0, 3: -7.0}, 3: {4: -1, 1: -2, 2: -3, 9: -4},
              4: {4: -0.05, 1: -2, 2: -3, 9: -4}, 9: {4: -0.1, 1: -2, 2: -3, 3: -4}}
    out = beam_search(fake_step(tables), [[0]], BeamSearchParams(beam_width=2, max_tokens=2), {9})[0].sequences
    # step 1: live [0,1] (-0.1), [0,2] (-1.0); ended [0,9] (-0.5). step 2 from [0,1]: [0,1,2] -0.3,
    # [0,1,3] -2.1, ended [0,1,9] -4.1; from [0,2]: ended [0,2,9] -1.1, [0,2,4] -1.3.
    # scores: [0,1,2] -0.1, [0,9] -0.5 (length 1), [0,2,9] -0.55, [0,2,4] -0.433, [0,1,3] -0.7, [0,1,9] -2.05
    assert [(s.tokens, s.finish_reason) for s in out] == [([0, 1, 2], "length"), ([0, 2, 4], "length")]
    assert out[0].cum_logprob == pytest.approx(-0.3) and out[0].logprobs == [tables[0], tables[1]]
    # a length penalty of 0 ranks by the cumulative logprob alone: [0,1,2] -0.3, then [0,9] -0.5
    zero = beam_search(fake_step(tables), [[0]], BeamSearchParams(2, 2, length_penalty=0.0), {9})[0].sequences
    assert [(s.tokens, s.finish_reason) for s in zero] == [([0, 1, 2], "length"), ([0, 9], "stop")]
    # ignore_eos: EOS is a token like the others
    kept = beam_search(fake_step(tables), [[0]], BeamSearchParams(2, 2, ignore_eos=True), {9})[0].sequences
    assert [s.tokens for s in kept] == [[0, 1, 2], [0, 9, 4]] and {s.finish_reason for s in kept} == {"length"}


def test_bad_beam_search_requests_are_refused_before_any_work(tiny_pairs):
    target, draft = tiny_pairs["qwen3"]
    llm = LLM(str(target), str(draft), backend="torch", capacity=32)
    for fields, message in [(dict(beam_width=11, max_tokens=4), r"beam_width must be an integer in \[1, 10\]"),
                            (dict(beam_width=2, max_tokens=0), "max_tokens must be an integer >= 1"),
                            (dict(beam_width=2, max_tokens=2, temperature=-1), "temperature must be in")]:
        with pytest.raises(DFlashError, match=message):
            BeamSearchParams(**fields)
    with pytest.raises(DFlashError, match="exceeds the context capacity of 32"):
        llm.beam_search([[1] * 30], BeamSearchParams(beam_width=2, max_tokens=4))
    with pytest.raises(DFlashError, match="no prompts given"):
        llm.beam_search([], BeamSearchParams(beam_width=2, max_tokens=4))

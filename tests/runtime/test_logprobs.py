"""SamplingParams.logprobs: each output token's log-probability and the top-n tokens' under the target's
raw logits, decided inside the executor with the tokens (csrc/decide.h logprobs_row_by). Checked against
the HF target run over the whole sequence (torch.log_softmax in float64), through speculative and plain
decoding, greedy and seeded T>0, on the torch backend and a slots bundle on onnxruntime; and the kernel's
block code on host threads against the host rule."""

import numpy as np
import pytest
import torch
from factories import tiny_slots_pair

from dflash_trt import LLM, SamplingParams
from dflash_trt.errors import DFlashError


def oracle(llm, prompt_ids: list[int], tokens: list[int]) -> torch.Tensor:
    """log_softmax of the target's logits at each output token's position [len(tokens), vocab]."""
    ids = torch.tensor([prompt_ids + tokens])
    with torch.no_grad():
        logits = llm.target.model(ids).logits[0].double()
    return torch.log_softmax(logits[len(prompt_ids) - 1:-1], dim=-1)


def check(out, reference: torch.Tensor, top: int) -> None:
    """Per token: its own entry first, then the top ones in order (the dict holds the token once)."""
    assert out.logprobs is not None and len(out.logprobs) == len(out.token_ids)
    for j, (token, entries) in enumerate(zip(out.token_ids, out.logprobs, strict=True)):
        want = reference[j].topk(top).indices.tolist() if top else []
        assert list(entries) == [token] + [t for t in want if t != token]
        for t in entries:
            assert abs(entries[t] - reference[j, t].item()) < 2e-4


@pytest.fixture(scope="module")
def core():
    from dflash_trt.runtime.native import native_core

    return native_core()


@pytest.fixture(scope="module")
def torch_llm(small_vocab_pair):
    return LLM(*map(str, small_vocab_pair), backend="torch", block_size=4)


@pytest.mark.parametrize("speculative", [True, False])
@pytest.mark.parametrize("params", [dict(), dict(temperature=0.9, top_p=0.8, seed=3)], ids=["greedy", "sampled"])
def test_logprobs_equal_the_targets_log_softmax(torch_llm, speculative, params):
    prompt = [1, 2, 3, 4, 0, 2]
    out = torch_llm.generate([prompt], SamplingParams(max_tokens=12, logprobs=3, ignore_eos=True, **params),
                             speculative=speculative)[0]
    check(out, oracle(torch_llm, prompt, out.token_ids), 3)
    if speculative:
        assert out.metrics.mean_acceptance_length > 1  # drafts were kept: their logprobs came from a verify


def test_asking_for_logprobs_changes_no_token(torch_llm):
    params = SamplingParams(max_tokens=16, temperature=0.7, seed=11, ignore_eos=True)
    plain = torch_llm.generate([[3, 1, 4]], params)[0]
    asked = torch_llm.generate([[3, 1, 4]], SamplingParams(**{**params.__dict__, "logprobs": 0}))[0]
    assert asked.token_ids == plain.token_ids and plain.logprobs is None
    assert all(len(entries) == 1 for entries in asked.logprobs)  # 0: the token's own only


def test_a_slots_bundle_on_onnxruntime_gives_them_too(core, tmp_path):
    if not core.HAS_ORT_EXECUTOR:
        pytest.skip("dflash_trt._core was built without the onnxruntime executor")
    bundle, target, draft = tiny_slots_pair(tmp_path, "dense")
    llm = LLM.from_bundle(str(bundle))
    reference = LLM(target, draft, backend="torch")
    prompt = [5, 9, 2, 6]
    out = llm.generate([prompt], SamplingParams(max_tokens=8, logprobs=2, ignore_eos=True))[0]
    check(out, oracle(reference, prompt, out.token_ids), 2)


def test_bad_logprobs_are_one_line_errors(core):
    for bad in (-1, 21, 2.5, True):
        with pytest.raises(DFlashError, match="SamplingParams.logprobs must be an integer in"):
            SamplingParams(logprobs=bad)
    with pytest.raises(DFlashError, match=r"SamplingParams.logprobs must be -1 \(none\) or in \[0, 20\]"):
        core.SamplingParams(logprobs=21)


@pytest.mark.parametrize("threads", [1, 8, 64])
def test_the_block_code_gives_the_host_rules_logprobs(core, threads):
    rng = np.random.default_rng(threads)
    for vocab, top in ((5, 5), (1000, 0), (1000, 20), (3001, 7)):
        row = rng.normal(0.0, 3.0, (1, vocab)).astype(np.float32)
        row[0, 2] = row[0, 4] = row.max()  # a tie at the top: the smaller id first
        token = int(rng.integers(vocab))
        want = core.logprobs(row, token, top)
        assert core.block_logprobs(row, token, top, threads) == want
        logsm = torch.log_softmax(torch.from_numpy(row[0]).double(), dim=-1)
        assert abs(want[0][1] - logsm[token].item()) < 1e-5
        order = sorted(range(vocab), key=lambda i: (-row[0, i], i))[:top]
        assert [t for t, _ in want[1:]] == order

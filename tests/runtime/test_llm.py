"""The Python API: prompts, batches, streaming, errors before work, and T>0 exactness end to end."""

import pytest
import torch
from factories import make_dflash2_drafter, make_drafter, make_target
from scipy.stats import chisquare

from dflash_trt import LLM, DFlashError, SamplingParams
from dflash_trt.spec.sampling import target_probs


@pytest.fixture(scope="module")
def llm(tiny_pairs):
    target, draft = tiny_pairs["qwen3"]
    # pinned: a random drafter is almost never accepted, so the adaptive default would decode plainly
    return LLM(str(target), str(draft), block_size=4, backend="torch")


def test_string_prompts_get_the_chat_template(llm):
    out = llm.generate("hi", SamplingParams(max_tokens=3))[0]
    text = llm.tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False)
    assert out.prompt_token_ids == llm.tokenizer(text, add_special_tokens=False)["input_ids"]
    assert text.endswith("<|im_start|>assistant\n")


def test_a_batch_returns_one_output_per_prompt_in_order(llm):
    params = SamplingParams(max_tokens=8, ignore_eos=True)
    prompts = ["abc", [5, 6, 7], "zz top"]
    batch = llm.generate(prompts, params)
    assert [o.prompt for o in batch] == prompts
    for prompt, out in zip(prompts, batch):
        assert out.token_ids == llm.generate(prompt, params)[0].token_ids


def test_stream_grows_and_ends_with_the_final_output(llm):
    params = SamplingParams(max_tokens=12, ignore_eos=True)
    lengths, reasons = [], []
    for out in llm.stream("abc", params):
        lengths.append(len(out.token_ids))
        reasons.append(out.finish_reason)
    assert lengths == sorted(lengths) and lengths[-1] == 12
    assert reasons[-1] == "length" and set(reasons[:-1]) <= {None}
    assert out.token_ids == llm.generate("abc", params)[0].token_ids


def test_metrics_add_up(llm):
    out = llm.generate([9, 8, 7], SamplingParams(max_tokens=20, ignore_eos=True))[0]
    m = out.metrics
    assert m.block_size == 4 and m.output_tokens == 20
    # prefill token + τ per verify step; near the end the core shrinks a block to the tokens the request
    # may still emit, so the last token may come from a plain step (block 1, not a draft)
    assert 1 + sum(m.acceptance_lengths) in (19, 20)
    # the drafts the core proposed: 3 a step, fewer in the blocks it shrinks at the end
    assert 3 * (m.num_drafts - 2) < m.num_draft_tokens < 3 * m.num_drafts
    assert m.mean_acceptance_length == pytest.approx(sum(m.acceptance_lengths) / m.num_drafts)
    assert sum(m.histogram.values()) == m.num_drafts
    assert m.accepted_per_position == sorted(m.accepted_per_position, reverse=True)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(backend="vllm"), "backend 'vllm' is unknown"),
        pytest.param(dict(backend="tensorrt"), "backend 'tensorrt' runs TensorRT engines on an NVIDIA GPU, and none is visible",
                     marks=pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is visible")),
        (dict(backend="tensorrt", draft=None), "backend 'tensorrt' runs an exported .* bundle: pass draft=DIR"),
        (dict(backend="onnxruntime", draft=None), "backend 'onnxruntime' runs an exported .* bundle: pass draft=DIR"),
        (dict(block_size=1), "block_size must be an integer >= 2"),
    ],
)
def test_bad_construction_is_refused(tiny_pairs, kwargs, message):
    target, draft = tiny_pairs["qwen3"]
    with pytest.raises(DFlashError, match=message):
        LLM(str(target), **({"draft": str(draft)} | kwargs))


def test_the_verify_block_defaults_to_the_drafters_but_at_most_four_on_a_cpu(tiny_pairs, tmp_path):
    target, _ = tiny_pairs["qwen3"]
    wide = make_drafter(tmp_path / "wide", seed=3, block_size=8, target_layer_ids=[1, 2])
    assert LLM(str(target), str(wide), backend="torch").block_size == 4
    assert LLM(str(target), str(wide), block_size=8, backend="torch").block_size == 8
    assert LLM(str(target), str(tiny_pairs["qwen3"][1]), backend="torch").block_size == 4  # trained at 4: kept
    narrow = make_drafter(tmp_path / "narrow", seed=3, block_size=3, target_layer_ids=[1, 2])
    assert LLM(str(target), str(narrow), backend="torch").block_size == 3


def test_bad_requests_are_refused_before_any_work(llm, tiny_pairs):
    with pytest.raises(DFlashError, match="prompt is empty"):
        llm.generate([[]])
    with pytest.raises(DFlashError, match="token id 999 is outside"):
        llm.generate(["fine", [1, 999]])
    with pytest.raises(DFlashError, match="no prompts"):
        llm.generate([])
    no_draft = LLM(str(tiny_pairs["qwen3"][0]), draft=None, backend="torch")
    with pytest.raises(DFlashError, match="needs a drafter"):
        no_draft.generate("x", speculative=True)
    assert no_draft.generate("x", SamplingParams(max_tokens=2), speculative=False)[0].token_ids


def test_stop_strings_need_a_tokenizer(tmp_path):
    target = make_target(tmp_path / "t", "llama", tokenizer=False)
    llm = LLM(str(target), str(make_drafter(tmp_path / "d")), backend="torch")
    with pytest.raises(DFlashError, match="stop strings need a tokenizer"):
        llm.generate([1, 2], SamplingParams(stop=["x"]))
    with pytest.raises(DFlashError, match="pass prompts as lists of token ids"):
        llm.generate("text")


@pytest.mark.parametrize("draft_vocab, rule, method", [
    (None, "point-mass", "dflash"), ([1, 4, 6], "point-mass", "dflash"),
    (None, "drafter", "dflash"), ([1, 4, 6], "drafter", "dflash"), (None, "drafter", "dflash2")])
def test_sampled_speculative_output_follows_the_target_distribution(tmp_path, draft_vocab, rule, method):
    """T>0 end to end on a vocabulary of 8: the second token (the first one a verify step emits)
    has the exact marginal sum_t1 p(t1) p(t2 | t1) of the target, also when the drafter may
    propose only 3 of the 8 ids (a draft vocabulary), under either draft rule, and with drafts walked
    through a DFlash2 selector's distribution."""
    target = make_target(tmp_path / "t", "qwen3", vocab_size=8, tokenizer=False, seed=3)
    if method == "dflash2":
        draft = make_dflash2_drafter(tmp_path / "d", seed=4, vocab_size=8, mask_token_id=7)
    else:
        draft = make_drafter(tmp_path / "d", mask_token_id=7, seed=4, draft_vocab=draft_vocab)
    # pinned: adaptive steps might never draft
    llm = LLM(str(target), str(draft), block_size=4, backend="torch", draft_rule=rule)
    # 3 tokens: the core verifies the second with one draft (a last token alone would verify no draft)
    params = dict(temperature=1.5, top_k=6, max_tokens=3, ignore_eos=True)
    prompt = [1, 2, 3]
    model = llm.target.model
    with torch.no_grad():
        p1 = target_probs(model(torch.tensor([prompt])).logits[0, -1], SamplingParams(**params))
        marginal = torch.zeros(8)
        for t1 in range(8):
            if p1[t1] > 0:
                logits = model(torch.tensor([prompt + [t1]])).logits[0, -1]
                marginal += p1[t1] * target_probs(logits, SamplingParams(**params))
    counts = torch.zeros(8)
    accepted = 0
    for seed in range(1500):
        *_, out = llm.stream(prompt, SamplingParams(**params, seed=seed))  # through the core
        counts[out.token_ids[1]] += 1
        accepted += out.metrics.acceptance_lengths[0] > 1
    support = marginal > 1e-9
    assert counts[~support].sum() == 0
    assert chisquare(counts[support].numpy(), (marginal[support] * counts.sum()).numpy()).pvalue > 1e-3
    assert 0 < accepted < 1500  # both the accept and the reject paths were taken
    if draft_vocab:
        assert llm.draft_head.size == len(draft_vocab)  # the restricted head was in use


def test_the_auto_backend_is_onnxruntime_for_a_pair_on_the_cpu_and_torch_for_a_target_alone(tiny_pairs, monkeypatch):
    from dflash_trt.runtime.llm import AUTO, resolve_backend

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)

    target, draft = map(str, tiny_pairs["qwen3"])
    assert resolve_backend(AUTO, target, draft) == "onnxruntime"
    assert resolve_backend(AUTO, target, None) == "torch"
    assert resolve_backend(AUTO, target, AUTO) == "torch"  # no drafter ships for a local checkpoint
    assert resolve_backend(AUTO, "smollm2-135m", AUTO) == "onnxruntime"  # the embedded pair's shipped drafter
    assert resolve_backend("torch", target, draft) == "torch"
    # a placement asked for is the torch backend's; int4 weights run on onnxruntime
    assert resolve_backend(AUTO, target, draft, device="cpu") == "torch"
    assert resolve_backend(AUTO, target, draft, dtype="float16") == "torch"
    assert resolve_backend(AUTO, target, draft, quantized=True) == "onnxruntime"
    # where PyTorch sees a GPU: the torch graphs on CUDA (the GPU path this build has without TensorRT)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_backend(AUTO, target, draft) == "torch"
    assert resolve_backend(AUTO, target, draft, quantized=True) == "onnxruntime"
    assert resolve_backend("onnxruntime", target, draft) == "onnxruntime"


def test_llm_resolves_the_auto_backend_itself(tiny_pairs, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    target, _ = map(str, tiny_pairs["qwen3"])
    assert LLM(target, draft=None).backend == "torch"  # a target alone
    assert LLM(target, draft=None, device="cpu", dtype="float16").backend == "torch"


def test_the_output_names_the_stop_string_or_stop_token_that_ended_it(llm):
    """vLLM's RequestOutput.stop_reason: the stop string (its text cut before it), a stop token id, None
    for a length. The reply is held to one token by its bias, so its text is that token's, repeated."""
    token = llm.tokenizer.encode("hello", add_special_tokens=False)[0]
    piece = llm.tokenizer.decode([token])
    held = SamplingParams(max_tokens=6, ignore_eos=True, logit_bias={token: 100})
    free = llm.generate("abc", held)[0]
    assert free.finish_reason == "length" and free.stop_reason is None and free.text == piece * 6
    cut = llm.generate("abc", SamplingParams(**{**held.__dict__, "stop": [piece * 2]}))[0]
    assert (cut.finish_reason, cut.stop_reason, cut.text) == ("stop", piece * 2, "")
    ended = llm.generate("abc", SamplingParams(**{**held.__dict__, "stop_token_ids": [token]}))[0]
    assert (ended.finish_reason, ended.stop_reason, ended.token_ids) == ("stop", token, [token])

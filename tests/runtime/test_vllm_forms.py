"""vLLM's forms of the offline API: prompt dicts (TextPrompt {"prompt": text}, tokenized as it is with
no chat template; TokensPrompt {"prompt_token_ids": ids}), the `sampling_params=` keyword and
`use_tqdm`. The oracle for a dict is the same request in our own forms (token-id lists)."""

import dataclasses

import pytest

from dflash_trt import LLM, DFlashError, SamplingParams

pytest.importorskip("dflash_trt._core", reason="dflash_trt._core is not built: run `bash scripts/setup.sh`")

PARAMS = SamplingParams(max_tokens=8, ignore_eos=True)


@pytest.fixture(scope="module")
def llm(tiny_pairs):
    target, draft = tiny_pairs["qwen3"]
    return LLM(str(target), str(draft), max_batch=3, backend="torch")


def test_a_text_prompt_dict_is_tokenized_as_it_is_without_the_chat_template(llm):
    raw = llm.tokenizer("hello there")["input_ids"]
    assert llm.encode("hello there") != raw, "a plain string gets the chat template"
    out, = llm.generate({"prompt": "hello there"}, PARAMS)
    assert out.prompt == "hello there" and out.prompt_token_ids == raw
    assert out.token_ids == llm.generate([raw], PARAMS)[0].token_ids


def test_a_tokens_prompt_dict_is_its_ids_and_dicts_mix_with_the_other_forms(llm):
    ids = [5, 6, 7]
    outs = llm.generate([{"prompt_token_ids": ids}, ids, "abc", {"prompt": "abc"}], PARAMS)
    assert outs[0].prompt == ids and outs[0].token_ids == outs[1].token_ids
    assert outs[2].prompt_token_ids == llm.encode("abc") and outs[3].prompt_token_ids == llm.tokenizer("abc")["input_ids"]
    streamed = list(llm.stream({"prompt_token_ids": ids}, PARAMS))[-1]
    assert streamed.token_ids == outs[1].token_ids


@pytest.mark.parametrize("prompt, message", [
    ({"prompt": "a", "multi_modal_data": {}}, "prompt key 'multi_modal_data' is not supported"),
    ({"prompt": "a", "prompt_token_ids": [1]}, "one of 'prompt' (text) and 'prompt_token_ids', not both"),
    ({}, "one of 'prompt' (text) and 'prompt_token_ids'"),
    ({"prompt": 5}, "prompt['prompt'] must be a string, got int"),
    ({"prompt_token_ids": "abc"}, "prompt['prompt_token_ids'] must be a list of token ids, got str"),
    ({"prompt_token_ids": [1, 99999]}, "prompt token id 99999 is outside the vocabulary"),
])
def test_a_bad_prompt_dict_is_one_line_before_any_work(llm, prompt, message):
    with pytest.raises(DFlashError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        llm.generate([[5, 6], prompt], PARAMS)
    assert not llm._runner().has_work


def test_sampling_params_is_vllm_s_name_for_params(llm):
    ids = [[5, 6, 7], [9, 8]]
    want = [o.token_ids for o in llm.generate(ids, PARAMS)]
    assert [o.token_ids for o in llm.generate(ids, sampling_params=PARAMS)] == want
    assert llm.chat([{"role": "user", "content": "hi"}], sampling_params=PARAMS)[0].token_ids == \
        llm.chat([{"role": "user", "content": "hi"}], PARAMS)[0].token_ids
    with pytest.raises(DFlashError, match="params or sampling_params"):
        llm.generate(ids, PARAMS, sampling_params=PARAMS)


def test_use_tqdm_shows_the_prompts_finishing_and_changes_nothing(llm, capsys):
    ids = [[5, 6, 7], [9, 8], [1, 2], [3]]  # more than the 3 slots: they finish over several steps
    want = [o.token_ids for o in llm.generate(ids, PARAMS)]
    assert capsys.readouterr().err == ""
    assert [o.token_ids for o in llm.generate(ids, PARAMS, use_tqdm=True)] == want
    shown = capsys.readouterr().err
    assert "Processed prompts: 100%" in shown and "4/4" in shown


def test_an_output_has_vllm_s_shape_too(llm):
    out, = llm.generate([[5, 6, 7]], SamplingParams(max_tokens=6, ignore_eos=True, logprobs=1))
    completion, = out.outputs
    assert (completion.index, completion.text, completion.token_ids) == (0, out.text, out.token_ids)
    assert (completion.finish_reason, completion.stop_reason, out.finished) == ("length", None, True)
    assert completion.cumulative_logprob == pytest.approx(sum(e[t] for t, e in zip(out.token_ids, out.logprobs)))
    assert completion.cumulative_logprob < 0
    assert llm.generate([[5, 6, 7]], PARAMS)[0].outputs[0].cumulative_logprob is None  # none asked


def test_n_samples_of_a_prompt_are_its_requests_seeded_seed_plus_i(llm):
    """vLLM's SamplingParams.n: each sample a request of its own, sample i seeded seed + i (the OpenAI
    front's rule for choices), folded into the prompt's output; prompts with other n beside it."""
    sampled = SamplingParams(max_tokens=8, temperature=0.9, seed=11, ignore_eos=True)
    outs = llm.generate([[5, 6, 7], [9, 8]], [dataclasses.replace(sampled, n=3), sampled], use_tqdm=False)
    assert len(outs) == 2 and len(outs[1].outputs) == 1
    want = [llm.generate([[5, 6, 7]], dataclasses.replace(sampled, seed=11 + i))[0].token_ids for i in range(3)]
    assert [c.token_ids for c in outs[0].outputs] == want and [c.index for c in outs[0].outputs] == [0, 1, 2]
    assert outs[0].token_ids == want[0] and len(set(map(tuple, want))) > 1
    assert outs[1].token_ids == llm.generate([[9, 8]], sampled)[0].token_ids
    unseeded = llm.generate([[5, 6, 7]], SamplingParams(max_tokens=8, temperature=0.9, n=4, ignore_eos=True))[0]
    assert len({tuple(c.token_ids) for c in unseeded.outputs}) > 1, "independent draws"


def test_n_is_generate_s_alone(llm):
    from dflash_trt.runtime.engine import Engine

    with pytest.raises(DFlashError, match="n 2: a request here is one sequence"):
        list(llm.stream([5, 6], SamplingParams(n=2)))
    engine = Engine(llm, max_batch=2)
    try:
        with pytest.raises(DFlashError, match="n 2: a request here is one sequence"):
            engine.add_request([5, 6], SamplingParams(n=2))
    finally:
        engine.shutdown()
    with pytest.raises(DFlashError, match="SamplingParams.n must be an integer in"):
        SamplingParams(n=0)


def test_vllm_s_names_for_the_llm_s_settings(tiny_pairs):
    target, draft = map(str, tiny_pairs["qwen3"])
    ours = LLM(target, draft, backend="torch", block_size=4, capacity=128, max_batch=2, prefix_caching=False)
    theirs = LLM(model=target, backend="torch", max_model_len=128, max_num_seqs=2, enable_prefix_caching=False,
                 speculative_config={"method": "dflash", "model": draft, "num_speculative_tokens": 3})
    for llm in (ours, theirs):
        assert (llm.block_size, llm.adaptive, llm.capacity, llm.max_batch, llm.prefix_caching) == (4, False, 128, 2, False)
    assert theirs.generate([[5, 6, 7]], PARAMS)[0].token_ids == ours.generate([[5, 6, 7]], PARAMS)[0].token_ids
    assert theirs.get_tokenizer() is theirs.tokenizer


@pytest.mark.parametrize("kwargs, message", [
    ({"capacity": 64, "max_model_len": 128}, "pass capacity once: capacity or max_model_len"),
    ({"max_batch": 3, "max_num_seqs": 2}, "pass max_batch once"),
    ({"draft": "x", "speculative_config": {"model": "y"}}, "pass the drafter once: draft or speculative_config's model"),
    ({"block_size": 4, "speculative_config": {"num_speculative_tokens": 3}}, "pass the block once"),
    ({"speculative_config": {"method": "eagle3"}}, "method 'eagle3': dflash-trt runs dflash drafters"),
    ({"speculative_config": {"num_speculative_tokens": 0}}, "num_speculative_tokens must be an integer >= 1"),
    ({"speculative_config": {"draft_tensor_parallel_size": 1}}, "'draft_tensor_parallel_size' is not supported"),
])
def test_a_setting_given_twice_or_a_config_it_cannot_honour_is_one_line(tiny_pairs, kwargs, message):
    with pytest.raises(DFlashError, match=message):
        LLM(model=str(tiny_pairs["qwen3"][0]), backend="torch", **kwargs)


def test_use_tqdm_may_be_the_bar_s_class_and_lora_request_only_none(llm):
    made = []

    class Bar:  # tqdm's signature, as vLLM lets a caller pass its own
        def __init__(self, total, desc, unit):
            made.append(self)
            self.total, self.done = total, 0

        def update(self, n):
            self.done += n

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    outs = llm.generate([[5, 6], [7]], SamplingParams(max_tokens=4, n=2, temperature=0.5, seed=1), use_tqdm=Bar,
                        lora_request=None)
    assert len(outs) == 2 and [(bar.total, bar.done) for bar in made] == [(4, 4)]  # every sample counted
    with pytest.raises(DFlashError, match="lora_request: LoRA adapters are not supported"):
        llm.generate([[5, 6]], PARAMS, lora_request=object())


def test_an_llm_seed_makes_unseeded_sampling_repeat_run_to_run(tiny_pairs):
    """vLLM's LLM(seed=): requests without a seed draw from it, so the same calls on a new LLM sample the
    same tokens; later calls (and a runner made anew when the block is pinned) draw afresh; a request's
    own seed is unaffected."""
    target, draft = map(str, tiny_pairs["qwen3"])
    unseeded, own = SamplingParams(max_tokens=10, temperature=1.0), SamplingParams(max_tokens=10, temperature=1.0, seed=3)
    prompts = [[5, 6, 7], [9, 8]]

    def calls(seed):
        llm = LLM(target, draft, backend="torch", seed=seed)
        first = [o.token_ids for o in llm.generate(prompts, unseeded)]
        second = [o.token_ids for o in llm.generate(prompts, unseeded)]
        llm.block_size = 4  # a new runner
        third = [o.token_ids for o in llm.generate(prompts, unseeded)]
        return first, second, third, llm.generate(prompts[0], own)[0].token_ids

    a, b = calls(7), calls(7)
    from dflash_trt.runtime.engine import Engine

    engines = [Engine(LLM(target, draft, backend="torch", seed=7)) for _ in range(2)]  # an Engine draws from it too
    try:
        first_engine, second_engine = ([o.token_ids for o in e.generate(prompts, unseeded)] for e in engines)
        assert first_engine == second_engine
    finally:
        for e in engines:
            e.shutdown()
    assert a == b
    first, second, third, seeded = a
    assert first != second and third not in (first, second)
    other = calls(8)
    assert other[0] != first and other[3] == seeded
    with pytest.raises(DFlashError, match=r"seed must be an integer in \[0, 2\*\*64\) or None, got -1"):
        LLM(target, draft, backend="torch", seed=-1)

"""Sampling parameters as the Triton model receives them (JSON) -> SamplingParams or a named refusal."""

import json

import pytest

from dflash_trt.serve.requests import (
    RequestError,
    beam_search_params,
    check_template_reads,
    parse_sampling,
    template_kwargs,
    template_documents,
    template_tools,
)
from dflash_trt.spec.sampling import SamplingParams


def test_defaults_fill_the_context_and_sample_at_openais_temperature():
    params = parse_sampling(None, prompt_tokens=10, capacity=64)
    assert params.max_tokens == 54 and params.temperature == 1.0 and (params.top_p, params.top_k) == (1.0, 0)


def test_the_models_generation_defaults_fill_what_a_request_leaves_out():
    defaults = {"temperature": 0.6, "top_p": 0.95, "top_k": 20, "min_p": 0.05}
    params = parse_sampling(json.dumps({"top_p": 0.5, "temperature": 0}), 4, 64, defaults)
    assert (params.temperature, params.top_p, params.top_k, params.min_p) == (0, 0.5, 20, 0.05)
    params = parse_sampling(None, 4, 64, {"repetition_penalty": 1.1})  # temperature: still OpenAI's
    assert (params.temperature, params.repetition_penalty) == (1.0, 1.1)


def test_a_default_max_tokens_caps_every_request_as_vllms_does():
    defaults = {"max_tokens": 8}
    assert [parse_sampling(text, 4, 64, defaults).max_tokens
            for text in (None, '{"max_tokens": 30}', '{"max_tokens": 5}')] == [8, 8, 5]
    with pytest.raises(RequestError) as err:  # beyond the context is refused first, as without the cap
        parse_sampling('{"max_tokens": 61}', 4, 64, defaults)
    assert err.value.param == "max_tokens"


def test_fields_pass_through():
    text = json.dumps({"max_tokens": 5, "temperature": 0.7, "top_p": 0.9, "top_k": -1, "seed": 3, "stop": ["\n"]})
    params = parse_sampling(text, 4, 64)
    assert (params.max_tokens, params.temperature, params.top_p, params.top_k, params.seed, params.stop) == \
        (5, 0.7, 0.9, 0, 3, ("\n",))


@pytest.mark.parametrize("raw, param", [
    ('{"temperature": -1}', "temperature"),
    ('{"top_p": 0}', "top_p"),
    ('{"top_p": 1.5}', "top_p"),
    ('{"max_tokens": 0}', "max_tokens"),
    ('{"max_tokens": 61}', "max_tokens"),  # 4 + 61 > 64
    ('{"max_tokens": "5"}', "max_tokens"),
    ('{"max_tokens": true}', "max_tokens"),
    ('{"top_k": 1.5}', "top_k"),
    ('{"stop": [1]}', "stop"),
    ('{"stop": [""]}', "stop"),
    ('{"frequency": 1}', "frequency"),
    ('[1]', "sampling_parameters"),
    ('{oops', "sampling_parameters"),
])
def test_refusals_name_the_field(raw, param):
    with pytest.raises(RequestError) as err:
        parse_sampling(raw, 4, 64)
    assert err.value.param == param and err.value.status == 400


def test_prompt_over_capacity_is_the_prompts_fault():
    with pytest.raises(RequestError) as err:
        parse_sampling('{"max_tokens": 1}', 64, 64)
    assert err.value.param == "prompt"


def test_error_travels_as_json():
    err = RequestError("top_p", "top_p must be in (0, 1]")
    assert RequestError.from_json(err.to_json()) == err
    assert RequestError.from_json("Stub process is not healthy") is None


@pytest.mark.parametrize("field, value, rule", [("top_p", 1.5, "in (0, 1]"), ("temperature", -0.5, ">= 0"),
                                                ("top_k", -2, "an integer in [0, 2**31)"),
                                                # float32 logits divided by less overflow to inf
                                                ("repetition_penalty", 1e-07, "in [1e-6, 2]")])
def test_one_validator_refuses_alike_through_the_api_the_cli_triton_and_the_openai_front(field, value, rule):
    """SamplingParams' own check is the only one: each entry point says the same line about the field."""
    from click.testing import CliRunner
    from fastapi.testclient import TestClient
    from test_front import FakeTriton

    from dflash_trt import DFlashError, SamplingParams
    from dflash_trt.cli import main
    from dflash_trt.serve.openai_api import FrontSettings, create_app

    line = f"{field} must be {rule}, got {value!r}"
    with pytest.raises(DFlashError) as api:
        SamplingParams(**{field: value})
    assert str(api.value) == f"SamplingParams.{line}"
    cli = CliRunner().invoke(main, ["generate", f"--{field.replace('_', '-')}", str(value), "hi"])
    assert cli.exit_code == 2 and f"SamplingParams.{line}" in cli.stderr
    with pytest.raises(RequestError) as triton:
        parse_sampling(json.dumps({field: value}), 4, 64)
    body = {"model": "m", "messages": [{"role": "user", "content": "x"}], field: value}
    front = TestClient(create_app(FrontSettings("m"), FakeTriton())).post("/v1/chat/completions", json=body)
    error = front.json()["error"]
    assert triton.value == RequestError(error["param"], error["message"]) == RequestError(field, line)
    assert front.status_code == 400


def test_chat_template_kwargs_are_a_json_object_of_template_variables():
    assert template_kwargs(None) == {} and template_kwargs('{"enable_thinking": false}') == {"enable_thinking": False}
    for text, message in (("[1]", "must be a JSON object"), ("{oops", "not valid JSON"),
                          ('{"tokenize": true}', "may not set 'tokenize'")):
        with pytest.raises(RequestError) as err:
            template_kwargs(text)
        assert err.value.param == "chat_template_kwargs" and message in err.value.message


def test_tools_reach_only_a_template_that_renders_them():
    tools = [{"type": "function", "function": {"name": "f"}}]
    assert template_tools(json.dumps(tools), "{% for t in tools %}{{ t }}{% endfor %}") == tools
    assert template_tools(None, None) is None and template_tools("[]", "{{ x }}") is None
    for text, template, words in [("[1]", "tools", "a JSON list of objects"), ("{", "tools", "not valid JSON"),
                                  (json.dumps(tools), "{{ messages }}", "does not render tools"),
                                  (json.dumps(tools), None, "does not render tools")]:
        with pytest.raises(RequestError) as err:
            template_tools(text, template)
        assert err.value.param == "tools" and words in err.value.message


def test_a_named_template_variable_reaches_only_a_template_that_reads_it():
    check_template_reads({"reasoning_effort": "low"}, "{{ reasoning_effort }}")
    check_template_reads({"enable_thinking": False}, "{{ messages }}")  # a chat_template_kwargs variable: free
    for template in ("{{ messages }}", None):
        with pytest.raises(RequestError) as err:
            check_template_reads({"reasoning_effort": "low"}, template)
        assert err.value.param == "reasoning_effort" and "reads no reasoning_effort" in err.value.message


def test_documents_reach_only_a_template_that_renders_them():
    docs = [{"title": "A", "text": "alpha"}]
    assert template_documents(json.dumps(docs), "{% for d in documents %}{{ d.text }}{% endfor %}") == docs
    assert template_documents(None, None) is None and template_documents("[]", "{{ x }}") is None
    for text, template, words in [("[1]", "documents", "a JSON list of objects of strings"),
                                  ('[{"n": 1}]', "documents", "a JSON list of objects of strings"),
                                  ("{", "documents", "not valid JSON"),
                                  (json.dumps(docs), "{{ messages }}", "does not render documents"),
                                  (json.dumps(docs), None, "does not render documents")]:
        with pytest.raises(RequestError) as err:
            template_documents(text, template)
        assert err.value.param == "documents" and words in err.value.message


def test_a_truncated_prompt_counts_only_the_tokens_it_keeps():
    params = parse_sampling('{"truncate_prompt_tokens": 10}', 100, 64)  # 100 tokens, the last 10 kept
    assert params.max_tokens == 54 and params.truncate_prompt_tokens == 10
    with pytest.raises(RequestError) as err:
        parse_sampling('{"truncate_prompt_tokens": 10, "max_tokens": 55}', 100, 64)
    assert err.value.param == "max_tokens"


def test_a_beam_search_refusal_names_the_field_in_either_form():
    """What the front and the Triton model both refuse a beam search for: a sampling field it does not
    take, or its own width and length penalty."""
    assert beam_search_params(SamplingParams(max_tokens=5), 3, 0.5).beam_width == 3
    for params, width, penalty, field in [(SamplingParams(seed=1), 2, 1.0, "seed"),
                                          (SamplingParams(stop=["x"]), 2, 1.0, "stop"),
                                          (SamplingParams(), 11, 1.0, "beam_width"),
                                          (SamplingParams(), 2, "long", "length_penalty")]:
        with pytest.raises(RequestError) as err:
            beam_search_params(params, width, penalty)
        assert err.value.param == field and err.value.status == 400

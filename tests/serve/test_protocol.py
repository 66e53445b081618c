"""OpenAI request bodies -> Triton inputs, or a refusal naming the field."""

import json

import pytest
from body_parsing import parse

from dflash_trt.serve.protocol import ChatRequest, CompletionRequest
from dflash_trt.serve.requests import RequestError


def chat(**fields):
    return json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}], **fields}).encode()


def test_chat_inputs():
    request = parse(chat(max_tokens=5, temperature=0.5, seed=1, stop="x", stream=True,
                         stream_options={"include_usage": True}, user="ignored"), ChatRequest)
    inputs = request.triton_inputs()
    assert json.loads(inputs["messages"]) == [{"role": "user", "content": "hi"}]
    assert json.loads(inputs["sampling_parameters"]) == {"max_tokens": 5, "temperature": 0.5, "seed": 1, "stop": "x"}
    assert request.stream and request.include_usage


def test_content_parts_are_joined_and_max_completion_tokens_wins():
    body = json.dumps({"model": "m", "max_tokens": 9, "max_completion_tokens": 3, "messages": [
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]}).encode()
    inputs = parse(body, ChatRequest).triton_inputs()
    assert json.loads(inputs["messages"])[0]["content"] == "ab"
    assert json.loads(inputs["sampling_parameters"]) == {"max_tokens": 3}


@pytest.mark.parametrize("prompt, key, value", [
    ("hello", "text_input", "hello"), (["hello"], "text_input", "hello"),
    ([1, 2, 3], "input_ids", [1, 2, 3]), ([[4, 5]], "input_ids", [4, 5]),
])
def test_completion_prompts(prompt, key, value):
    inputs = parse(json.dumps({"model": "m", "prompt": prompt}).encode(), CompletionRequest).triton_inputs()
    assert inputs[key] == value
    assert json.loads(inputs["sampling_parameters"]) == {"max_tokens": 16}  # OpenAI's default


@pytest.mark.parametrize("body, param", [
    (b"{not json", None),
    (b"[1, 2]", None),
    (json.dumps({"messages": [{"role": "user", "content": "x"}]}).encode(), "model"),
    (json.dumps({"model": "m"}).encode(), "messages"),
    (json.dumps({"model": "m", "messages": "hi"}).encode(), "messages"),
    (json.dumps({"model": "m", "messages": []}).encode(), "messages"),
    (json.dumps({"model": "m", "messages": [{"role": "wizard", "content": "x"}]}).encode(), "messages[0].role"),
    (json.dumps({"model": "m", "messages": [{"role": "user", "content": 5}]}).encode(), "messages[0].content"),
    (chat(temperature=-0.1), "temperature"),
    (chat(temperature="hot"), "temperature"),
    (chat(top_p=0), "top_p"),
    (chat(top_p=1.01), "top_p"),
    (chat(max_tokens=0), "max_tokens"),
    (chat(max_tokens=2.5), "max_tokens"),
    (chat(n=65), "n"),  # more than MAX_CHOICES
    (chat(stream="yes"), "stream"),
    (chat(logprobs="yes"), "logprobs"),
    (chat(logprobs=True, top_logprobs=21), "top_logprobs"),
    (chat(top_logprobs=2), "top_logprobs"),  # without logprobs: true
    (chat(seed="1"), "seed"),
    (chat(stop=[1]), "stop"),
    (chat(presence_penalty=2.5), "presence_penalty"),
    (chat(frequency_penalty="1"), "frequency_penalty"),
    (chat(repetition_penalty=0), "repetition_penalty"),
    (chat(logit_bias={"5": 101}), "logit_bias.5"),
    (chat(logit_bias={"x": 1}), "logit_bias.x"),
    (chat(min_tokens=-1), "min_tokens"),
    (chat(min_p=1.5), "min_p"),
])
def test_chat_refusals_name_the_field(body, param):
    with pytest.raises(RequestError) as err:
        parse(body, ChatRequest)
    assert err.value.status == 400 and err.value.param == param


@pytest.mark.parametrize("prompt", [[], [[1], []], [[]]])
def test_completion_refuses_empty_prompts(prompt):
    with pytest.raises(RequestError) as err:
        parse(json.dumps({"model": "m", "prompt": prompt}).encode(), CompletionRequest)
    assert err.value.param.startswith("prompt")


def test_several_prompts_are_n_choices_each():
    request = parse(json.dumps({"model": "m", "prompt": [[1, 2], [3]], "n": 2, "seed": 9, "echo": True}).encode(),
                    CompletionRequest)
    assert request.choice_count() == 4
    inputs = [request.triton_inputs(choice) for choice in range(4)]
    assert [i["input_ids"] for i in inputs] == [[1, 2], [1, 2], [3], [3]]
    assert [json.loads(i["sampling_parameters"])["seed"] for i in inputs] == [9, 10, 9, 10]
    assert all(i["echo"] is True for i in inputs)
    assert [request.echoed(choice) for choice in range(4)] == [None] * 4  # token ids: the model decodes them
    texts = parse(json.dumps({"model": "m", "prompt": ["x", "y"], "echo": True}).encode(), CompletionRequest)
    assert [texts.echoed(0), texts.echoed(1)] == ["x", "y"]
    cut = parse(json.dumps({"model": "m", "prompt": "x y z", "echo": True, "truncate_prompt_tokens": 2}).encode(),
                CompletionRequest)
    assert cut.echoed(0) is None  # the model decodes the tokens it keeps
    assert json.loads(cut.triton_inputs()["sampling_parameters"])["truncate_prompt_tokens"] == 2


def test_echo_with_logprobs_asks_for_the_prompts_as_vllm_prompt_logprobs_does():
    def asked(**body):
        request = parse(json.dumps({"model": "m", "prompt": "x", **body}).encode(), CompletionRequest)
        return json.loads(request.triton_inputs()["sampling_parameters"]).get("prompt_logprobs")

    assert asked(echo=True, logprobs=2) == 2 and asked(echo=True, logprobs=2, prompt_logprobs=5) == 5
    assert asked(logprobs=2) is None and asked(echo=True) is None and asked(prompt_logprobs=0) == 0


def test_vllm_sampling_extensions_and_penalties_reach_the_sampling_parameters():
    inputs = parse(chat(ignore_eos=True, stop_token_ids=[7, 9], presence_penalty=1.5, frequency_penalty=-0.5,
                        repetition_penalty=1.1, logit_bias={"50": -100, "7": 2.5}, min_tokens=3, min_p=0.05,
                        include_stop_str_in_output=True, skip_special_tokens=False, allowed_token_ids=[3, 1],
                        bad_words=["no"], thinking_token_budget=64),
                   ChatRequest).triton_inputs()
    assert json.loads(inputs["sampling_parameters"]) == {"ignore_eos": True, "stop_token_ids": [7, 9],
                                                         "presence_penalty": 1.5, "frequency_penalty": -0.5,
                                                         "repetition_penalty": 1.1, "logit_bias": {"50": -100, "7": 2.5},
                                                         "min_tokens": 3, "min_p": 0.05,
                                                         "include_stop_str_in_output": True,
                                                         "skip_special_tokens": False,
                                                         "allowed_token_ids": [3, 1], "bad_words": ["no"],
                                                         "thinking_token_budget": 64}


# what frameworks send by default: the values that change nothing, accepted (and not passed on)
NO_OP_FIELDS = {"response_format": {"type": "text"}, "modalities": ["text"], "verbosity": "medium",
                "tools": [], "tool_choice": "none",
                "guided_json": None, "prompt_logprobs": None, "use_beam_search": False, "length_penalty": 1.0,
                "priority": 0, "echo": False}


def test_unimplemented_fields_at_their_no_op_values_are_accepted():
    request = parse(chat(**NO_OP_FIELDS), ChatRequest)
    assert json.loads(request.triton_inputs()["sampling_parameters"]) == {}
    parse(json.dumps({"model": "m", "prompt": "x", "suffix": "", "guided_regex": None}).encode(), CompletionRequest)


@pytest.mark.parametrize("field, value", [
    ("functions", [{"name": "f"}]), ("function_call", "auto"), ("mm_processor_kwargs", {"fps": 2}),
    ("stop_regex", "a+"), ("prediction", {"type": "content", "content": "x"}), ("web_search_options", {}),
    ("modalities", ["text", "audio"]), ("audio", {"voice": "alloy"}), ("verbosity", "high"),
])
def test_unimplemented_fields_that_would_change_the_reply_are_refused(field, value):
    with pytest.raises(RequestError) as err:
        parse(chat(**{field: value}), ChatRequest)
    assert err.value.status == 400 and err.value.param == field
    assert err.value.message.startswith(f"this server does not support {field}: leave it out")


def test_documents_and_a_request_s_template_go_to_the_triton_model():
    from dflash_trt.serve.tokenize_api import TokenizeChat

    docs = [{"title": "A", "text": "alpha"}]
    for inputs in (parse(chat(documents=docs, chat_template="{{ documents }}"), ChatRequest).triton_inputs(),
                   TokenizeChat.model_validate({"messages": [{"role": "user", "content": "hi"}], "documents": docs,
                                                "chat_template": "{{ documents }}"}).triton_inputs()):
        assert json.loads(inputs["documents"]) == docs and inputs["chat_template"] == "{{ documents }}"
    assert not {"documents", "chat_template"} & parse(chat(documents=[]), ChatRequest).triton_inputs().keys()
    for fields in (dict(documents=[{"title": 1}]), dict(chat_template="")):
        with pytest.raises(RequestError) as err:
            parse(chat(**fields), ChatRequest)
        assert err.value.param.startswith(next(iter(fields)))


def test_reasoning_effort_is_a_variable_of_the_chat_template():
    """OpenAI's reasoning_effort, as vLLM and SGLang pass it: into the template's variables."""
    inputs = parse(chat(reasoning_effort="low", chat_template_kwargs={"x": 1}), ChatRequest).triton_inputs()
    assert json.loads(inputs["chat_template_kwargs"]) == {"x": 1, "reasoning_effort": "low"}
    with pytest.raises(RequestError) as err:
        parse(chat(reasoning_effort="extreme"), ChatRequest)
    assert err.value.param == "reasoning_effort"


def test_tokens_as_ids_are_asked_of_the_triton_model():
    assert parse(chat(return_tokens_as_token_ids=True), ChatRequest).triton_inputs()["tokens_as_ids"] is True
    assert "tokens_as_ids" not in parse(chat(return_tokens_as_token_ids=False), ChatRequest).triton_inputs()


def test_a_cache_salt_goes_to_the_triton_model_and_an_empty_one_is_refused():
    assert parse(chat(cache_salt="tenant-7"), ChatRequest).triton_inputs()["cache_salt"] == "tenant-7"
    assert "cache_salt" not in parse(chat(), ChatRequest).triton_inputs()
    with pytest.raises(RequestError) as err:
        parse(chat(cache_salt=""), ChatRequest)
    assert err.value.param == "cache_salt"


def test_beam_search_is_one_triton_request_per_prompt_with_n_its_width():
    request = parse(chat(use_beam_search=True, n=3, length_penalty=0.5, max_tokens=7, temperature=0), ChatRequest)
    inputs = request.triton_inputs()
    assert json.loads(inputs["beam_search"]) == {"beam_width": 3, "length_penalty": 0.5}
    assert json.loads(inputs["sampling_parameters"]) == {"max_tokens": 7, "temperature": 0}
    assert "beam_search" not in parse(chat(n=3), ChatRequest).triton_inputs()


@pytest.mark.parametrize("fields, param", [
    (dict(seed=1), "seed"), (dict(top_p=0.9), "top_p"), (dict(stop=["x"]), "stop"), (dict(min_tokens=2), "min_tokens"),
    (dict(presence_penalty=0.5), "presence_penalty"), (dict(guided_regex="[a-z]+"), "guided_regex"),
    (dict(n=11), "n"), (dict(use_beam_search=False, length_penalty=2.0), "length_penalty"),
])
def test_what_beam_search_would_not_honour_is_refused_naming_the_field(fields, param):
    with pytest.raises(RequestError) as err:
        parse(chat(**{"use_beam_search": True, "n": 2, **fields}), ChatRequest)
    assert err.value.status == 400 and err.value.param == param, err.value.message


def test_a_priority_goes_to_the_triton_model_which_knows_the_scheduling_policy():
    assert parse(chat(priority=-4), ChatRequest).triton_inputs()["priority"] == -4
    completion = json.dumps({"model": "m", "prompt": ["a", "b"], "n": 2, "priority": 3, "echo": True}).encode()
    request = parse(completion, CompletionRequest)
    assert all(request.triton_inputs(choice)["priority"] == 3 for choice in range(4))
    assert "priority" not in parse(chat(), ChatRequest).triton_inputs()
    for bad in (1.5, "1", True, 2**53):
        with pytest.raises(RequestError) as err:
            parse(chat(priority=bad), ChatRequest)
        assert err.value.status == 400 and err.value.param == "priority"


WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "today's weather",
                                           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}
TURNS = [{"role": "user", "content": "Weather in Milan?"},
         {"role": "assistant", "content": None, "tool_calls": [
             {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Milan"}'}},
             {"id": "call_2", "type": "function", "function": {"name": "get_weather", "arguments": ""}}]},
         {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]


def test_tools_and_earlier_calls_reach_the_chat_template():
    request = parse(chat(messages=TURNS, tools=[WEATHER], parallel_tool_calls=True), ChatRequest)
    request.check_sampling()
    inputs = request.triton_inputs()
    assert json.loads(inputs["tools"]) == [WEATHER]
    assert json.loads(inputs["messages"]) == [  # arguments as objects, as templates iterate over them
        {"role": "user", "content": "Weather in Milan?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Milan"}}},
            {"id": "call_2", "type": "function", "function": {"name": "get_weather", "arguments": {}}}]},
        {"role": "tool", "content": "sunny", "tool_call_id": "call_1"}]
    assert request.offered_tools() == {"get_weather": WEATHER["function"]}


def test_tool_choice_none_offers_no_tools():
    request = parse(chat(tools=[WEATHER, {"type": "function", "function": {"name": "t", "strict": True}}],
                         tool_choice="none"), ChatRequest)
    assert "tools" not in request.triton_inputs() and request.offered_tools() == {}


def test_a_call_s_arguments_that_are_no_object_reach_the_template_as_text():
    request = parse(chat(messages=[{"role": "assistant", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": "[1"}}]}]), ChatRequest)
    assert json.loads(request.triton_inputs()["messages"])[0]["tool_calls"][0]["function"]["arguments"] == "[1"


TIME = {"type": "function", "function": {"name": "get_time", "strict": True}}


@pytest.mark.parametrize("fields, schema", [
    ({"tool_choice": {"type": "function", "function": {"name": "get_weather"}}}, WEATHER["function"]["parameters"]),
    ({"tool_choice": {"type": "function", "function": {"name": "get_time"}}}, {"type": "object"}),
    ({"tool_choice": "required", "parallel_tool_calls": False}, {"type": "array", "minItems": 1, "maxItems": 1,
                                                                 "items": {"anyOf": [
        {"type": "object", "properties": {"name": {"const": "get_weather"},
                                          "parameters": WEATHER["function"]["parameters"]},
         "required": ["name", "parameters"], "additionalProperties": False},
        {"type": "object", "properties": {"name": {"const": "get_time"}, "parameters": {"type": "object"}},
         "required": ["name", "parameters"], "additionalProperties": False}]}}),
])
def test_a_forced_tool_choice_holds_the_reply_to_the_calls_json_schema(fields, schema):
    request = parse(chat(tools=[WEATHER, TIME], **fields), ChatRequest)
    sampling = json.loads(request.triton_inputs()["sampling_parameters"])
    assert sampling["structured_output"] == {"json": schema}


@pytest.mark.parametrize("fields, param, words", [
    ({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice.function.name",
     "tool_choice names 'nope', which tools does not offer"),
    ({"tool_choice": "required", "tools": None}, "tool_choice", "the request offers no tools"),
    ({"tool_choice": "required", "guided_regex": "a"}, "guided_regex", "guided_regex and tool_choice both ask"),
    ({"tools": [WEATHER, TIME]}, "tools[1].function.strict", "needs tool_choice 'required' or this function named"),
])
def test_what_tool_calling_cannot_honour_is_refused(fields, param, words):
    with pytest.raises(RequestError) as err:
        parse(chat(**{"tools": [WEATHER], **fields}), ChatRequest)
    assert (err.value.status, err.value.param) == (400, param) and words in err.value.message


@pytest.mark.parametrize("tool, param", [
    ({"type": "function", "function": {"name": "get weather"}}, "tools[0].function.name"),
    ({"type": "retrieval"}, "tools[0].type"),
])
def test_a_tool_this_server_cannot_honour_is_refused(tool, param):
    with pytest.raises(RequestError) as err:
        parse(chat(tools=[tool]), ChatRequest)
    assert err.value.param == param


SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}}


@pytest.mark.parametrize("fields, structured", [
    ({"response_format": {"type": "json_object"}}, {"json_object": True}),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": SCHEMA, "strict": True}}},
     {"json": SCHEMA}),
    ({"guided_json": SCHEMA}, {"json": SCHEMA}),
    ({"guided_regex": "[0-9]+"}, {"regex": "[0-9]+"}),
    ({"guided_choice": ["yes", "no"]}, {"choice": ["yes", "no"]}),
    ({"guided_grammar": 'start: "a"'}, {"grammar": 'start: "a"'}),
    ({"guided_grammar": 'root ::= "a"'}, {"grammar": 'root ::= "a"'}),
    ({"ebnf": 'root ::= [a-c]+'}, {"grammar": 'root ::= [a-c]+'}),
    ({"guided_json": SCHEMA, "guided_whitespace_pattern": "[ ]?"}, {"json": SCHEMA, "whitespace_pattern": "[ ]?"}),
    ({"response_format": {"type": "json_object"}, "guided_whitespace_pattern": " "},
     {"json_object": True, "whitespace_pattern": " "}),
    ({"structured_outputs": {"json": SCHEMA, "whitespace_pattern": "\\n?"}},
     {"json": SCHEMA, "whitespace_pattern": "\\n?"}),
    ({"structured_outputs": {"choice": ["x"]}}, {"choice": ["x"]}),
    ({"response_format": {"type": "text"}}, None),
])
def test_structured_output_fields_reach_sampling_parameters(fields, structured):
    for body in (chat(**fields), json.dumps({"model": "m", "prompt": "x", **fields}).encode()):
        request = parse(body, ChatRequest if b"messages" in body else CompletionRequest)
        assert json.loads(request.triton_inputs()["sampling_parameters"]).get("structured_output") == structured


@pytest.mark.parametrize("fields, param, words", [
    ({"guided_regex": "("}, "guided_regex", "guided_regex: regex does not compile"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": {"type": "objec"}}}},
     "response_format", "response_format: json does not compile"),
    ({"structured_outputs": {"xml": "<a/>"}}, "structured_outputs", "has no field 'xml'"),
    ({"response_format": {"type": "json_schema"}}, "response_format.json_schema", "needs its json_schema"),
    ({"guided_regex": "a", "guided_choice": ["a"]}, "guided_choice", "guided_choice and guided_regex both ask"),
    ({"guided_regex": "a", "ignore_eos": True}, "guided_regex", "cannot be combined with ignore_eos"),
    ({"ebnf": 'root ::= "a'}, "ebnf", "ebnf: grammar does not compile"),
    ({"guided_regex": "a", "guided_whitespace_pattern": " "}, "guided_whitespace_pattern", "spaces JSON output"),
    ({"guided_whitespace_pattern": " "}, "guided_whitespace_pattern", "spaces JSON output"),
])
def test_structured_output_that_cannot_be_followed_is_refused_naming_its_field(fields, param, words):
    with pytest.raises(RequestError) as err:
        parse(chat(**fields), ChatRequest)
    assert (err.value.status, err.value.param) == (400, param) and words in err.value.message


@pytest.mark.parametrize("fields, kept", [
    (dict(no_stop_trim=True), True), (dict(no_stop_trim=False), False), (dict(include_stop_str_in_output=True), True),
    (dict(no_stop_trim=True, include_stop_str_in_output=True), True), ({}, None)])
def test_sglang_s_no_stop_trim_is_vllm_s_include_stop_str_in_output(fields, kept):
    sampling = json.loads(parse(chat(stop=["x"], **fields), ChatRequest).triton_inputs()["sampling_parameters"])
    assert sampling.get("include_stop_str_in_output") == kept
    with pytest.raises(RequestError) as err:
        parse(chat(stop=["x"], no_stop_trim=True, include_stop_str_in_output=False), ChatRequest).triton_inputs()
    assert err.value.param == "no_stop_trim"


def test_a_completion_refuses_a_suffix():
    with pytest.raises(RequestError) as err:
        parse(json.dumps({"model": "m", "prompt": "x", "suffix": "end"}).encode(), CompletionRequest)
    assert err.value.param == "suffix"


def test_another_endpoints_unimplemented_field_is_an_extra_here():
    """tools belong to chat bodies: a completion carrying them is only carrying an unknown field."""
    parse(json.dumps({"model": "m", "prompt": "x", "tools": [{"type": "function"}]}).encode(), CompletionRequest)


def test_how_a_conversation_ends_goes_to_the_template_with_its_kwargs():
    inputs = parse(chat(continue_final_message=True, add_generation_prompt=False,
                        chat_template_kwargs={"enable_thinking": False}), ChatRequest).triton_inputs()
    assert json.loads(inputs["chat_template_kwargs"]) == {"enable_thinking": False, "continue_final_message": True,
                                                          "add_generation_prompt": False}
    assert "chat_template_kwargs" not in parse(chat(), ChatRequest).triton_inputs()
    with pytest.raises(RequestError) as err:
        parse(chat(continue_final_message=True, add_generation_prompt=True), ChatRequest)
    assert err.value.param == "continue_final_message"


def test_num_speculative_tokens_reaches_the_engine_s_sampling_params():
    """A request's speculation cap, from the chat body through the Triton model's sampling_parameters to the
    SamplingParams the engine's block limit is made from (batch_runner.max_block)."""
    from dflash_trt.runtime.batch_runner import max_block
    from dflash_trt.serve.requests import parse_sampling

    for k, limit in ((0, 1), (3, 4), (None, 0)):
        extra = {} if k is None else {"num_speculative_tokens": k}
        body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}], **extra}).encode()
        sent = parse(body, ChatRequest).triton_inputs()["sampling_parameters"]
        params = parse_sampling(sent, 4, 64)
        assert params.num_speculative_tokens == k
        assert max_block(params.num_speculative_tokens != 0, params.num_speculative_tokens) == limit

"""Anthropic's Messages API (/v1/messages) in-process over the stand-in Triton client of test_front.py,
read by the official Anthropic client: a request runs as the chat it converts to (system, text /
tool_use / tool_result blocks, tools, tool_choice, stop_sequences), and its reply comes back as a
Message or its stream's events."""

import json

import pytest
from fastapi.testclient import TestClient
from test_front import FORCED, USAGE, FakeTriton

from dflash_trt.serve.openai_api import FrontSettings, create_app

anthropic = pytest.importorskip("anthropic")  # a test dependency (.[test])

WEATHER = {"name": "get_weather", "description": "today's weather",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}


def front_for(**settings):
    triton = FakeTriton()
    front = TestClient(create_app(FrontSettings("tiny", **settings), triton))
    return front, triton, anthropic.Anthropic(base_url="http://testserver", api_key="k", http_client=front)


@pytest.fixture
def served():
    return front_for(tool_parser="hermes")


def test_a_message_is_the_chat_reply_as_content_blocks(served):
    _, triton, client = served
    # sampling fields of earlier API versions (this SDK no longer has them), which other clients send
    message = client.messages.create(model="tiny", max_tokens=3, system="Be brief.", messages=[
        {"role": "user", "content": "hi"}], extra_body={"temperature": 0.5, "top_k": 4}, cache_control={"type": "ephemeral"})
    assert json.loads(triton.requests[0]["messages"]) == [{"role": "system", "content": "Be brief."},
                                                          {"role": "user", "content": "hi"}]
    assert json.loads(triton.requests[0]["sampling_parameters"]) == {"max_tokens": 3, "temperature": 0.5, "top_k": 4}
    assert message.id.startswith("msg_") and message.role == "assistant" and message.model == "tiny"
    assert [(b.type, b.text) for b in message.content] == [("text", "abc")]
    assert (message.stop_reason, message.stop_sequence) == ("max_tokens", None)  # the stand-in's reply: a length
    usage = message.usage
    assert (usage.input_tokens, usage.cache_read_input_tokens, usage.output_tokens) == (
        USAGE["prompt_tokens"] - USAGE["cached_tokens"], USAGE["cached_tokens"], 3)


def test_a_streamed_message_sends_anthropic_s_events(served):
    _, _, client = served
    with client.messages.stream(model="tiny", max_tokens=3, messages=[{"role": "user", "content": "hi"}]) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_message()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert [k for k in kinds if k.startswith("content_block")][0] == "content_block_start"
    assert final.content[0].text == "abc" and final.stop_reason == "max_tokens" and final.usage.output_tokens == 3


@pytest.mark.parametrize("stream", [False, True])
def test_tool_calls_come_back_as_tool_use_blocks(served, stream):
    _, triton, client = served
    asked = dict(model="tiny", max_tokens=30, tools=[WEATHER], messages=[{"role": "user", "content": "hi"}])
    if stream:
        with client.messages.stream(**asked) as events:
            message = events.get_final_message()
    else:
        message = client.messages.create(**asked)
    assert message.content[0].type == "text" and message.content[0].text == "Checking."
    assert [(b.type, b.name, b.input) for b in message.content[1:]] == [
        ("tool_use", "get_weather", {"city": "Milan"}), ("tool_use", "get_weather", {"city": "Oslo"})]
    assert message.stop_reason == "tool_use"
    assert json.loads(triton.requests[0]["tools"]) == [{"type": "function", "function": {
        "name": "get_weather", "parameters": WEATHER["input_schema"], "description": "today's weather"}}]


def test_tool_use_and_tool_result_blocks_become_the_chat_s_turns(served):
    _, triton, client = served
    client.messages.create(model="tiny", max_tokens=3, tools=[WEATHER], messages=[
        {"role": "user", "content": [{"type": "text", "text": "Weather in Milan?"}]},
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "hm", "signature": ""},
                                          {"type": "text", "text": "Checking."},
                                          {"type": "tool_use", "id": "toolu_1", "name": "get_weather",
                                           "input": {"city": "Milan"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"}]}])
    assert json.loads(triton.requests[0]["messages"]) == [
        {"role": "user", "content": "Weather in Milan?"},
        {"role": "assistant", "content": "Checking.", "tool_calls": [
            {"id": "toolu_1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Milan"}}}]},
        {"role": "tool", "content": "sunny", "tool_call_id": "toolu_1"}]


def test_a_named_tool_choice_holds_the_reply_to_its_input_schema(served):
    _, triton, client = served
    message = client.messages.create(model="tiny", max_tokens=30, tools=[WEATHER],
                                     tool_choice={"type": "tool", "name": "get_weather"},
                                     messages=[{"role": "user", "content": "hi"}])
    assert [(b.type, b.input) for b in message.content] == [("tool_use", json.loads(FORCED))]
    assert json.loads(triton.requests[0]["sampling_parameters"])["structured_output"]["json"] == \
        WEATHER["input_schema"]


def test_a_stop_sequence_that_ended_the_reply_is_named(served):
    """vLLM's stop_reason (the Triton model's usage says which stop string matched) -> stop_sequence."""
    front, triton, _ = served
    ended = dict(USAGE, stop_reason="\n\n")

    async def stopped(inputs):
        triton.requests.append(inputs)
        from dflash_trt.serve.triton_client import Piece
        yield Piece("ab", [0, 1], "stop", ended)

    triton.generate = stopped
    body = {"model": "tiny", "max_tokens": 9, "stop_sequences": ["\n\n"], "messages": [{"role": "user", "content": "x"}]}
    message = front.post("/v1/messages", json=body).json()
    assert (message["stop_reason"], message["stop_sequence"]) == ("stop_sequence", "\n\n")
    assert json.loads(triton.requests[0]["sampling_parameters"])["stop"] == ["\n\n"]
    chat = front.post("/v1/chat/completions", json={"model": "tiny", "messages": [{"role": "user", "content": "x"}]})
    assert chat.json()["choices"][0]["stop_reason"] == "\n\n"  # vLLM's field in the chat reply too


@pytest.mark.parametrize("field, value, param", [
    ("max_tokens", None, "max_tokens"), ("messages", [], "messages"), ("thinking", {"type": "adaptive"}, "thinking"),
    ("thinking", {"type": "enabled", "budget_tokens": 5}, "thinking.budget_tokens"),  # not below max_tokens
    ("tool_choice", {"type": "tool"}, "tool_choice.type"), ("temperature", -1, "temperature"),
    ("messages", [{"role": "system", "content": "x"}], "messages[0].role"),
    ("messages", [{"role": "user", "content": [{"type": "image", "source": {}}]}], "messages[0].content"),
    ("service", 1, "service"),
])
def test_what_this_server_cannot_honour_is_a_400_naming_the_field(served, field, value, param):
    front, triton, _ = served
    body = {"model": "tiny", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}], field: value}
    if value is None:
        body.pop(field)
    response = front.post("/v1/messages", json=body)
    assert response.status_code == 400, response.json()
    assert response.json()["error"]["param"] == param and not triton.requests


def test_a_thinking_budget_bounds_the_reply_s_thinking(served):
    """thinking enabled: its budget_tokens are vLLM's thinking_token_budget."""
    front, triton, client = served
    client.messages.create(model="tiny", max_tokens=50, messages=[{"role": "user", "content": "hi"}],
                           thinking={"type": "enabled", "budget_tokens": 20})
    assert json.loads(triton.requests[-1]["sampling_parameters"])["thinking_token_budget"] == 20
    client.messages.create(model="tiny", max_tokens=50, messages=[{"role": "user", "content": "hi"}],
                           thinking={"type": "disabled"})
    assert "thinking_token_budget" not in json.loads(triton.requests[-1]["sampling_parameters"])


def test_anthropic_s_api_key_header_is_accepted():
    front = TestClient(create_app(FrontSettings("tiny", api_key="k"), FakeTriton()))
    body = {"model": "tiny", "max_tokens": 3, "messages": [{"role": "user", "content": "hi"}]}
    assert front.post("/v1/messages", json=body).status_code == 401
    assert front.post("/v1/messages", json=body, headers={"x-api-key": "k"}).status_code == 200
    assert front.post("/v1/messages", json=body, headers={"x-api-key": "no"}).status_code == 401


def test_count_tokens_counts_the_prompt_a_message_of_the_same_fields_would_read(served):
    """/v1/messages/count_tokens tokenizes what a /v1/messages request of these fields sends as its chat
    (system first, tool blocks as turns, tools offered), nothing generated."""
    _, triton, client = served
    asked = dict(model="tiny", system="Be brief.", tools=[WEATHER], messages=[
        {"role": "user", "content": "Weather in Milan?"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "get_weather",
                                           "input": {"city": "Milan"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"}]}])
    counted = client.messages.count_tokens(**asked)
    tokenized = triton.requests[-1]
    client.messages.create(max_tokens=3, **asked)
    sent = triton.requests[-1]
    assert tokenized["tokenize_only"] and "sampling_parameters" not in tokenized
    assert (json.loads(tokenized["messages"]), json.loads(tokenized["tools"])) == (
        json.loads(sent["messages"]), json.loads(sent["tools"]))
    assert counted.input_tokens == len(tokenized["messages"])  # the stand-in's ids: a character each
    assert client.messages.count_tokens(model="tiny", messages=[{"role": "user", "content": "hi"}],
                                        tools=[WEATHER], tool_choice={"type": "none"}).input_tokens > 0
    assert "tools" not in triton.requests[-1]  # tool_choice none: the chat offers no tools, as a message's would


@pytest.mark.parametrize("body, status, param", [
    ({"model": "tiny", "messages": []}, 400, "messages"),
    ({"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}, 400, "max_tokens"),
    ({"model": "tiny", "messages": [{"role": "user", "content": "long"}]}, 400, "messages"),
    ({"model": "other", "messages": [{"role": "user", "content": "hi"}]}, 404, "model"),
])
def test_bad_count_tokens_requests_are_a_4xx_naming_the_field(served, body, status, param):
    front, _, _ = served
    response = front.post("/v1/messages/count_tokens", json=body)
    assert response.status_code == status and response.json()["error"]["param"] == param

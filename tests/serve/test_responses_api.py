"""OpenAI's Responses API (/v1/responses) in-process over the stand-in Triton client of test_front.py,
read by the official OpenAI client: a request runs as the chat it converts to (instructions, input
items, tools, text.format), and its reply comes back as a Response object or its stream's events."""

import asyncio
import json

import pytest
from fastapi.testclient import TestClient
from test_front import FORCED, THINKING, USAGE, FakeTriton

from dflash_trt.serve.triton_client import Piece

from dflash_trt.serve.openai_api import FrontSettings, create_app

openai = pytest.importorskip("openai")  # a test dependency (.[test]); the GPU machine's image lacks it

WEATHER = {"type": "function", "name": "get_weather", "description": "today's weather",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}


def front_for(**settings):
    triton = FakeTriton()
    front = TestClient(create_app(FrontSettings("tiny", **settings), triton))
    return front, triton, openai.OpenAI(base_url="http://testserver/v1", api_key="none", http_client=front)


@pytest.fixture
def served():
    return front_for(tool_parser="hermes")


@pytest.fixture
def thinking():
    """--reasoning-parser qwen3 behind a template whose prompt opens a think block unless enable_thinking
    is false."""
    return front_for(thinking=lambda kwargs, template: kwargs.get("enable_thinking", True))


def sampling(triton, k=-1) -> dict:
    return json.loads(triton.requests[k].get("sampling_parameters") or "{}")


def test_a_response_is_the_chat_reply_as_a_response_object(served):
    _, triton, client = served
    response = client.responses.create(model="tiny", input="hi", instructions="Be brief.", max_output_tokens=3,
                                       temperature=0.5, metadata={"run": "7"})
    assert json.loads(triton.requests[0]["messages"]) == [{"role": "system", "content": "Be brief."},
                                                          {"role": "user", "content": "hi"}]
    assert sampling(triton) == {"max_tokens": 3, "temperature": 0.5}
    assert response.id.startswith("resp_") and response.object == "response" and response.model == "tiny"
    assert response.output_text == "abc"  # the stand-in's reply ends on its length
    assert response.status == "incomplete" and response.incomplete_details.reason == "max_output_tokens"
    (message,) = response.output
    assert message.type == "message" and message.role == "assistant" and message.status == "incomplete"
    usage = response.usage
    assert (usage.input_tokens, usage.output_tokens, usage.total_tokens) == (3, 3, 6)
    assert usage.input_tokens_details.cached_tokens == USAGE["cached_tokens"]
    assert usage.output_tokens_details.reasoning_tokens == 0
    assert (response.instructions, response.max_output_tokens, response.temperature) == ("Be brief.", 3, 0.5)
    assert response.metadata == {"run": "7"} and response.store is True and response.tools == []


def test_input_items_become_the_chat_s_turns(served):
    _, triton, client = served
    client.responses.create(model="tiny", input=[
        {"role": "developer", "content": "Use tools."},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Weather "},
                                                        {"type": "input_text", "text": "in Milan?"}]},
        {"type": "reasoning", "id": "rs_1", "summary": []},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Checking."}]},
        {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Milan"}'},
        {"type": "function_call_output", "call_id": "call_1", "output": "sunny"}])
    assert json.loads(triton.requests[0]["messages"]) == [
        {"role": "developer", "content": "Use tools."}, {"role": "user", "content": "Weather in Milan?"},
        {"role": "assistant", "content": "Checking.", "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Milan"}}}]},
        {"role": "tool", "content": "sunny", "tool_call_id": "call_1"}]


def test_a_streamed_response_sends_the_typed_events_in_order(served):
    _, _, client = served
    events = list(client.responses.create(model="tiny", input="hi", stream=True))
    kinds = [event.type for event in events]
    assert kinds == ["response.created", "response.in_progress", "response.output_item.added",
                     "response.content_part.added", *["response.output_text.delta"] * 3, "response.output_text.done",
                     "response.content_part.done", "response.output_item.done", "response.incomplete"]
    assert [event.sequence_number for event in events] == list(range(len(events)))
    assert events[0].response.status == "in_progress" and events[0].response.output == []
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == "abc"
    item_id = events[2].item.id
    assert all(e.item_id == item_id for e in events[3:-2] if hasattr(e, "item_id"))
    final = events[-1].response
    assert final.output_text == "abc" and final.output[0].id == item_id and final.usage.output_tokens == 3


@pytest.mark.parametrize("stream", [False, True])
def test_function_calls_come_back_as_items(served, stream):
    _, triton, client = served
    asked = dict(model="tiny", input="hi", tools=[WEATHER], tool_choice="auto")
    if stream:
        events = list(client.responses.create(**asked, stream=True))
        done = [e.item for e in events if e.type == "response.output_item.done"]
        arguments = [e.arguments for e in events if e.type == "response.function_call_arguments.done"]
        assert arguments == ['{"city": "Milan"}', '{"city": "Oslo"}']
        output = events[-1].response.output
        assert [item.id for item in done] == [item.id for item in output]
    else:
        output = client.responses.create(**asked).output
    assert output[0].type == "message" and output[0].content[0].text == "Checking."
    calls = output[1:]
    assert [(c.type, c.name, json.loads(c.arguments), c.status) for c in calls] == [
        ("function_call", "get_weather", {"city": "Milan"}, "completed"),
        ("function_call", "get_weather", {"city": "Oslo"}, "completed")]
    assert all(c.call_id.startswith("call_") and c.id.startswith("fc_") for c in calls)
    assert json.loads(triton.requests[0]["tools"]) == [
        {"type": "function", "function": {k: v for k, v in WEATHER.items() if k != "type"}}]


def test_a_named_tool_choice_and_a_json_schema_hold_the_reply_to_their_json(served):
    _, triton, client = served
    called = client.responses.create(model="tiny", input="hi", tools=[WEATHER],
                                     tool_choice={"type": "function", "name": "get_weather"})
    assert [(c.name, c.arguments) for c in called.output if c.type == "function_call"] == [("get_weather", FORCED)]
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    answered = client.responses.create(model="tiny", input="hi", text={"format": {
        "type": "json_schema", "name": "place", "schema": schema, "strict": True}})
    assert sampling(triton)["structured_output"] == {"json": schema}
    assert answered.output_text == FORCED and answered.text.format.type == "json_schema"


@pytest.mark.parametrize("stream", [False, True])
def test_reasoning_comes_back_as_a_reasoning_item_and_its_tokens_are_counted(thinking, stream):
    _, triton, client = thinking
    if stream:
        events = list(client.responses.create(model="tiny", input="think", stream=True))
        response = events[-1].response
        reasoning = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
        assert reasoning == "The user greets me.\nI greet back.\n"
    else:
        response = client.responses.create(model="tiny", input="think")
    thought, message = response.output
    assert thought.type == "reasoning" and thought.content[0].text == "The user greets me.\nI greet back.\n"
    assert message.content[0].text == "Hello!" and response.status == "completed"
    assert triton.requests[0]["reasoning_end"] == "</think>"  # so the Triton model counts them
    assert response.usage.output_tokens_details.reasoning_tokens == 5  # the stand-in's count
    plain = client.responses.create(model="tiny", input="think",
                                    extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    assert plain.output_text == THINKING and "reasoning_end" not in triton.requests[-1]


def test_vllm_s_sampling_extensions_reach_the_engine_as_a_chat_s(served):
    _, triton, client = served
    client.responses.create(model="tiny", input="hi", extra_body={"top_k": 20, "seed": 7, "priority": -2,
                                                                  "repetition_penalty": 1.1, "stop": ["x"]})
    assert sampling(triton) == {"top_k": 20, "seed": 7, "repetition_penalty": 1.1, "stop": ["x"]}
    assert triton.requests[0]["priority"] == -2


def test_a_reasoning_effort_is_the_chat_s_reasoning_effort(served):
    _, triton, client = served
    client.responses.create(model="tiny", input="hi", reasoning={"effort": "low"})
    assert json.loads(triton.requests[-1]["chat_template_kwargs"]) == {"reasoning_effort": "low"}


def test_logprobs_are_included_when_asked(served):
    front, triton, _ = served
    body = front.post("/v1/responses", json={"model": "tiny", "input": "hi", "top_logprobs": 2,
                                             "include": ["message.output_text.logprobs"]}).json()
    assert sampling(triton)["logprobs"] == 2
    assert body["output"][0]["content"][0]["logprobs"] == []  # the stand-in sends none


def messages(triton, k=-1) -> list[dict]:
    return json.loads(triton.requests[k]["messages"])


@pytest.mark.parametrize("stream", [False, True])
def test_previous_response_id_continues_the_stored_conversation(served, stream):
    """The second request's chat is the first's turns, its reply, then the new input; the first's
    instructions are not carried over (OpenAI's rule), the second's lead."""
    _, triton, client = served
    asked = dict(model="tiny", stream=stream)
    first = client.responses.create(**asked, input="hi", instructions="Be brief.")
    first = [e for e in first][-1].response if stream else first
    assert first.store is True and first.previous_response_id is None
    second = client.responses.create(**asked, input="and then?", previous_response_id=first.id,
                                     instructions="Be kind.")
    second = [e for e in second][-1].response if stream else second
    assert second.previous_response_id == first.id
    assert messages(triton) == [{"role": "system", "content": "Be kind."}, {"role": "user", "content": "hi"},
                                {"role": "assistant", "content": "abc"}, {"role": "user", "content": "and then?"}]
    client.responses.create(model="tiny", input="more", previous_response_id=second.id)
    assert messages(triton) == [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "abc"},
                                {"role": "user", "content": "and then?"}, {"role": "assistant", "content": "abc"},
                                {"role": "user", "content": "more"}]
    assert client.responses.retrieve(first.id).model_dump() == first.model_dump()


def test_a_stored_function_call_continues_with_its_output(served):
    _, triton, client = served
    called = client.responses.create(model="tiny", input="weather?", tools=[WEATHER])
    calls = [item for item in called.output if item.type == "function_call"]
    client.responses.create(model="tiny", tools=[WEATHER], previous_response_id=called.id, input=[
        {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"} for call in calls])
    turns = messages(triton)
    assert turns[0] == {"role": "user", "content": "weather?"}
    assert turns[1]["role"] == "assistant" and turns[1]["content"] == "Checking."
    assert [call["id"] for call in turns[1]["tool_calls"]] == [call.call_id for call in calls]
    assert turns[2:] == [{"role": "tool", "tool_call_id": call.call_id, "content": "sunny"} for call in calls]


def test_a_response_with_store_false_is_not_kept(served):
    front, triton, client = served
    response = client.responses.create(model="tiny", input="hi", store=False)
    assert response.store is False
    assert front.get(f"/v1/responses/{response.id}").status_code == 404
    refused = front.post("/v1/responses", json={"model": "tiny", "input": "x", "previous_response_id": response.id})
    assert refused.status_code == 404 and refused.json()["error"]["param"] == "previous_response_id"
    assert len(triton.requests) == 1  # refused before any work


def test_a_deleted_response_is_gone(served):
    front, _, client = served
    response = client.responses.create(model="tiny", input="hi")
    deleted = front.delete(f"/v1/responses/{response.id}")
    assert deleted.status_code == 200
    assert deleted.json() == {"id": response.id, "object": "response.deleted", "deleted": True}
    assert front.get(f"/v1/responses/{response.id}").status_code == 404
    assert front.delete(f"/v1/responses/{response.id}").status_code == 404
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(response.id)


def test_the_store_keeps_the_most_recently_used_responses():
    front, _, client = front_for(responses_store=2)
    ids = [client.responses.create(model="tiny", input=f"hi {k}").id for k in range(2)]
    client.responses.retrieve(ids[0])  # used: the other is now the oldest
    ids.append(client.responses.create(model="tiny", input="hi 2").id)
    assert [front.get(f"/v1/responses/{i}").status_code for i in ids] == [200, 404, 200]


def test_a_server_that_stores_nothing_refuses_store_true():
    front, triton, client = front_for(responses_store=0)
    response = client.responses.create(model="tiny", input="hi")  # store left out: not kept
    assert response.store is False and front.get(f"/v1/responses/{response.id}").status_code == 404
    refused = front.post("/v1/responses", json={"model": "tiny", "input": "hi", "store": True})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "store"
    assert len(triton.requests) == 1


def test_a_response_cut_off_by_its_client_is_not_stored(served):
    front, _, client = served
    with client.responses.create(model="tiny", input="hi", stream=True) as events:
        created = next(iter(events)).response
    assert front.get(f"/v1/responses/{created.id}").status_code == 404


@pytest.mark.parametrize("field, value, param", [
    ("conversation", "conv_1", "conversation"),
    ("reasoning", {"summary": "auto"}, "reasoning"), ("reasoning", {"effort": "extreme"}, "reasoning.effort"),
    ("max_output_tokens", 0, "max_output_tokens"),
    ("input", [], "input"), ("input", [{"type": "item_reference", "id": "x"}], "input"),
    ("tools", [{"type": "web_search"}], "tools[0].type"), ("text", {"format": {"type": "xml"}}, "text.format.type"),
    ("temperature", -1, "temperature"), ("include", ["file_search_call.results"], "include[0]"),
    ("truncation", "auto", "truncation"), ("text", {"verbosity": "high"}, "text.verbosity"),
    ("n", 2, "n"), ("top_logprobs", 2, "top_logprobs"), ("max_tool_calls", 3, "max_tool_calls"),
    ("seed", -1, "seed"),
])
def test_what_a_stateless_server_cannot_honour_is_a_400_naming_the_field(served, field, value, param):
    front, triton, _ = served
    response = front.post("/v1/responses", json={"model": "tiny", "input": "hi", field: value})
    assert response.status_code == 400, response.json()
    assert response.json()["error"]["param"] == param and not triton.requests


def test_a_refusal_of_the_prompt_names_the_input(served):
    front, _, _ = served
    response = front.post("/v1/responses", json={"model": "tiny", "input": "a long prompt"})
    assert response.status_code == 400 and response.json()["error"]["param"] == "input"
    assert front.post("/v1/responses", json={"model": "other", "input": "hi"}).status_code == 404


def test_the_schema_documents_the_endpoint(served):
    front, _, _ = served
    spec = front.get("/openapi.json").json()["paths"]["/v1/responses"]["post"]
    assert spec["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith("/ResponsesRequest")
    assert spec["responses"]["200"]["content"]["application/json"]["schema"]["$ref"].endswith("/ResponseObject")


def test_a_stored_response_lists_its_input_items_page_by_page(served):
    """OpenAI's input_items: the request's own items, each with an id, newest first unless order asc; a
    page of `limit`, then the rest after its last id."""
    front, _, client = served
    response = client.responses.create(model="tiny", input=[
        {"role": "user", "content": "first"}, {"role": "assistant", "content": "ok"},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "second"}]}])
    page = client.responses.input_items.list(response.id, limit=2)
    texts = [item.content[0].text for item in page.data]
    assert texts == ["second", "ok"] and page.has_more and page.last_id == page.data[-1].id
    assert page.data[0].id.startswith("msg_") and page.data[1].role == "assistant"
    rest = client.responses.input_items.list(response.id, limit=2, after=page.last_id)
    assert [item.content[0].text for item in rest.data] == ["first"] and not rest.has_more
    oldest = front.get(f"/v1/responses/{response.id}/input_items", params={"order": "asc"}).json()
    assert [item["content"][0]["text"] for item in oldest["data"]] == ["first", "ok", "second"]
    assert [item["id"] for item in oldest["data"]] == [item.id for item in [*page.data, *rest.data]][::-1]
    bad = front.get(f"/v1/responses/{response.id}/input_items", params={"after": "msg_none"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "after"
    assert front.get(f"/v1/responses/{response.id}/input_items", params={"limit": 0}).status_code == 400
    assert front.get("/v1/responses/resp_none/input_items").status_code == 404


@pytest.fixture
def lasting():
    """A front whose event loop outlives each request (the TestClient entered), as a server's does: a
    background response runs on it after its reply."""
    triton = FakeTriton()
    with TestClient(create_app(FrontSettings("tiny"), triton)) as front:
        yield front, triton, openai.OpenAI(base_url="http://testserver/v1", api_key="none", http_client=front)


def endless(triton):
    """A stand-in generate that answers a piece every 10 ms until its stream is closed (counted)."""
    async def generate(inputs):
        triton.requests.append(inputs)
        try:
            while True:
                await asyncio.sleep(0.01)
                yield Piece("a", [1], None, None)
        finally:
            triton.closed += 1

    return generate


def finished(client, response_id: str, timeout_s: float = 10):
    """GET a background response until it has ended."""
    import time

    deadline = time.monotonic() + timeout_s
    while (response := client.responses.retrieve(response_id)).status in ("queued", "in_progress"):
        assert time.monotonic() < deadline, response.status
        time.sleep(0.01)
    return response


def test_a_background_response_comes_back_queued_and_ends_as_the_foreground_one(lasting):
    _, triton, client = lasting
    queued = client.responses.create(model="tiny", input="hi", background=True, max_output_tokens=3)
    assert queued.status == "queued" and queued.background is True and queued.output == []
    done = finished(client, queued.id)
    foreground = client.responses.create(model="tiny", input="hi", max_output_tokens=3)
    assert done.status == foreground.status == "incomplete" and done.output_text == foreground.output_text == "abc"
    assert done.usage.output_tokens == foreground.usage.output_tokens
    assert json.loads(triton.requests[0]["messages"]) == json.loads(triton.requests[1]["messages"])
    follow = client.responses.create(model="tiny", input="more", previous_response_id=queued.id)
    assert messages(triton)[:2] == [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "abc"}]
    assert follow.status == "incomplete"


def test_a_cancelled_background_response_stops_its_request(lasting):
    """POST /cancel while it runs: its Triton stream is closed (the engine then aborts it), it is stored
    cancelled; cancelling it again, or a finished one, gives it back as it is."""
    front, triton, client = lasting
    answer, triton.generate = triton.generate, endless(triton)
    queued = client.responses.create(model="tiny", input="hi", background=True)
    busy = front.post("/v1/responses", json={"model": "tiny", "input": "x", "previous_response_id": queued.id})
    assert busy.status_code == 400 and busy.json()["error"]["param"] == "previous_response_id"
    cancelled = client.responses.cancel(queued.id)
    assert cancelled.status == "cancelled" and triton.closed == len(triton.requests) == 1
    deleted = client.responses.create(model="tiny", input="hi", background=True)
    assert front.delete(f"/v1/responses/{deleted.id}").status_code == 200  # stopped, then forgotten
    assert triton.closed == len(triton.requests) == 2 and front.get(f"/v1/responses/{deleted.id}").status_code == 404
    triton.generate = answer
    assert client.responses.retrieve(queued.id).status == "cancelled"
    assert client.responses.cancel(queued.id).status == "cancelled"
    continued = front.post("/v1/responses", json={"model": "tiny", "input": "x", "previous_response_id": queued.id})
    assert continued.status_code == 200  # an ended response (cancelled) may be continued
    plain = client.responses.create(model="tiny", input="hi", max_output_tokens=1, stream=False)
    assert front.post(f"/v1/responses/{plain.id}/cancel").status_code == 400  # not a background one


def test_a_background_response_its_prompt_refuses_is_stored_failed(lasting):
    _, _, client = lasting
    queued = client.responses.create(model="tiny", input="a long prompt", background=True)
    failed = finished(client, queued.id)
    assert failed.status == "failed" and failed.error.code == "invalid_request"
    assert "context capacity" in failed.error.message


def test_a_response_the_engine_fails_mid_reply_ends_failed_streamed_or_in_the_background(lasting):
    """NaN logits after the first token (the Triton model's 500): a stream ends with response.failed, whose
    response is stored failed; a background response is stored failed, code server_error."""
    front, _, client = lasting
    events = list(client.responses.create(model="tiny", input="poisoned", stream=True))
    assert [e.type for e in events][-1] == "response.failed" and "response.output_text.delta" in [e.type for e in events]
    failed = events[-1].response
    assert failed.status == "failed" and failed.error.code == "server_error"
    assert "NaN logits" in failed.error.message and client.responses.retrieve(failed.id).status == "failed"
    queued = client.responses.create(model="tiny", input="poisoned", background=True)
    stored = finished(client, queued.id)
    assert stored.status == "failed" and stored.error.code == "server_error" and "NaN logits" in stored.error.message


def test_a_background_response_whose_run_breaks_unexpectedly_is_stored_failed_not_left_in_progress(lasting):
    """A bug of ours inside the run (an exception no reply maps) still ends the stored response."""
    _, triton, client = lasting

    async def broken(inputs):
        raise ValueError("boom")
        yield  # an async generator, as Triton's client's is

    triton.generate = broken
    queued = client.responses.create(model="tiny", input="hi", background=True)
    stored = finished(client, queued.id)
    assert stored.status == "failed" and stored.error.code == "server_error"
    assert stored.error.message == "internal error: ValueError: boom"


@pytest.mark.parametrize("fields, param", [(dict(stream=True), "background"), (dict(store=False), "background"),
                                           (dict(top_logprobs=2), "top_logprobs")])
def test_a_background_response_that_cannot_be_followed_is_a_400(served, fields, param):
    front, triton, _ = served
    response = front.post("/v1/responses", json={"model": "tiny", "input": "hi", "background": True, **fields})
    assert response.status_code == 400 and response.json()["error"]["param"] == param and not triton.requests
    nothing = TestClient(create_app(FrontSettings("tiny", responses_store=0), FakeTriton()))
    assert nothing.post("/v1/responses", json={"model": "tiny", "input": "hi", "background": True}).json()[
        "error"]["param"] == "background"


def test_a_background_response_still_running_at_shutdown_closes_its_request():
    triton = FakeTriton()
    triton.generate = endless(triton)
    with TestClient(create_app(FrontSettings("tiny"), triton)) as front:
        queued = front.post("/v1/responses", json={"model": "tiny", "input": "hi", "background": True}).json()
        while not triton.requests:  # until its request streams
            front.get(f"/v1/responses/{queued['id']}")
        assert not triton.closed
    assert triton.closed == 1

"""The OpenAI front in-process over a stand-in Triton client: shapes, SSE, auth, and the 4xx table."""

import asyncio
import json

import pytest
from fastapi.testclient import TestClient
from httpx_sse import connect_sse

import dflash_trt
from dflash_trt.serve.openai_api import FrontSettings, create_app
from dflash_trt.serve.requests import RequestError
from dflash_trt.serve.triton_client import Piece, UpstreamError

USAGE = {"prompt_tokens": 3, "cached_tokens": 2, "completion_tokens": 3, "acceptance_lengths": [2, 1],
         "mean_acceptance_length": 1.5}


CALLING = ('Checking.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Milan"}}\n</tool_call>\n'
           '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>')
FORCED = '{"city": "Milan"}'
FORCED_LIST = '[{"name": "get_weather", "parameters": {"city": "Oslo"}}, {"name": "get_weather", "parameters": {}}]'
THINKING = "The user greets me.\nI greet back.\n</think>\n\nHello!"
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}}}}


class FakeTriton:
    """Answers 'abc' in three pieces (a seeded request: its seed in three digits); a prompt saying 'long'
    is refused as Triton's model would, as is seed 13 with a full queue."""

    def __init__(self):
        self.requests = []
        self.closed = 0
        self.is_ready = True

    async def generate(self, inputs):
        self.requests.append(inputs)
        prompt = inputs.get("messages") or inputs.get("text_input") or ""
        if "long" in str(prompt):
            raise RequestError("prompt", "the prompt has 999 tokens; the context capacity is 64 tokens")
        if "down" in str(prompt):
            raise UpstreamError("Stub process is not healthy")
        if inputs.get("health_check"):  # as Triton's model answers it
            if getattr(self, "down", None):
                raise RequestError(None, f"the engine is down: {self.down}", 503)
            yield Piece("", [], "healthy", {"max_model_len": 64})
            return
        if inputs.get("reset_prefix_cache"):
            self.resets = getattr(self, "resets", 0) + 1
            yield Piece("", [], "reset", None)
            return
        if inputs.get("tokenize_only"):  # ids: a text's characters' codes (mod 50), or the ids given
            ids = inputs.get("input_ids") or [ord(ch) % 50 for ch in str(prompt)]
            if max(ids, default=0) >= 50:
                raise RequestError("prompt", f"prompt token id {max(ids)} is outside the vocabulary (size 50)")
            yield Piece("", [], "tokenized", {"prompt_tokens": len(ids), "max_model_len": 64},
                        prompt_text="".join(chr(97 + t % 26) for t in ids), prompt_token_ids=ids)
            return
        if "beam_search" in inputs:  # a sign of life, then its sequences, whole, best first: "beam<k>" of 2 tokens
            width = json.loads(inputs["beam_search"])["beam_width"]
            yield Piece("", [], None, None)
            for k in range(width):
                ids = [7, 8] if inputs.get("return_token_ids") else ()
                yield Piece(f"beam{k}", [k, k], "length", {"prompt_tokens": 2, "completion_tokens": 2},
                            prompt_token_ids=ids)
            return
        seed = json.loads(inputs.get("sampling_parameters") or "{}").get("seed")
        if "busy" in str(prompt) or seed == 13:
            raise RequestError(None, "all 4 slots are taken and 8 requests already wait; retry shortly", 429)
        # a reply that calls the tools, or thinks first, a few characters per piece; held to forced calls'
        # JSON: one function's arguments, or a list of calls
        forced = json.loads(inputs.get("sampling_parameters") or "{}").get("structured_output", {}).get("json")
        reply = (None if forced is None else FORCED_LIST if forced.get("type") == "array" else FORCED) or (
            CALLING if "tools" in inputs else THINKING if "think" in str(prompt) else None)
        # a reply the front parses reasoning from: the model counts its tokens (5 here)
        usage = {**USAGE, "reasoning_tokens": 5} if "reasoning_end" in inputs else USAGE
        if reply is not None:
            for at in range(0, len(reply), 7):
                end = at + 7 >= len(reply)
                yield Piece(reply[at:at + 7], [at], "stop" if end else None, usage if end else None)
            return
        # the first piece's prompt text (echo) and prompt logprobs (prompt_logprobs n: the top n+1 here)
        top = json.loads(inputs.get("sampling_parameters") or "{}").get("prompt_logprobs")
        ids = inputs.get("input_ids") or [7, 8]
        first = {"prompt_text": f"<{' '.join(map(str, ids))}>" if inputs.get("echo") else "",
                 "prompt_token_ids": ids if inputs.get("return_token_ids") else (),
                 "prompt_logprobs": None if top is None else [
                     [t, f"t{t}", None if i == 0 else -0.5 * i, None if i == 0 else
                      [[100 + k, f"t{100 + k}", -0.1 * (k + 1)] for k in range(top + 1)]] for i, t in enumerate(ids)]}
        try:
            for i, ch in enumerate("abc" if seed is None else f"{seed:03d}"):
                yield Piece(ch, [i], "length" if i == 2 else None, USAGE if i == 2 else None, **(first if i == 0 else {}))
                if "poisoned" in str(prompt):  # the target's logits turn NaN after the first token
                    raise RequestError(None, "internal error: the target's logits at output token 1 gave no token "
                                             "(NaN logits, or every token masked out)", 500)
                await asyncio.sleep(0.001)  # the engine's next step: other requests' pieces come between
        finally:
            self.closed += 1

    async def ready(self):
        return self.is_ready

    async def metrics(self):
        return "vllm:num_requests_running 0\n"

    async def close(self):
        pass


@pytest.fixture
def front():
    triton = FakeTriton()
    client = TestClient(create_app(FrontSettings("tiny", api_key=None, max_body_bytes=4096), triton))
    client.triton = triton
    return client


def chat(**fields):
    return {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], **fields}


def events(front, path, body):
    """(the response, the data of each Server-Sent Event) of a streamed request, read by httpx-sse."""
    with connect_sse(front, "POST", path, json=body) as source:
        return source.response, [event.data for event in source.iter_sse()]


def test_chat_whole(front):
    body = front.post("/v1/chat/completions", json=chat(max_tokens=3)).json()
    assert body["object"] == "chat.completion"
    assert body["choices"][0]["message"] == {"role": "assistant", "content": "abc"}
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"] == {"prompt_tokens": 3, "completion_tokens": 3, "total_tokens": 6,
                             "prompt_tokens_details": {"cached_tokens": 2},
                             "acceptance_lengths": [2, 1], "mean_acceptance_length": 1.5}
    sent = front.triton.requests[0]
    assert json.loads(sent["sampling_parameters"]) == {"max_tokens": 3}


def test_chat_stream(front):
    r, data = events(front, "/v1/chat/completions", chat(stream=True, stream_options={"include_usage": True}))
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    assert data[-1] == "[DONE]"
    chunks = [json.loads(d) for d in data[:-1]]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"]) == "abc"
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 3
    assert len({c["id"] for c in chunks}) == 1


@pytest.mark.parametrize("path, body", [("/v1/chat/completions", chat(n=2)),
                                        ("/v1/completions", {"model": "tiny", "prompt": "x", "n": 2})])
def test_continuous_usage_stats_give_every_chunk_its_choice_s_usage_so_far(front, path, body):
    """vLLM's stream_options.continuous_usage_stats: each choice's chunks carry its prompt's tokens (their
    ids asked of the Triton model, not sent to the client) and its reply's so far; the last chunk the whole."""
    options = {"include_usage": True, "continuous_usage_stats": True}
    _, data = events(front, path, {**body, "stream": True, "stream_options": options})
    assert all(sent.get("return_token_ids") for sent in front.triton.requests)
    chunks = [json.loads(d) for d in data[:-1]]
    for index in (0, 1):
        mine = [c for c in chunks if c["choices"] and c["choices"][0]["index"] == index]
        assert [c["usage"]["completion_tokens"] for c in mine if c["choices"][0].get("finish_reason") is None
                and (c["choices"][0].get("delta", {}).get("content") or c["choices"][0].get("text"))] == [1, 2, 3]
        assert {(c["usage"]["prompt_tokens"], c["usage"]["total_tokens"] - c["usage"]["completion_tokens"])
                for c in mine} == {(2, 2)}  # the stand-in's prompt: ids [7, 8]
        assert all("token_ids" not in c["choices"][0] and "prompt_token_ids" not in c for c in mine)
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 6
    _, plain = events(front, path, {**body, "stream": True, "stream_options": {"include_usage": True}})
    assert all("usage" not in json.loads(d) for d in plain[:-2])  # without it, only the last chunk


def test_a_beam_search_is_one_triton_request_per_prompt_whose_replies_are_its_choices(front):
    """use_beam_search with n = 3: one Triton request (its beam_search input) and 3 choices, best first;
    a completion of two prompts: two requests, prompt i's beams choices 3i..3i+2; streamed alike."""
    reply = front.post("/v1/chat/completions", json=chat(use_beam_search=True, n=3, max_tokens=5)).json()
    assert len(front.triton.requests) == 1
    assert json.loads(front.triton.requests[0]["beam_search"]) == {"beam_width": 3, "length_penalty": 1.0}
    assert [(c["index"], c["message"]["content"]) for c in reply["choices"]] == [(k, f"beam{k}") for k in range(3)]
    assert reply["usage"]["prompt_tokens"] == 2 and reply["usage"]["completion_tokens"] == 6
    body = {"model": "tiny", "prompt": ["a", "b"], "n": 3, "use_beam_search": True, "max_tokens": 5}
    whole = front.post("/v1/completions", json=body).json()
    assert [r["text_input"] for r in front.triton.requests[1:]] == ["a", "b"]
    assert [(c["index"], c["text"]) for c in whole["choices"]] == [(i * 3 + k, f"beam{k}") for i in (0, 1)
                                                                   for k in range(3)]
    _, data = events(front, "/v1/completions", {**body, "stream": True})
    streamed = {}
    for chunk in (json.loads(d) for d in data[:-1]):
        for choice in chunk["choices"]:
            streamed[choice["index"]] = streamed.get(choice["index"], "") + choice["text"]
    assert streamed == {c["index"]: c["text"] for c in whole["choices"]}


def test_completion_whole_and_stream(front):
    whole = front.post("/v1/completions", json={"model": "tiny", "prompt": "x"}).json()
    assert whole["object"] == "text_completion" and whole["choices"][0]["text"] == "abc"
    _, data = events(front, "/v1/completions", {"model": "tiny", "prompt": [1, 2], "stream": True})
    assert "".join(json.loads(d)["choices"][0]["text"] for d in data[:-1]) == "abc"
    assert front.triton.requests[-1]["input_ids"] == [1, 2]


def test_models_health_metrics(front):
    assert front.get("/v1/models").json()["data"][0]["id"] == "tiny"
    assert front.get("/v1/models").json()["data"][0]["max_model_len"] == 64  # vLLM's: what the model says
    assert front.get("/health").status_code == 200
    assert "vllm:num_requests_running" in front.get("/metrics").text


def test_a_card_says_its_max_model_len_once_the_model_has_started():
    triton = FakeTriton()
    triton.down = "starting"  # (any refusal of the health check)
    front = TestClient(create_app(FrontSettings("tiny"), triton))
    assert "max_model_len" not in front.get("/v1/models").json()["data"][0]
    triton.down = None
    assert front.get("/v1/models/tiny").json()["max_model_len"] == 64
    asked = len(triton.requests)
    assert front.get("/v1/models").json()["data"][0]["max_model_len"] == 64 and len(triton.requests) == asked


def test_a_model_is_retrieved_by_its_id_and_the_server_says_its_version():
    openai = pytest.importorskip("openai")  # a test dependency (.[test])
    front = TestClient(create_app(FrontSettings("org/tiny-v1"), FakeTriton()))
    client = openai.OpenAI(base_url="http://testserver/v1", api_key="k", http_client=front)
    assert client.models.retrieve("org/tiny-v1").id == "org/tiny-v1"  # an id with a slash, as hub ids have
    with pytest.raises(openai.NotFoundError) as missing:
        client.models.retrieve("other")
    assert missing.value.body["param"] == "model" and missing.value.body["code"] == "model_not_found"
    assert front.get("/version").json() == {"version": dflash_trt.__version__}
    assert [front.get("/ping").json(), front.post("/ping").json()] == [{"status": "ready"}] * 2  # SageMaker's probe


@pytest.mark.parametrize("path, kwargs, status, param", [
    ("/v1/chat/completions", {"content": b"{nope", "headers": {"content-type": "application/json"}}, 400, None),
    ("/v1/chat/completions", {"json": {"model": "tiny"}}, 400, "messages"),
    ("/v1/chat/completions", {"json": {"model": "tiny", "messages": [{"role": "user"}], "top_p": 0}}, 400, "top_p"),
    ("/v1/chat/completions", {"json": chat(temperature=-1)}, 400, "temperature"),
    ("/v1/chat/completions", {"json": chat(max_tokens=0)}, 400, "max_tokens"),
    ("/v1/chat/completions", {"json": chat(n=65)}, 400, "n"),
    ("/v1/chat/completions", {"json": chat(presence_penalty=2.5)}, 400, "presence_penalty"),
    ("/v1/chat/completions", {"json": chat(min_p=1.1)}, 400, "min_p"),
    ("/v1/chat/completions", {"json": chat(guided_regex="(", stream=True)}, 400, "guided_regex"),
    ("/v1/chat/completions", {"json": chat(prompt_logprobs=1, stream=True)}, 400, "prompt_logprobs"),
    ("/v1/completions", {"json": {"model": "tiny", "prompt": "x", "prompt_logprobs": 21}}, 400, "prompt_logprobs"),
    ("/v1/completions", {"json": {"model": "tiny", "prompt": ["a", "b"], "n": 33}}, 400, "prompt"),
    ("/v1/completions", {"json": {"model": "tiny", "prompt": []}}, 400, "prompt"),
    ("/v1/completions", {"json": {"model": "tiny", "prompt": "x", "logit_bias": {"1": 500}}}, 400, "logit_bias.1"),
    ("/v1/chat/completions", {"json": chat(model="other")}, 404, "model"),
    ("/v1/chat/completions", {"json": chat(messages=[{"role": "user", "content": "long"}])}, 400, "messages"),
    ("/v1/chat/completions", {"json": chat(stream=True, messages=[{"role": "user", "content": "long"}])}, 400, "messages"),
    ("/v1/completions", {"json": {"model": "tiny", "prompt": "long"}}, 400, "prompt"),
    ("/v1/chat/completions", {"content": b"x" * 5000, "headers": {"content-type": "application/json"}}, 413, None),
    ("/v1/chat/completions", {"json": chat(messages=[{"role": "user", "content": "down"}])}, 503, None),
])
def test_bad_requests_get_openai_errors(front, path, kwargs, status, param):
    response = front.post(path, **kwargs)
    assert response.status_code == status
    error = response.json()["error"]
    assert error["param"] == param and error["message"] and error["type"]


def test_health_says_starting_before_the_model_serves_and_draining_after():
    triton = FakeTriton()
    front = TestClient(create_app(FrontSettings("tiny"), triton))
    triton.is_ready = False
    starting = front.get("/health")
    triton.is_ready = True
    assert front.get("/health").json() == {"status": "ready"}
    triton.is_ready = False
    draining = front.get("/health")
    assert (starting.status_code, starting.json()["error"]["code"]) == (503, "starting")
    assert (draining.status_code, draining.json()["error"]["code"]) == (503, "draining")


def test_health_says_engine_down_once_the_engine_takes_no_more_requests():
    triton = FakeTriton()
    front = TestClient(create_app(FrontSettings("tiny"), triton))
    assert front.get("/health").status_code == 200 and triton.requests[-1] == {"health_check": True}
    triton.down = "3 steps failed in a row, the last: RuntimeError: CUDA error: an illegal memory access"
    down = front.get("/health")
    assert (down.status_code, down.json()["error"]["code"]) == (503, "engine_down")
    assert down.json()["error"]["message"] == f"the engine is down: {triton.down}"
    assert front.get("/ping").status_code == 503


def test_unknown_paths_and_methods_are_json(front):
    assert front.get("/v1/nothing").json()["error"]["message"]
    assert front.get("/v1/chat/completions").status_code == 405


def test_api_key():
    front = TestClient(create_app(FrontSettings("tiny", api_key="sekret"), FakeTriton()))
    assert front.get("/v1/models").status_code == 401
    assert front.get("/v1/models/tiny").status_code == 401
    assert front.post("/v1/chat/completions", json=chat(), headers={"Authorization": "Bearer wrong"}).status_code == 401
    ok = front.post("/v1/chat/completions", json=chat(), headers={"Authorization": "Bearer sekret"})
    assert ok.status_code == 200
    assert front.get("/health").status_code == 200  # probes need no key


def test_a_full_queue_is_a_429_with_retry_after(front):
    body = {"model": "tiny", "messages": [{"role": "user", "content": "busy"}]}
    response = front.post("/v1/chat/completions", json=body)
    assert response.status_code == 429 and response.headers["Retry-After"] == "1"
    assert response.json()["error"]["type"] == "rate_limit_error"


def test_n_choices_are_requests_of_their_own_seeded_seed_plus_i(front):
    body = front.post("/v1/chat/completions", json=chat(n=3, seed=5, logprobs=True)).json()
    assert [(c["index"], c["message"]["content"], c["finish_reason"]) for c in body["choices"]] == [
        (0, "005", "length"), (1, "006", "length"), (2, "007", "length")]
    assert [json.loads(r["sampling_parameters"])["seed"] for r in front.triton.requests] == [5, 6, 7]
    # the prompt counted once, the completions and verify steps of all three
    assert body["usage"] == {"prompt_tokens": 3, "completion_tokens": 9, "total_tokens": 12,
                             "prompt_tokens_details": {"cached_tokens": 2},
                             "acceptance_lengths": [2, 1] * 3, "mean_acceptance_length": 1.5}
    completion = front.post("/v1/completions", json={"model": "tiny", "prompt": "x", "n": 2}).json()
    assert [c["text"] for c in completion["choices"]] == ["abc", "abc"]


def test_n_choices_stream_side_by_side(front):
    _, data = events(front, "/v1/chat/completions", chat(n=2, stream=True, stream_options={"include_usage": True}))
    assert data[-1] == "[DONE]"
    chunks = [json.loads(d) for d in data[:-1]]
    by_choice = {0: [], 1: []}
    for chunk in chunks[:-1]:
        (choice,) = chunk["choices"]
        by_choice[choice["index"]].append(choice)
    for pieces in by_choice.values():
        assert pieces[0]["delta"] == {"role": "assistant", "content": ""}
        assert "".join(p["delta"].get("content") or "" for p in pieces) == "abc"
        assert [p["finish_reason"] for p in pieces].count("length") == 1 and pieces[-1]["finish_reason"] == "length"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 6
    assert len({c["id"] for c in chunks}) == 1
    _, data = events(front, "/v1/completions", {"model": "tiny", "prompt": "x", "n": 2, "seed": 1, "stream": True})
    texts = {0: "", 1: ""}
    for d in data[:-1]:
        (choice,) = json.loads(d)["choices"]
        texts[choice["index"]] += choice["text"]
    assert texts == {0: "001", 1: "002"}


@pytest.mark.parametrize("stream", [False, True])
def test_one_refused_choice_refuses_the_request_and_stops_the_others(front, stream):
    """Choice 1 (seed 13) finds the queue full: a 429 before any reply, and choices 0 and 2 are closed
    (which cancels them in the engine)."""
    response = front.post("/v1/chat/completions", json=chat(n=3, seed=12, stream=stream))
    assert response.status_code == 429 and response.json()["error"]["type"] == "rate_limit_error"
    assert len(front.triton.requests) == 3 and front.triton.closed == 2


@pytest.fixture
def tool_front():
    triton = FakeTriton()
    client = TestClient(create_app(FrontSettings("tiny", tool_parser="hermes"), triton))
    client.triton = triton
    return client


def test_tool_calls_come_back_parsed_through_the_openai_client(tool_front):
    from openai import OpenAI

    client = OpenAI(base_url="http://testserver/v1", api_key="none", http_client=tool_front)
    reply = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}],
                                           tools=[WEATHER])
    (choice,) = reply.choices
    assert choice.finish_reason == "tool_calls" and choice.message.content == "Checking."
    assert [(c.type, c.function.name, json.loads(c.function.arguments)) for c in choice.message.tool_calls] == [
        ("function", "get_weather", {"city": "Milan"}), ("function", "get_weather", {"city": "Oslo"})]
    assert json.loads(tool_front.triton.requests[0]["tools"]) == [WEATHER]
    # streamed: the content as it comes, each call whole once its block closes
    content, calls, reasons = "", {}, []
    for chunk in client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}],
                                                tools=[WEATHER], stream=True):
        delta = chunk.choices[0].delta
        content += delta.content or ""
        for call in delta.tool_calls or []:
            assert call.index not in calls and call.id.startswith("call_")
            calls[call.index] = (call.function.name, json.loads(call.function.arguments))
        reasons.append(chunk.choices[0].finish_reason)
    assert content == "Checking."
    assert calls == {0: ("get_weather", {"city": "Milan"}), 1: ("get_weather", {"city": "Oslo"})}
    assert [r for r in reasons if r] == ["tool_calls"]
    one = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}],
                                         tools=[WEATHER], parallel_tool_calls=False)
    assert [c.function.arguments for c in one.choices[0].message.tool_calls] == ['{"city": "Milan"}']


def test_tool_choice_none_sends_no_tools_and_parses_nothing(tool_front):
    body = tool_front.post("/v1/chat/completions", json=chat(tools=[WEATHER], tool_choice="none")).json()
    assert body["choices"][0]["message"] == {"role": "assistant", "content": "abc"}
    assert "tools" not in tool_front.triton.requests[0]


def test_tools_on_a_server_that_parses_none_are_refused(front):
    response = front.post("/v1/chat/completions", json=chat(tools=[WEATHER]))
    assert response.status_code == 400 and response.json()["error"]["param"] == "tools"
    assert "--tool-call-parser" in response.json()["error"]["message"] and not front.triton.requests


@pytest.mark.parametrize("path, body", [("/v1/chat/completions", chat(chat_template="{{ messages }}")),
                                        ("/tokenize", {"messages": [{"role": "user", "content": "hi"}],
                                                       "chat_template": "{{ messages }}"})])
def test_a_request_s_chat_template_is_taken_only_when_trusted(path, body):
    """vLLM's --trust-request-chat-template: without it a request's template is a 400 before any work;
    with it the template goes to the Triton model, and the reasoning parser asks it whether it thinks."""
    asked = []
    for trust in (False, True):
        triton = FakeTriton()
        front = TestClient(create_app(FrontSettings("tiny", trust_request_chat_template=trust, thinking=lambda
                                                    kwargs, template: asked.append(template) or False), triton))
        response = front.post(path, json=body)
        if not trust:
            assert response.status_code == 400 and response.json()["error"]["param"] == "chat_template"
            assert "--trust-request-chat-template" in response.json()["error"]["message"] and not triton.requests
        else:
            assert response.status_code == 200 and triton.requests[0]["chat_template"] == "{{ messages }}"
    assert asked == (["{{ messages }}"] if path.startswith("/v1") else [])


def test_reasoning_comes_back_apart_from_the_content(tool_front):
    """--reasoning-parser qwen3 behind a template whose generation prompt opens a think block unless
    enable_thinking is false (the front asks `thinking` with the request's chat_template_kwargs)."""
    from openai import OpenAI

    front = TestClient(create_app(FrontSettings("tiny", thinking=lambda kwargs, template: kwargs.get(
        "enable_thinking", True)), FakeTriton()))
    client = OpenAI(base_url="http://testserver/v1", api_key="none", http_client=front)
    think = [{"role": "user", "content": "think"}]
    reply = client.chat.completions.create(model="tiny", messages=think)
    message = reply.choices[0].message
    assert (message.reasoning_content, message.content) == ("The user greets me.\nI greet back.\n", "Hello!")
    assert reply.usage.completion_tokens_details.reasoning_tokens == 5  # what the model counted
    reasoning, content = "", ""
    for chunk in client.chat.completions.create(model="tiny", messages=think, stream=True):
        delta = chunk.choices[0].delta
        reasoning += getattr(delta, "reasoning_content", None) or ""
        content += delta.content or ""
    assert (reasoning, content) == ("The user greets me.\nI greet back.\n", "Hello!")
    plain = client.chat.completions.create(model="tiny", messages=think,
                                           extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    assert plain.choices[0].message.reasoning_content is None and plain.choices[0].message.content == THINKING
    # no reasoning parser: no reasoning_content at all
    assert "reasoning_content" not in tool_front.post("/v1/chat/completions", json=chat()).json()["choices"][0][
        "message"]


@pytest.mark.parametrize("stream", [False, True])
def test_a_forced_tool_choice_returns_the_calls_its_json_holds(front, stream):
    """tool_choice naming a function, or "required": the engine holds the reply to the calls' JSON
    (test_protocol.py checks the schema sent), which comes back as tool_calls, with no tool-call parser."""
    from openai import OpenAI

    client = OpenAI(base_url="http://testserver/v1", api_key="none", http_client=front)
    for choice, want in [({"type": "function", "function": {"name": "get_weather"}}, [{"city": "Milan"}]),
                         ("required", [{"city": "Oslo"}, {}])]:
        reply = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}],
                                               tools=[WEATHER], tool_choice=choice, stream=stream)
        if stream:
            chunks = list(reply)
            assert not "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            calls = [call for c in chunks if c.choices for call in c.choices[0].delta.tool_calls or []]
            reason = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
        else:
            calls, reason = reply.choices[0].message.tool_calls, [reply.choices[0].finish_reason]
            assert reply.choices[0].message.content is None
        assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == [("get_weather", w) for w in want]
        assert reason == ["tool_calls"]


def test_a_grammar_starts_after_the_think_block_the_prompt_opened():
    """With the reasoning parser and a prompt that opens a think block, the grammar (structured output or
    forced calls) starts after "</think>"; without one it starts at once."""
    triton = FakeTriton()
    front = TestClient(create_app(FrontSettings("tiny", thinking=lambda kwargs, template: kwargs.get(
        "enable_thinking", True)), triton))
    front.post("/v1/chat/completions", json=chat(guided_regex="[0-9]+"))
    front.post("/v1/chat/completions", json=chat(guided_regex="[0-9]+",
                                                 chat_template_kwargs={"enable_thinking": False}))
    front.post("/v1/chat/completions", json=chat(tools=[WEATHER], tool_choice="required"))
    front.post("/v1/chat/completions", json=chat())
    sent = [json.loads(r["sampling_parameters"]).get("structured_output") for r in triton.requests]
    assert sent[0] == {"regex": "[0-9]+", "after": "</think>"} and sent[1] == {"regex": "[0-9]+"}
    assert sent[2]["after"] == "</think>" and sent[3] is None


def test_several_prompts_give_n_choices_each_with_each_prompt_counted_once(front):
    whole = front.post("/v1/completions", json={"model": "tiny", "prompt": ["a", "b"], "n": 2, "seed": 5}).json()
    assert [c["index"] for c in whole["choices"]] == [0, 1, 2, 3]
    assert [c["text"] for c in whole["choices"]] == ["005", "006", "005", "006"]  # choice j of each: seed + j
    sent = [(r["text_input"], json.loads(r["sampling_parameters"])["seed"]) for r in front.triton.requests]
    assert sent == [("a", 5), ("a", 6), ("b", 5), ("b", 6)]
    assert whole["usage"]["prompt_tokens"] == 2 * USAGE["prompt_tokens"]
    assert whole["usage"]["completion_tokens"] == 4 * USAGE["completion_tokens"]
    _, data = events(front, "/v1/completions", {"model": "tiny", "prompt": [[1, 2], [3]], "stream": True})
    chunks = [json.loads(d) for d in data[:-1]]
    for index in (0, 1):
        assert "".join(c["choices"][0]["text"] for c in chunks if c["choices"][0]["index"] == index) == "abc"
    assert [r["input_ids"] for r in front.triton.requests[-2:]] == [[1, 2], [3]]


def test_echo_of_token_ids_is_the_text_the_model_decodes(front):
    whole = front.post("/v1/completions", json={"model": "tiny", "prompt": [4, 5], "echo": True}).json()
    assert whole["choices"][0]["text"] == "<4 5>abc" and front.triton.requests[-1]["echo"] is True
    _, data = events(front, "/v1/completions", {"model": "tiny", "prompt": [4, 5], "echo": True, "stream": True})
    texts = [json.loads(d)["choices"][0]["text"] for d in data[:-1]]
    assert texts[0] == "<4 5>" and "".join(texts) == "<4 5>abc"


def test_echo_with_logprobs_scores_the_prompt_first(front):
    """What lm-evaluation-harness sends for log-likelihoods: the prompt's tokens lead the logprobs (the
    first with null), their top cut to `logprobs`, offsets counting through the echoed text."""
    body = {"model": "tiny", "prompt": [4, 5], "echo": True, "logprobs": 1, "max_tokens": 1}
    whole = front.post("/v1/completions", json=body).json()
    assert json.loads(front.triton.requests[-1]["sampling_parameters"])["prompt_logprobs"] == 1
    logprobs = whole["choices"][0]["logprobs"]
    assert logprobs["tokens"][:2] == ["t4", "t5"] and logprobs["token_logprobs"][:2] == [None, -0.5]
    assert logprobs["top_logprobs"][:2] == [None, {"t100": -0.1}]
    assert logprobs["text_offset"][:2] == [0, 2]
    assert len(logprobs["tokens"]) == 2  # the fake sends no output token logprobs
    _, data = events(front, "/v1/completions", {**body, "stream": True})
    first = json.loads(data[0])["choices"][0]
    assert first["text"] == "<4 5>" and first["logprobs"]["token_logprobs"] == [None, -0.5]


def test_vllm_prompt_logprobs_of_a_completion_and_a_chat(front):
    whole = front.post("/v1/completions", json={"model": "tiny", "prompt": [4, 5, 6], "prompt_logprobs": 1}).json()
    assert whole["choices"][0]["prompt_logprobs"] == [
        None,
        {"5": {"logprob": -0.5, "rank": None, "decoded_token": "t5"},
         "100": {"logprob": -0.1, "rank": 1, "decoded_token": "t100"}},
        {"6": {"logprob": -1.0, "rank": None, "decoded_token": "t6"},
         "100": {"logprob": -0.1, "rank": 1, "decoded_token": "t100"}}]
    assert "logprobs" not in whole["choices"][0] or whole["choices"][0]["logprobs"] is None
    reply = front.post("/v1/chat/completions", json=chat(prompt_logprobs=0, n=2)).json()
    assert reply["prompt_logprobs"][0] is None and reply["prompt_logprobs"][1] == {
        "8": {"logprob": -0.5, "rank": None, "decoded_token": "t8"}}
    assert "prompt_logprobs" not in front.post("/v1/chat/completions", json=chat()).json()


def test_return_token_ids_gives_the_prompts_and_each_replys_ids(front):
    whole = front.post("/v1/completions", json={"model": "tiny", "prompt": [[4, 5], [6]], "return_token_ids": True}).json()
    assert [(c["prompt_token_ids"], c["token_ids"]) for c in whole["choices"]] == [([4, 5], [0, 1, 2]), ([6], [0, 1, 2])]
    reply = front.post("/v1/chat/completions", json=chat(return_token_ids=True, n=2)).json()
    assert reply["prompt_token_ids"] == [7, 8] and [c["token_ids"] for c in reply["choices"]] == [[0, 1, 2]] * 2
    plain = front.post("/v1/completions", json={"model": "tiny", "prompt": [4, 5]}).json()
    assert "token_ids" not in plain["choices"][0] and "return_token_ids" not in front.triton.requests[-1]


def test_streamed_token_ids_add_up_to_the_whole_reply_s(front):
    """Each chunk carries its new ids, a choice's first chunk its prompt's (vLLM's streamed form)."""
    _, chunks = events(front, "/v1/chat/completions", chat(return_token_ids=True, n=2, stream=True))
    chunks = [json.loads(c) for c in chunks[:-1]]
    for choice in range(2):
        mine = [c for c in chunks if c["choices"] and c["choices"][0]["index"] == choice]
        assert mine[0]["prompt_token_ids"] == [7, 8] and all("prompt_token_ids" not in c for c in mine[1:])
        assert [t for c in mine for t in c["choices"][0].get("token_ids", [])] == [0, 1, 2]
    _, chunks = events(front, "/v1/completions", {"model": "tiny", "prompt": [[4, 5], [6]], "stream": True,
                                                  "return_token_ids": True})
    chunks = [json.loads(c)["choices"][0] for c in chunks[:-1]]
    for choice, prompt in enumerate(([4, 5], [6])):
        mine = [c for c in chunks if c["index"] == choice]
        assert mine[0]["prompt_token_ids"] == prompt and all("prompt_token_ids" not in c for c in mine[1:])
        assert [t for c in mine for t in c.get("token_ids", [])] == [0, 1, 2]
    _, plain = events(front, "/v1/chat/completions", chat(stream=True))
    assert all("token_ids" not in json.loads(c)["choices"][0] for c in plain[:-1] if json.loads(c)["choices"])


def test_echo_puts_the_prompt_before_a_completion(front):
    whole = front.post("/v1/completions", json={"model": "tiny", "prompt": "Say: ", "echo": True, "n": 2}).json()
    assert [c["text"] for c in whole["choices"]] == ["Say: abc", "Say: abc"]
    _, data = events(front, "/v1/completions", {"model": "tiny", "prompt": "Say: ", "echo": True, "stream": True})
    texts = [json.loads(d)["choices"][0]["text"] for d in data[:-1]]
    assert texts[0] == "Say: " and "".join(texts) == "Say: abc"


def test_a_chat_s_echo_begins_the_reply_with_the_assistant_message_it_continues(front):
    """vLLM's chat echo: the last message, when it is the assistant's, leads the content (whole and
    streamed); after a user's turn there is nothing to repeat."""
    turns = [{"role": "user", "content": "Tell a story."}, {"role": "assistant", "content": "Once upon"}]
    body = {"model": "tiny", "messages": turns, "echo": True, "continue_final_message": True,
            "add_generation_prompt": False}
    whole = front.post("/v1/chat/completions", json=body).json()
    assert whole["choices"][0]["message"]["content"] == "Once uponabc"
    _, chunks = events(front, "/v1/chat/completions", {**body, "stream": True})
    contents = [json.loads(c)["choices"][0]["delta"].get("content") for c in chunks[:-1]]
    assert contents[:2] == ["", "Once upon"] and "".join(c or "" for c in contents) == "Once uponabc"
    plain = front.post("/v1/chat/completions", json=chat(echo=True)).json()
    assert plain["choices"][0]["message"]["content"] == "abc"


def test_tokenize_and_detokenize_go_to_the_triton_model_as_tokenize_only_requests(front):
    tokenized = front.post("/tokenize", json={"model": "tiny", "prompt": "hi"}).json()
    assert front.triton.requests[-1] == {"text_input": "hi", "tokenize_only": True}
    assert tokenized == {"count": 2, "max_model_len": 64, "tokens": [4, 5], "token_strs": None}
    turns = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Sure"}]
    front.post("/tokenize", json={"messages": turns, "add_generation_prompt": False, "continue_final_message": True,
                                  "chat_template_kwargs": {"enable_thinking": False}, "tools": [WEATHER]})
    sent = front.triton.requests[-1]
    assert json.loads(sent["messages"]) == turns and json.loads(sent["tools"]) == [WEATHER]
    assert json.loads(sent["chat_template_kwargs"]) == {"enable_thinking": False, "add_generation_prompt": False,
                                                       "continue_final_message": True}
    assert front.post("/detokenize", json={"tokens": [0, 1, 27]}).json() == {"prompt": "abb"}
    assert front.triton.requests[-1] == {"input_ids": [0, 1, 27], "tokenize_only": True}


@pytest.mark.parametrize("path, body, status, param", [
    ("/tokenize", {"prompt": "hi", "messages": [{"role": "user", "content": "x"}]}, 400, "messages"),
    ("/tokenize", {"model": "tiny"}, 400, "prompt"),
    ("/tokenize", {"prompt": "hi", "tools": [WEATHER]}, 400, "tools"),
    ("/tokenize", {"prompt": "hi", "add_special_tokens": False}, 400, "add_special_tokens"),
    ("/tokenize", {"prompt": "hi", "return_token_strs": True}, 400, "return_token_strs"),
    ("/tokenize", {"prompt": "hi", "model": "other"}, 404, "model"),
    ("/tokenize", {"prompt": "hi", "temperature": 1}, 400, "temperature"),
    ("/detokenize", {"tokens": []}, 400, "tokens"),
    ("/detokenize", {"tokens": [3, 99]}, 400, "tokens"),  # outside the model's vocabulary
])
def test_bad_tokenize_requests_are_openai_errors(front, path, body, status, param):
    response = front.post(path, json=body)
    assert response.status_code == status and response.json()["error"]["param"] == param


def test_tokenize_and_detokenize_need_the_api_key():
    front = TestClient(create_app(FrontSettings("tiny", api_key="k"), FakeTriton()))
    for path, body in (("/tokenize", {"prompt": "hi"}), ("/detokenize", {"tokens": [1]})):
        assert front.post(path, json=body).status_code == 401
        assert front.post(path, json=body, headers={"Authorization": "Bearer k"}).status_code == 200


def test_a_prefix_cache_reset_asks_the_triton_model_and_needs_the_key():
    """vLLM's POST /reset_prefix_cache (200, no body) and SGLang's /flush_cache (GET or POST, text): each
    one reset request to the Triton model; without the API key a 401 and nothing asked."""
    triton = FakeTriton()
    front = TestClient(create_app(FrontSettings("tiny", api_key="k"), triton))
    key = {"Authorization": "Bearer k"}
    assert front.post("/reset_prefix_cache").status_code == 401 and not triton.requests
    reset = front.post("/reset_prefix_cache", headers=key)
    assert (reset.status_code, reset.content) == (200, b"")
    for method in (front.get, front.post):
        flushed = method("/flush_cache", headers=key)
        assert (flushed.status_code, flushed.text) == (200, "Cache flushed.\n")
    assert triton.requests == [{"reset_prefix_cache": True}] * 3


@pytest.mark.parametrize("path, body, kind", [
    ("/v1/chat/completions", chat(stream=True, messages=[{"role": "user", "content": "poisoned"}]), "server_error"),
    ("/v1/completions", {"model": "tiny", "prompt": "poisoned", "stream": True}, "server_error"),
    ("/v1/messages", {"model": "tiny", "max_tokens": 8, "stream": True,  # Anthropic's name for it
                      "messages": [{"role": "user", "content": "poisoned"}]}, "api_error"),
])
def test_a_reply_the_engine_fails_mid_stream_ends_with_a_server_error_event(front, path, body, kind):
    """What went out stays; the last event is the error (the status line has gone already)."""
    response, data = events(front, path, body)
    assert response.status_code == 200
    last = json.loads(data[-1])
    assert last["error"]["type"] == kind
    assert last["error"]["message"].startswith("internal error: the target's logits at output token 1")
    assert any("a" in item for item in data[:-1]), "the first piece went out before the failure"

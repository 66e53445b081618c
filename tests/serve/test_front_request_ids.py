"""vLLM's request ids and request log in the front, over the stand-in Triton client of test_front.py: a
chat's or completion's id carries the client's id (the body's request_id, else its X-Request-Id),
--enable-request-id-headers puts X-Request-Id on every reply, --enable-log-requests says each request on
arrival; and --enable-force-include-usage ends every stream with its usage."""

import json

from fastapi.testclient import TestClient
from test_front import FakeTriton

from dflash_trt.serve.openai_api import FrontSettings, create_app


def chat(**fields):
    return {"model": "tiny", "messages": [{"role": "user", "content": "hi there, a big question"}], **fields}


def test_the_reply_id_carries_the_body_s_request_id_else_the_header_s():
    front = TestClient(create_app(FrontSettings("tiny"), FakeTriton()))
    assert front.post("/v1/chat/completions", json=chat(request_id="r-1")).json()["id"] == "chatcmpl-r-1"
    headed = front.post("/v1/completions", json={"model": "tiny", "prompt": "hi"}, headers={"X-Request-Id": "h-2"})
    assert headed.json()["id"] == "cmpl-h-2"
    assert "x-request-id" not in headed.headers  # only with request_id_headers
    both = front.post("/v1/chat/completions", json=chat(request_id="r-3"), headers={"X-Request-Id": "h-3"})
    assert both.json()["id"] == "chatcmpl-r-3"
    assert front.post("/v1/chat/completions", json=chat(request_id="")).status_code == 400


def test_with_request_id_headers_every_reply_carries_one_and_a_new_one_is_the_reply_s_id():
    front = TestClient(create_app(FrontSettings("tiny", api_key="k", request_id_headers=True), FakeTriton()))
    key = {"Authorization": "Bearer k"}
    given = front.post("/v1/chat/completions", json=chat(), headers={**key, "X-Request-Id": "abc"})
    assert given.headers["x-request-id"] == "abc" and given.json()["id"] == "chatcmpl-abc"
    fresh = front.post("/v1/chat/completions", json=chat(), headers=key)
    assert len(fresh.headers["x-request-id"]) == 32 and fresh.json()["id"] == "chatcmpl-" + fresh.headers["x-request-id"]
    refused = front.post("/v1/chat/completions", json=chat(), headers={"X-Request-Id": "no-key"})
    assert refused.status_code == 401 and refused.headers["x-request-id"] == "no-key"
    with front.stream("POST", "/v1/chat/completions", json=chat(stream=True), headers={**key, "X-Request-Id": "s"}) as r:
        assert r.headers["x-request-id"] == "s"


def test_each_request_is_said_on_arrival_its_prompt_cut_to_max_log_len():
    said: list[str] = []
    front = TestClient(create_app(FrontSettings("tiny", request_log=said.append, max_log_len=12), FakeTriton()))
    front.post("/v1/chat/completions", json=chat(request_id="a", temperature=0.5, max_tokens=3))
    front.post("/v1/completions", json={"model": "tiny", "prompt": "a prompt wider than twelve", "request_id": "b"})
    first, second = said
    head, params = first.split(", params: ")
    assert head == "Received request chatcmpl-a: prompt: " + repr(json.dumps([{"role": "user",
                                                                              "content": "hi there, a big question"}])[:12])
    assert json.loads(params)["temperature"] == 0.5 and json.loads(params)["max_tokens"] == 3
    assert second.startswith("Received request cmpl-b: prompt: 'a prompt wid', params: ")


def test_with_force_include_usage_a_stream_that_did_not_ask_ends_with_its_usage():
    """vLLM's --enable-force-include-usage."""
    from test_front import events

    for forced in (False, True):
        front = TestClient(create_app(FrontSettings("tiny", force_include_usage=forced), FakeTriton()))
        for path, body in (("/v1/chat/completions", chat(stream=True)),
                           ("/v1/completions", {"model": "tiny", "prompt": "x", "stream": True})):
            _, data = events(front, path, body)
            last = json.loads(data[-2])
            assert data[-1] == "[DONE]"
            assert (last["choices"] == [] and last["usage"]["completion_tokens"] == 3) == forced, (path, last)

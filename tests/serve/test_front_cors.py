"""CORS (vLLM's --allowed-origins and friends) in-process over the stand-in Triton client of
test_front.py: none by default; the origins named may call the API from a browser page, a preflight
needs no API key, and a refusal carries the headers too (so the page can read why)."""

from fastapi.testclient import TestClient
from test_front import FakeTriton

from dflash_trt.serve.openai_api import FrontSettings, create_app

APP = "https://app.example"
PREFLIGHT = {"Origin": APP, "Access-Control-Request-Method": "POST",
             "Access-Control-Request-Headers": "authorization, content-type"}
BODY = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}


def front(**settings) -> TestClient:
    return TestClient(create_app(FrontSettings("tiny", **settings), FakeTriton()))


def test_no_origin_is_allowed_by_default():
    client = front()
    assert "access-control-allow-origin" not in client.post("/v1/chat/completions", json=BODY,
                                                            headers={"Origin": APP}).headers
    assert client.options("/v1/chat/completions", headers=PREFLIGHT).status_code == 405  # no CORS: no preflight


def test_an_allowed_origin_passes_the_preflight_without_the_key_and_reads_replies_and_refusals():
    client = front(allowed_origins=(APP,), api_key="sekret")
    preflight = client.options("/v1/chat/completions", headers=PREFLIGHT)
    assert preflight.status_code == 200 and preflight.headers["access-control-allow-origin"] == APP
    assert "POST" in preflight.headers["access-control-allow-methods"]
    served = client.post("/v1/chat/completions", json=BODY, headers={"Origin": APP, "Authorization": "Bearer sekret"})
    assert served.status_code == 200 and served.headers["access-control-allow-origin"] == APP
    refused = client.post("/v1/chat/completions", json=BODY, headers={"Origin": APP})
    assert refused.status_code == 401 and refused.headers["access-control-allow-origin"] == APP


def test_another_origin_gets_no_allow_header():
    client = front(allowed_origins=("https://other.example",))
    assert client.options("/v1/chat/completions", headers=PREFLIGHT).status_code == 400
    assert "access-control-allow-origin" not in client.post("/v1/chat/completions", json=BODY,
                                                            headers={"Origin": APP}).headers


def test_any_origin_and_credentials_as_vllm_takes_them():
    client = front(allowed_origins=("*",), allow_credentials=True, allowed_methods=("POST",))
    preflight = client.options("/v1/chat/completions", headers=PREFLIGHT)
    # with credentials the origin is echoed, never "*" (browsers refuse "*" with credentials)
    assert preflight.headers["access-control-allow-origin"] == APP
    assert preflight.headers["access-control-allow-credentials"] == "true"
    assert client.options("/v1/chat/completions", headers={**PREFLIGHT, "Access-Control-Request-Method": "DELETE"}
                          ).status_code == 400

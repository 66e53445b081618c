"""The OpenAI front fuzzed from its own OpenAPI schema by schemathesis (in-process, over the stand-in
Triton client of test_front.py): every generated request, valid or not, gets a documented status and
a body of its documented shape; never a 5xx. The real server gets the same check in
test_serve_end_to_end.py."""

import pytest
from fastapi.testclient import TestClient
from fuzz_bodies import acceptable
from test_front import FakeTriton

schemathesis = pytest.importorskip("schemathesis")  # a test dependency (.[test]); the GPU image lacks it
from hypothesis import HealthCheck, settings  # noqa: E402  (schemathesis brings hypothesis)

from dflash_trt.serve.openai_api import FrontSettings, create_app

# a model with a tool-call format and a tokenizer (the stand-in's token names: "t<id>")
APP = create_app(FrontSettings("tiny", tool_parser="hermes", token_text=lambda t: f"t{t}"), FakeTriton())
schema = schemathesis.openapi.from_asgi("/openapi.json", APP)


def test_the_schema_documents_every_body():
    spec = TestClient(APP).get("/openapi.json").json()
    chat = spec["paths"]["/v1/chat/completions"]["post"]
    assert chat["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith("/ChatRequest")
    assert chat["responses"]["200"]["content"]["application/json"]["schema"]["$ref"].endswith("/ChatCompletion")
    assert "text/event-stream" in chat["responses"]["200"]["content"]
    assert chat["responses"]["400"]["content"]["application/json"]["schema"]["$ref"].endswith("/ErrorResponse")
    assert "422" not in chat["responses"]  # validation errors are OpenAI's 400s
    assert spec["paths"]["/v1/models"]["get"]["responses"]["200"]["content"]["application/json"]["schema"][
        "$ref"].endswith("/ModelList")
    assert TestClient(APP).get("/docs").status_code == 200
    assert TestClient(create_app(FrontSettings("tiny", docs=False), FakeTriton())).get("/docs").status_code == 404


@schema.parametrize()
@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@pytest.mark.filterwarnings("ignore")
def test_schema_fuzzing_finds_no_5xx_and_no_undocumented_reply(case):
    case.body = acceptable(case.body, case.operation.path)
    case.call_and_validate()

"""`dflash-trt serve BUNDLE`: a slots bundle served on the C++ onnxruntime executor equals offline
generation; with one slot and no queue, requests beyond it get a 429 through the real Triton model; a
bundle no executor runs is refused in one line before Triton starts."""

import asyncio
import importlib

import httpx

import pytest
from click.testing import CliRunner
from factories import export_tiny_slots_bundle
from server_process import need_triton, start_server

from dflash_trt.cli import main


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    need_triton()
    if not getattr(importlib.import_module("dflash_trt._core"), "HAS_ORT_EXECUTOR", False):
        pytest.skip("dflash_trt._core was built without the onnxruntime executor (no headers)")
    bundle = export_tiny_slots_bundle(tmp_path_factory.mktemp("served-slots"))
    # vLLM's --default-chat-template-kwargs: the tiny template opens an empty think block unless thinking
    started = start_server([str(bundle), "--capacity", "256", "--max-batch", "1", "--max-waiting", "0",
                            "--default-chat-template-kwargs", '{"enable_thinking": false}'])
    yield started, bundle
    assert started.stop() == 0


def test_bundle_reply_equals_offline(served):
    from openai import OpenAI

    from dflash_trt import LLM, SamplingParams

    server, bundle = served
    offline = LLM.from_bundle(bundle)
    client = OpenAI(base_url=server.url, api_key="none", max_retries=0, timeout=120)
    for prompt in ["hello", "def f(x):"]:
        turns = [{"role": "user", "content": prompt}]
        # the server's default template variables render the prompt; a request's own come first
        for own, variables in ({}, {"enable_thinking": False}), ({"enable_thinking": True}, {"enable_thinking": True}):
            expected = offline.chat(turns, SamplingParams(max_tokens=16), chat_template_kwargs=variables)[0]
            reply = client.chat.completions.create(model=server.model, messages=turns, max_tokens=16, temperature=0,
                                                   extra_body={"chat_template_kwargs": own} if own else None)
            assert reply.choices[0].message.content == expected.text
            assert reply.usage.prompt_tokens == len(expected.prompt_token_ids)
            assert reply.usage.completion_tokens == len(expected.token_ids)
    thinking_off = offline.chat([{"role": "user", "content": "hello"}], SamplingParams(max_tokens=1),
                                chat_template_kwargs={"enable_thinking": False})[0].prompt_token_ids
    assert len(thinking_off) > len(offline.encode("hello"))  # the default made a difference


def test_requests_beyond_the_slot_and_its_queue_get_a_429_and_the_rest_are_answered(served):
    """Eight requests at once on one slot with no waiting room: those arriving while the slot is busy
    are refused by the engine (Busy) and reach the client as OpenAI's 429 with Retry-After; none is
    lost or a 5xx, and the server answers again once the slot is free."""
    server, _ = served
    body = {"model": server.model, "messages": [{"role": "user", "content": "busy"}], "max_tokens": 200,
            "temperature": 0}

    async def at_once():
        async with httpx.AsyncClient(timeout=120) as http:
            return await asyncio.gather(*(http.post(f"{server.url}/chat/completions", json=body) for _ in range(8)))

    replies = asyncio.run(at_once())
    assert {r.status_code for r in replies} == {200, 429}, [r.status_code for r in replies]
    refused = next(r for r in replies if r.status_code == 429)
    assert refused.headers["Retry-After"] == "1" and refused.json()["error"]["type"] == "rate_limit_error"
    assert httpx.post(f"{server.url}/chat/completions", json=body, timeout=120).status_code == 200


def test_a_priority_on_a_first_come_first_served_server_is_a_400_naming_it(served):
    server, _ = served
    body = {"model": server.model, "prompt": "x", "max_tokens": 2, "priority": 1}
    reply = httpx.post(f"{server.url}/completions", json=body, timeout=60)
    assert reply.status_code == 400 and reply.json()["error"]["param"] == "priority"
    assert "needs scheduling_policy='priority'" in reply.json()["error"]["message"]
    assert httpx.post(f"{server.url}/completions", json={**body, "priority": 0}, timeout=60).status_code == 200


def test_a_portable_bundle_is_refused_before_the_server_starts(bundles):
    result = CliRunner().invoke(main, ["serve", str(bundles["qwen3"][0]), "--port", "0"])
    assert result.exit_code == 2
    assert "a graph contract 1 bundle; the C++ executors need contract 2" in result.stderr
    assert "serving" not in result.stdout

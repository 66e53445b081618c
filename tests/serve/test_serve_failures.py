"""`dflash-trt serve` over a target that gives NaN logits from one token on (factories'
make_poisoned_target): a request that meets them gets OpenAI's 500 error object, whole or mid-stream,
naming the cause; the requests beside it are served as offline; the server drains and stops."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from factories import POISON
from prometheus_client.parser import text_string_to_metric_families
from server_process import need_triton, start_server

from dflash_trt.spec.sampling import SamplingParams

CLEAN = [[5, 6, 7], [9, 8], [1, 2, 3, 4]]


@pytest.fixture(scope="module")
def server(poisoned_pair):
    need_triton()
    target, draft = poisoned_pair
    started = start_server(["--target", str(target), "--draft", str(draft), "--max-model-len", "256",
                            "--max-num-seqs", "4", "--backend", "torch"])
    yield started
    started.stop()


@pytest.fixture(scope="module")
def offline(poisoned_pair):
    from dflash_trt.runtime.llm import LLM

    return LLM(str(poisoned_pair[0]), str(poisoned_pair[1]), backend="torch")


def complete(server, prompt, **fields) -> httpx.Response:
    return httpx.post(f"{server.url}/completions", timeout=120,
                      json={"model": server.model, "prompt": prompt, "max_tokens": 12, "temperature": 0, **fields})


def test_a_prompt_with_nan_logits_is_a_500_and_the_prompts_beside_it_are_served_as_offline(server, offline):
    with ThreadPoolExecutor(4) as pool:
        replies = list(pool.map(lambda prompt: complete(server, prompt), [[5, POISON, 7], *CLEAN]))
    failed = replies[0]
    assert failed.status_code == 500
    error = failed.json()["error"]
    assert error["type"] == "server_error"
    assert error["message"].startswith("internal error: the target's logits after the prompt gave no token (NaN")
    for prompt, reply in zip(CLEAN, replies[1:], strict=True):
        assert reply.status_code == 200
        assert reply.json()["choices"][0]["text"] == offline.generate(prompt, SamplingParams(max_tokens=12))[0].text


def test_nan_logits_mid_stream_end_it_with_an_error_event_after_what_was_sent(server):
    body = {"model": server.model, "prompt": [5, 6], "max_tokens": 12, "temperature": 0, "stream": True,
            "logit_bias": {str(POISON): 100}}  # its first token is POISON: the next verify sees NaN logits
    events = []
    with httpx.stream("POST", f"{server.url}/completions", json=body, timeout=120) as response:
        assert response.status_code == 200
        events = [json.loads(line[6:]) for line in response.iter_lines()
                  if line.startswith("data: ") and line != "data: [DONE]"]
    assert "choices" in events[0], "the first token went out before the failure"
    assert events[-1]["error"]["code"] is None and events[-1]["error"]["type"] == "server_error"
    assert "the target's logits at output token 1 gave no token (NaN" in events[-1]["error"]["message"]


def test_failed_requests_are_counted_by_their_finish_reason(server):
    text = httpx.get(f"{server.root}/metrics", timeout=10).text
    errors = sum(s.value for family in text_string_to_metric_families(text) for s in family.samples
                 if s.name == "vllm:request_success_total" and s.labels.get("finished_reason") == "error")
    assert errors >= 2


def test_after_failures_the_server_is_healthy_drains_and_stops(server):
    """A request's NaN logits are its own failure, not the engine's: /health stays 200."""
    assert complete(server, CLEAN[0]).status_code == 200
    assert httpx.get(f"{server.root}/health", timeout=10).json() == {"status": "ready"}
    assert server.stop(timeout=60) == 0

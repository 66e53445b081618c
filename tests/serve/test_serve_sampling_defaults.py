"""The real server gives a request's left-out sampling fields the model's generation config defaults
(vLLM's --generation-config auto), else OpenAI's temperature 1: its replies equal offline generate's
with those values filled in, on the OpenAI and SGLang endpoints."""

import json

import httpx
import pytest
from factories import make_drafter, make_target
from server_process import need_triton, start_server

from dflash_trt.runtime.llm import LLM
from dflash_trt.spec.sampling import SamplingParams

SHIPPED = {"do_sample": True, "temperature": 0.6, "top_k": 20, "max_new_tokens": 6, "repetition_penalty": 1.2}
FILLED = {"temperature": 0.6, "top_k": 20, "max_tokens": 6, "repetition_penalty": 1.2}
PROMPT = "abcabcabc"


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("served-defaults")
    target = make_target(root / "target", "qwen3", seed=4)
    config = json.loads((target / "generation_config.json").read_text())
    (target / "generation_config.json").write_text(json.dumps({**config, **SHIPPED}))
    return str(target), str(make_drafter(root / "draft", seed=4, block_size=4, target_layer_ids=[1, 2]))


@pytest.fixture(scope="module")
def server(pair):
    need_triton()
    started = start_server(["--target", pair[0], "--draft", pair[1], "--max-model-len", "256", "--backend", "torch"])
    yield started
    started.stop()


@pytest.fixture(scope="module")
def offline(pair):
    return LLM(pair[0], pair[1], backend="torch", generation_config="vllm")  # every value given by the test


def completion_ids(server, **fields) -> list[int]:
    reply = httpx.post(f"{server.url}/completions", timeout=120, json={
        "model": server.model, "prompt": PROMPT, "return_token_ids": True, **fields})
    assert reply.status_code == 200, reply.text
    return reply.json()["choices"][0]["token_ids"]


def test_the_server_says_its_defaults_at_start(server):
    lines = [line for line in server.output if line.startswith("default sampling")]
    assert lines == ["default sampling (a request's own fields win; --generation-config): temperature 0.6, top_k 20, "
                     "repetition_penalty 1.2, max_tokens 6"]


def test_a_seeded_request_without_sampling_fields_is_offline_generate_with_the_defaults(server, offline):
    expected = offline.generate({"prompt": PROMPT}, SamplingParams(**FILLED, seed=11))[0].token_ids
    assert len(expected) == 6
    assert completion_ids(server, seed=11) == expected
    assert completion_ids(server, seed=11, max_tokens=40) == expected  # max_new_tokens caps, as vLLM's
    # SGLang's /generate, whose own default of 128 new tokens the cap holds to 6 too
    answer = httpx.post(f"{server.root}/generate", timeout=120,
                        json={"text": PROMPT, "sampling_params": {"sampling_seed": 11}}).json()
    assert answer["output_ids"] == expected


def test_a_requests_own_fields_win(server, offline):
    greedy = offline.generate({"prompt": PROMPT}, SamplingParams(**{**FILLED, "temperature": 0}))[0].token_ids
    assert completion_ids(server, temperature=0) == greedy
    plain = offline.generate({"prompt": PROMPT}, SamplingParams(max_tokens=6))[0].token_ids
    assert plain != greedy  # the penalty is what differs
    assert completion_ids(server, temperature=0, repetition_penalty=1.0) == plain

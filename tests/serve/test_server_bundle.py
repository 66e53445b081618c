"""`dflash-trt serve BUNDLE`: an exported ONNX bundle served on onnxruntime equals offline generation,
for a portable bundle (per-request sessions) and a slots bundle (the C++ onnxruntime executor)."""

import importlib

import pytest
from factories import export_tiny_slots_bundle
from server_process import need_triton, start_server


@pytest.fixture(scope="module", params=["portable", "slots"])
def served(request, bundles, tmp_path_factory):
    need_triton()
    if request.param == "portable":
        bundle = bundles["qwen3"][0]
    else:
        if not getattr(importlib.import_module("dflash_trt._core"), "HAS_ORT_EXECUTOR", False):
            pytest.skip("dflash_trt._core was built without the onnxruntime executor (no headers)")
        bundle = export_tiny_slots_bundle(tmp_path_factory.mktemp("served-slots"))
    started = start_server([str(bundle), "--capacity", "256", "--max-batch", "2"])
    yield started, bundle
    assert started.stop() == 0


def test_bundle_reply_equals_offline(served):
    from openai import OpenAI

    from dflash_trt import LLM, SamplingParams

    server, bundle = served
    offline = LLM.from_bundle(bundle)
    client = OpenAI(base_url=server.url, api_key="none", max_retries=0, timeout=120)
    for prompt in ["hello", "def f(x):"]:
        expected = offline.generate(prompt, SamplingParams(max_tokens=16))[0]
        reply = client.chat.completions.create(model=server.model, messages=[{"role": "user", "content": prompt}],
                                               max_tokens=16, temperature=0)
        assert reply.choices[0].message.content == expected.text
        assert reply.usage.completion_tokens == len(expected.token_ids)

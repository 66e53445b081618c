"""`dflash-trt serve --quant / --dtype` on the real tritonserver: the Triton model's LLM runs the target
as the options say, so a reply and its logprobs are offline generate's on an LLM placed the same (and
not the float target's, which a server that dropped the options would answer)."""

import pytest
from server_process import need_triton, start_server

from dflash_trt.spec.sampling import SamplingParams

PROMPT = "write a poem"


@pytest.fixture(scope="module")
def server(tiny_pairs):
    need_triton()
    target, draft = tiny_pairs["qwen3"]
    started = start_server(["--target", str(target), "--draft", str(draft), "--max-model-len", "256",
                            "--max-num-seqs", "2", "--backend", "torch", "--quant", "int4", "--dtype", "float32"])
    yield started
    started.stop()


def test_an_int4_target_served_answers_offline_int4_generate(server, tiny_pairs):
    from openai import OpenAI

    from dflash_trt.runtime.llm import LLM

    target, draft = (str(path) for path in tiny_pairs["qwen3"])
    client = OpenAI(base_url=server.url, api_key="none", max_retries=0, timeout=120)
    reply = client.chat.completions.create(model=server.model, messages=[{"role": "user", "content": PROMPT}],
                                           max_tokens=12, temperature=0, logprobs=True)
    served = [entry.logprob for entry in reply.choices[0].logprobs.content]
    params = SamplingParams(max_tokens=12, logprobs=1)
    for quant, same in (("int4", True), (None, False)):
        offline = LLM(target, draft, backend="torch", quant=quant).generate(PROMPT, params)[0]
        logprobs = [entries[t] for t, entries in zip(offline.token_ids, offline.logprobs, strict=True)]
        matches = reply.choices[0].message.content == offline.text and served == pytest.approx(logprobs, abs=1e-4)
        assert matches == same, quant

"""`dflash-trt serve` on the embedded SmolLM2-135M pair with its trained drafter: a real chat reply
equals offline generation, the drafter's acceptance reaches the client, and `bench --base-url` runs
against it. Slow: the target loads twice (server and test) on the CPU. The block is pinned
(--block-size 4) so that every step speculates; by default the engine may choose plain steps."""

import json

import pytest
from click.testing import CliRunner
from server_process import need_triton, start_server

from dflash_trt.models.embedded import DEFAULT_TARGET, default_drafter

pytestmark = pytest.mark.slow

if default_drafter(DEFAULT_TARGET) is None:
    pytest.skip("no drafter shipped for the embedded target", allow_module_level=True)


@pytest.fixture(scope="module")
def server():
    need_triton()
    started = start_server(["--max-batch", "4", "--capacity", "1024", "--block-size", "4"], timeout=600)
    yield started
    assert started.stop() == 0


def test_chat_equals_offline_and_reports_acceptance(server):
    from openai import OpenAI

    from dflash_trt import LLM, SamplingParams

    prompt = "Write a Python function that adds two numbers."
    expected = LLM(backend="torch").generate(prompt, SamplingParams(max_tokens=32))[0]
    client = OpenAI(base_url=server.url, api_key="none", max_retries=0, timeout=300)
    reply = client.chat.completions.create(model=server.model, messages=[{"role": "user", "content": prompt}],
                                           max_tokens=32, temperature=0)
    assert reply.choices[0].message.content == expected.text
    taus = reply.usage.model_extra["acceptance_lengths"]
    # τ per verify step: the trained drafter gets tokens accepted, so fewer steps than tokens
    assert taus and max(taus) > 1 and len(taus) < reply.usage.completion_tokens


def test_bench_against_the_server(server, tmp_path):
    from dflash_trt.cli import main

    out = tmp_path / "bench.json"
    result = CliRunner().invoke(main, ["bench", "--base-url", server.url, "--dataset", "humaneval",
                                       "--num-prompts", "2", "--max-tokens", "16", "--concurrency", "2",
                                       "--no-baseline", "--json-out", str(out)])
    assert result.exit_code == 0, result.output
    record = json.loads(out.read_text())
    assert "server" in result.output and record

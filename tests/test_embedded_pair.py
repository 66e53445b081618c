"""The embedded default pair (SmolLM2-135M-Instruct + our shipped drafter), on the real target.

Marked slow: it converts the packaged GGUF once (about 40 s) and runs a 135M model on the CPU.
"""

import json
from pathlib import Path

import pytest

from dflash_trt.models.embedded import DEFAULT_TARGET, default_drafter

pytestmark = pytest.mark.slow

if default_drafter(DEFAULT_TARGET) is None:
    pytest.skip("no drafter shipped for the embedded target", allow_module_level=True)

# Acceptance regression: τ measured with the shipped drafter (greedy, 64 new tokens, first 3
# prompts of each set; see dflash_trt/drafters/smollm2-135m-b16/README.md). A change that breaks acceptance (tap
# offset, mask id, positions, block layout) drops τ to about 1 and fails here.
PINNED_TAU = json.loads((Path(__file__).parent / "data" / "pinned_tau.json").read_text())
TOLERANCE = 0.06  # greedy is deterministic; one accepted token more or less moves τ by ~0.007


@pytest.fixture(scope="module")
def llm():
    from dflash_trt import LLM

    return LLM(backend="torch")  # the embedded default pair


def test_greedy_speculative_equals_autoregressive(llm):
    from dflash_trt import SamplingParams

    params = SamplingParams(max_tokens=48)
    for prompt in ["What is the capital of France?", "Write a Python function that adds two numbers.", "Name three colors."]:
        ar = llm.generate(prompt, params, speculative=False)[0]
        spec = llm.generate(prompt, params, speculative=True)[0]
        assert spec.token_ids == ar.token_ids and spec.text == ar.text


@pytest.mark.parametrize("key", sorted(PINNED_TAU))
def test_acceptance_length_regression(llm, key):
    from dflash_trt import SamplingParams
    from dflash_trt.bench.datasets import load_prompts
    from dflash_trt.bench.offline import run_offline
    from dflash_trt.bench.summary import summarize

    dataset, block = key.split("@")
    prompts = load_prompts(dataset, 3)
    records, wall, _ = run_offline(llm, prompts, SamplingParams(max_tokens=64), True, int(block), key)
    tau = summarize(records, wall, int(block)).mean_acceptance_length
    assert tau == pytest.approx(PINNED_TAU[key], abs=TOLERANCE)


def test_matches_the_authors_loop_on_the_real_pair(llm, monkeypatch):
    """Real acceptance (not a random drafter): same tokens and same τ per step as `dflash_generate`."""
    import time

    import torch
    from safetensors.torch import load_file
    from transformers import Qwen3Config

    from dflash_trt import SamplingParams

    reference = pytest.importorskip("dflash.model", reason="test oracle: pip install --no-deps dflash==0.1.0")
    monkeypatch.setattr(reference, "_cuda_time", time.perf_counter)
    path = default_drafter(DEFAULT_TARGET)
    raw = json.loads((path / "config.json").read_text())
    ref = reference.DFlashDraftModel(Qwen3Config(**raw)).eval()
    ref.load_state_dict({k: v.float() for k, v in load_file(path / "model.safetensors").items()}, strict=False)
    tokens, block = 48, 16
    llm.block_size = block
    prompt = llm.encode("Write a Python function that checks whether a number is prime.")
    stats = reference.dflash_generate(ref, llm.target.model, torch.tensor([prompt]), max_new_tokens=tokens,
                                      stop_token_ids=None, block_size=block, return_stats=True)
    ours = llm.generate(prompt, SamplingParams(max_tokens=tokens, ignore_eos=True))[0]
    assert ours.token_ids == stats.output_ids[0, len(prompt):].tolist()
    # Near the end the reference shrinks its block to the tokens left (ours drafts a full block and
    # truncates), which changes the non-causal draft: compare the steps whose block was full.
    taus, n = stats.acceptance_lengths, 0
    while n < len(taus) - 1 and tokens - sum(taus[:n]) >= block:
        n += 1
    assert n >= 10 and ours.metrics.acceptance_lengths[:n] == taus[:n]
    assert max(stats.acceptance_lengths) > 2  # a trained drafter: real acceptances were compared


def test_cli_generate_with_no_arguments_but_the_prompt():
    from click.testing import CliRunner

    from dflash_trt.cli import main

    result = CliRunner().invoke(main, ["generate", "--max-tokens", "24", "Say hello."])
    assert result.exit_code == 0, result.output
    assert "mean acceptance length" in result.stderr


@pytest.mark.parametrize("flavour", ["slots", "plugin"])
def test_the_embedded_pair_exports_and_runs_on_onnxruntime(llm, tmp_path, flavour):
    """Issue: the embedded pair exports (graphs checked by polygraphy) and decodes identically on
    onnxruntime: a slots bundle on the C++ executor, and the dflash custom ops' graphs (for engine
    builds) through the tests' contract-1 runner."""
    from contract1_runner import generate
    from reference import reference_output

    from dflash_trt import LLM, SamplingParams
    from dflash_trt.export.bundle import export_bundle
    from dflash_trt.export.op_library import LIBRARY

    if flavour == "plugin" and not LIBRARY.is_file():
        pytest.skip("dflash op library not built (bash scripts/build_plugins.sh)")
    bundle = export_bundle(llm.target, llm.drafter, llm.tokenizer, tmp_path / "bundle", flavour=flavour, check=True)
    params = SamplingParams(max_tokens=32)
    for prompt in ["Write a Python function that adds two numbers.", "Name three colors."]:
        ref = reference_output(llm, prompt, params, speculative=True, block_size=16)
        if flavour == "plugin":
            tokens, taus = generate(bundle, llm.encode(prompt), params, 16, llm.eos_token_ids)
            assert (tokens, taus) == (ref.token_ids, ref.metrics.acceptance_lengths)
            continue
        ours = LLM.from_bundle(bundle, block_size=16, max_batch=1, capacity=256).generate(prompt, params)[0]
        assert ours.token_ids == ref.token_ids


def test_structured_output_on_the_real_pair_keeps_drafts_and_the_constrained_loops_tokens(llm):
    """A JSON schema on the real target: its drafts get accepted through constrained verify positions
    (each masked by the drafts before it: llguidance's matcher advanced and rolled back), and the greedy
    reply is the constrained autoregressive loop's (tests/reference.py) and follows the schema."""
    from reference import constrained_greedy

    from dflash_trt import SamplingParams
    from dflash_trt.runtime.batch_runner import BatchRunner

    schema = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
              "required": ["name", "age"], "additionalProperties": False}
    params = SamplingParams(max_tokens=48, structured_output={"json": schema})
    prompt = "Give me a person as JSON: a name and an age."
    runner = BatchRunner(llm, max_batch=1, capacity=256, block_size=8)  # every step drafts (no adaptive choice)
    spec = runner.run([prompt], params)[0]
    assert spec.token_ids == constrained_greedy(llm, prompt, params.structured_output, 48)
    assert llm.generate(prompt, params, speculative=False)[0].token_ids == spec.token_ids
    assert spec.finish_reason == "stop" and set(json.loads(spec.text)) == {"name", "age"}
    assert max(spec.metrics.acceptance_lengths) > 1  # drafts kept past constrained positions

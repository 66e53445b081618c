"""The entry points through the C++ core on a GPU (marked `gpu`; run by scripts/gpu_check.sh): `LLM.generate`,
`LLM.stream`, an `Engine` and the `generate` command, each on the torch backend's CUDA executor in float32,
give the CPU executor's tokens, greedy and seeded at T>0. Skipped where PyTorch sees no GPU."""

import dataclasses
import json

import pytest
import torch
from click.testing import CliRunner

from dflash_trt import LLM, SamplingParams
from dflash_trt.cli import main
from dflash_trt.runtime.engine import Engine
from dflash_trt.runtime.batch_runner import BatchRunner

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU that PyTorch sees"),
]

PROMPTS = ["abc", [5, 6, 7], "hello there"]
PARAMS = [SamplingParams(max_tokens=10, ignore_eos=True),
          SamplingParams(max_tokens=10, temperature=0.8, top_p=0.9, seed=4, ignore_eos=True)]


@pytest.mark.parametrize("params", PARAMS, ids=["greedy", "seeded"])
def test_every_entry_point_on_cuda_gives_the_cpu_executors_tokens(tiny_pairs, params):
    target, draft = map(str, tiny_pairs["llama"])
    want = [o.token_ids for o in LLM(target, draft, block_size=4, backend="torch", device="cpu").generate(PROMPTS, params)]
    cuda = LLM(target, draft, block_size=4, backend="torch", device="cuda", dtype="float32")
    assert cuda.target.device.type == "cuda"
    assert [o.token_ids for o in cuda.generate(PROMPTS, params)] == want
    assert [list(cuda.stream(p, params))[-1].token_ids for p in PROMPTS] == want
    engine = Engine(cuda, max_batch=2, block_size=4)
    try:
        assert [list(engine.stream(p, params))[-1].token_ids for p in PROMPTS] == want
    finally:
        engine.shutdown()


def test_the_generate_command_on_cuda_gives_the_cpu_executors_tokens(tiny_pairs):
    target, draft = map(str, tiny_pairs["llama"])
    params = SamplingParams(max_tokens=10, temperature=0.8, top_p=0.9, seed=4)  # as the flags below say
    want = LLM(target, draft, block_size=4, backend="torch", device="cpu").generate("hello", params)[0]
    result = CliRunner().invoke(main, ["generate", "--target", target, "--draft", draft, "--backend", "torch",
                                       "--device", "cuda", "--dtype", "float32", "--block-size", "4", "--max-tokens",
                                       "10", "--temperature", "0.8", "--top-p", "0.9", "--seed", "4", "--json", "hello"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["token_ids"] == want.token_ids


def preempted(target: str, draft: str, device: str, params: SamplingParams) -> tuple[list, list, int]:
    """A request of priority 5 preempted after two steps by one of priority 0 in the one slot, on `device`
    -> (its tokens, the other's, the preemptions)."""
    llm = LLM(target, draft, block_size=4, backend="torch", device=device, dtype="float32")
    run = BatchRunner(llm, max_batch=1, capacity=64, block_size=4, scheduling_policy="priority")
    low = run.add(PROMPTS[2], params, priority=5)
    run.step()
    run.step()
    high = run.add(PROMPTS[0], params, priority=0)
    while run.has_work:
        run.step()
    return low.token_ids, high.token_ids, run.preemptions


@pytest.mark.parametrize("params", PARAMS, ids=["greedy", "seeded"])
def test_a_request_preempted_on_cuda_resumes_with_the_cpu_executors_tokens(tiny_pairs, params):
    """Priority scheduling releases a CUDA row mid-decode and prefills what it had again later."""
    target, draft = map(str, tiny_pairs["llama"])
    alone = [o.token_ids for o in LLM(target, draft, block_size=4, backend="torch", device="cpu").generate(
        [PROMPTS[2], PROMPTS[0]], params)]
    assert preempted(target, draft, "cuda", params) == (*alone, 1)


def test_beam_search_on_cuda_finds_the_cpu_executors_sequences(tiny_pairs):
    """LLM.beam_search's steps (plain, logprobs of 2 x width, prefixes reused from parents' slots) on CUDA."""
    from dflash_trt import BeamSearchParams

    target, draft = map(str, tiny_pairs["llama"])
    params = BeamSearchParams(beam_width=3, max_tokens=6)
    prompts = [[5, 6, 7, 8], "hello there"]
    want = LLM(target, draft, backend="torch", device="cpu").beam_search(prompts, params)
    got = LLM(target, draft, backend="torch", device="cuda", dtype="float32").beam_search(prompts, params)
    for mine, theirs in zip(got, want, strict=True):
        assert [s.tokens for s in mine.sequences] == [s.tokens for s in theirs.sequences]
        assert [s.cum_logprob for s in mine.sequences] == pytest.approx([s.cum_logprob for s in theirs.sequences],
                                                                        abs=1e-3)


@pytest.mark.parametrize("params", PARAMS, ids=["greedy", "seeded"])
def test_nan_logits_on_cuda_fail_their_request_alone_as_on_the_cpu(poisoned_pair, params):
    """The device's decisions (decide_kernel.cu) see the NaN rows the host's do: the same requests
    finish "error", with the same tokens before; the others give the CPU executor's tokens."""
    from factories import POISON

    target, draft = map(str, poisoned_pair)
    prompts = [[5, POISON, 7], [5, 6], [9, 8]]
    each = [params, dataclasses.replace(params, logit_bias={POISON: 100.0}), params]
    want = [(o.finish_reason, o.token_ids) for o in LLM(target, draft, block_size=4, backend="torch",
                                                       device="cpu").generate(prompts, each)]
    assert [reason for reason, _ in want] == ["error", "error", "length"]
    cuda = LLM(target, draft, block_size=4, backend="torch", device="cuda", dtype="float32")
    assert [(o.finish_reason, o.token_ids) for o in cuda.generate(prompts, each)] == want
    # the failed requests' places were zeroed on the device (Executor::discard): the rows that take them
    # next read no NaN past their own positions
    again = [[9, 8], [1, 2, 3, 4, 5, 6], [5, 6, 7]]
    fresh = LLM(target, draft, block_size=4, backend="torch", device="cuda", dtype="float32")
    assert [o.token_ids for o in cuda.generate(again, params)] == [o.token_ids for o in fresh.generate(again, params)]

"""NaN logits on the executor's device path (the decision kernels' launches, their verdicts' download),
over the fake CUDA driver, which runs the kernels' rules compiled for the host: the requests the host path
fails finish "error" there too, with the same tokens before, and the others give the host's tokens.
What this shows is the device path's plumbing of a position without a token (decide.h's kNoToken apart
from a kept draft's kKept), not the kernels: those are the `gpu` tests'."""

import dataclasses

import pytest
from factories import POISON
from fake_cuda_core import FakeCudaCore
from seeded_batches import counted

from dflash_trt import LLM, SamplingParams
from dflash_trt.runtime import torch_graphs

GREEDY = SamplingParams(max_tokens=10, ignore_eos=True)
SAMPLED = SamplingParams(max_tokens=10, temperature=0.8, top_p=0.9, seed=4, ignore_eos=True)


@pytest.mark.parametrize("rule", ["point-mass", "drafter"])
@pytest.mark.parametrize("params", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_nan_logits_fail_the_same_requests_on_the_device_path_as_on_the_host(core, fake_cuda, poisoned_pair,
                                                                              monkeypatch, rule, params):
    if not core.HAS_DEVICE_DECIDE:
        pytest.skip("the decision kernels are not built: the executor decides on the host")
    target, draft = map(str, poisoned_pair)
    prompts = [[5, POISON, 7], [5, 6], [9, 8], [1, 2, 3]]
    each = [params, dataclasses.replace(params, logit_bias={POISON: 100.0}), params, params]

    def run():
        llm = LLM(target, draft, block_size=4, backend="torch", draft_rule=rule)
        return [(o.finish_reason, o.token_ids, o.error) for o in llm.generate(prompts, each)]

    want = run()
    assert [reason for reason, _, _ in want] == ["error", "error", "length", "length"]
    monkeypatch.setattr(torch_graphs, "native_core", lambda: FakeCudaCore(core, fake_cuda))
    launches = ("fake_cuda_block_launches", "fake_cuda_wide_launches")
    before = sum(counted(fake_cuda, name) for name in launches)
    assert run() == want
    assert sum(counted(fake_cuda, name) for name in launches) > before, "the device decided"

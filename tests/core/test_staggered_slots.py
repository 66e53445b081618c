"""Pairs of each kind (dense, sliding-window, hybrid) through the public runner on the C++ slot
executor, over the onnxruntime bundle and over the torch graphs: requests arriving at different
steps, at concurrency 1, 3 and 8, plain and speculative mixed, each equal to its own greedy
autoregressive output from the Python reference loop."""

import pytest
from factories import tiny_slots_pair
from reference import reference_output
from scheduler_checks import workload

from dflash_trt import LLM
from dflash_trt.runtime.batch_runner import BatchRunner

@pytest.fixture(scope="module", params=["dense", "sliding-window", "hybrid"])
def pair(core, request, tmp_path_factory):
    """(slots bundle, torch LLM over the same pair)."""
    if not core.HAS_ORT_EXECUTOR:
        pytest.skip("dflash_trt._core was built without the onnxruntime executor (see csrc/README.md, Build)")
    bundle, target, draft = tiny_slots_pair(tmp_path_factory.mktemp(request.param), request.param)
    return bundle, LLM(target, draft, block_size=4, backend="torch")


@pytest.mark.parametrize("backend", ["onnxruntime", "torch"])
@pytest.mark.parametrize("concurrency", [1, 3, 8])
def test_staggered_requests_equal_their_autoregressive_output(pair, concurrency, backend):
    bundle, ref = pair
    llm = LLM.from_bundle(bundle, block_size=4, max_batch=concurrency, capacity=64) if backend == "onnxruntime" else ref
    runner = BatchRunner(llm, max_batch=concurrency, capacity=64, block_size=4)
    work = workload(llm.vocab_size, 8, seed=concurrency)
    pending, requests, step = list(enumerate(work)), {}, 0
    while pending or runner.has_work:
        while pending and pending[0][1][0] <= step:
            index, (_, prompt, params) = pending.pop(0)
            requests[index] = runner.add(prompt, params, speculative=index % 3 != 2)  # every third plain
        runner.step()
        step += 1
    for index, (_, prompt, params) in enumerate(work):
        want = reference_output(ref, prompt, params)
        assert (requests[index].token_ids, requests[index].finish_reason) == (want.token_ids, want.finish_reason)
    assert runner.slots.num_free == concurrency

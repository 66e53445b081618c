"""The drafter-distribution rule on a device that decides (a GPU: csrc/decide_kernel.cu's dflash_draw_drafts,
and the drafter's test inside dflash_target_tokens), run on a CPU through the fake CUDA driver
(fake_trt/fake_cuda.cpp: host memory, each launch running the kernel's rules compiled for the host) with
the torch backend's graphs on the CPU over that memory.

What it shows is the executor's device path: the block pass's outputs drawn from where they are, each
row's q kept in device memory until its verify and found there through DecideRow::q, the draft
vocabulary's maps uploaded once, greedy rows beside sampled ones. It gives the host executor's seeded
tokens, alone and batched, for a drafter with a draft vocabulary and for a DFlash2 selector. That the
kernels' block code equals the host rules is tests/core/test_decide_block.py's; the kernels themselves on
a GPU are the `gpu` tests' (tests/core/test_torch_graph_executor_gpu.py)."""

import pytest
from factories import make_dflash2_drafter, make_target
from fake_cuda_core import FakeCudaCore
from seeded_batches import PARAMS, PROMPTS, counted, mixed_batch

from dflash_trt import LLM
from dflash_trt.runtime import torch_graphs


def small_pairs(tmp_path, tiny_pairs):
    """(target, drafter) dirs: the llama pair (its drafter proposes 90 of 264 ids: q's columns map onto
    target ids) and an 8-token pair with a DFlash2 drafter (drafts often kept)."""
    target = make_target(tmp_path / "t", "qwen3", vocab_size=8, tokenizer=False, seed=3)
    dflash2 = make_dflash2_drafter(tmp_path / "d", seed=4, vocab_size=8, mask_token_id=7)
    return {"draft-vocabulary": tuple(map(str, tiny_pairs["llama"])), "dflash2": (str(target), str(dflash2))}


@pytest.mark.parametrize("pair", ["draft-vocabulary", "dflash2"])
def test_the_rule_decided_on_the_device_gives_the_host_executors_tokens(core, fake_cuda, tiny_pairs, tmp_path,
                                                                         monkeypatch, pair):
    target, draft = small_pairs(tmp_path, tiny_pairs)[pair]
    host = LLM(target, draft, block_size=4, backend="torch", draft_rule="drafter")
    want = mixed_batch(host)
    alone = [host.generate([p], params)[0].token_ids for p, params in zip(PROMPTS, PARAMS)]
    assert want == alone

    monkeypatch.setattr(torch_graphs, "native_core", lambda: FakeCudaCore(core, fake_cuda))
    draws, positions = counted(fake_cuda, "fake_cuda_draft_draws"), counted(fake_cuda, "fake_cuda_drafter_positions")
    wide_draws = counted(fake_cuda, "fake_cuda_wide_draws")
    device = LLM(target, draft, block_size=4, backend="torch", draft_rule="drafter")
    assert mixed_batch(device) == want
    assert mixed_batch(device, max_batch=2) == want
    # with the decision kernels built, the rule ran on the device: drafts drawn there, verify positions
    # decided by the drafter's test there; without them, on the host from what the executor downloaded
    ran_on_device = core.HAS_DEVICE_DECIDE
    assert (counted(fake_cuda, "fake_cuda_draft_draws") > draws) == ran_on_device
    assert (counted(fake_cuda, "fake_cuda_drafter_positions") > positions) == ran_on_device
    # a DFlash drafter's few draws (at most 16 (row, draft) pairs: all of these) by a cluster of blocks
    # each on an SM 9.0 GPU, as the fake plays one; a DFlash2 selector's walk by a block per row
    assert (counted(fake_cuda, "fake_cuda_wide_draws") > wide_draws) == (ran_on_device and pair == "draft-vocabulary")


def test_the_device_comparison_can_fail(core, fake_cuda, tiny_pairs, tmp_path, monkeypatch):
    """Another rule on the device gives other tokens: the equality above is not the host decoding twice."""
    target, draft = small_pairs(tmp_path, tiny_pairs)["dflash2"]
    want = mixed_batch(LLM(target, draft, block_size=4, backend="torch", draft_rule="drafter"))
    monkeypatch.setattr(torch_graphs, "native_core", lambda: FakeCudaCore(core, fake_cuda))
    assert mixed_batch(LLM(target, draft, block_size=4, backend="torch")) != want


def test_a_verify_after_another_groups_draft_is_refused_not_decided_from_its_q(core, fake_cuda, tiny_pairs, tmp_path,
                                                                              monkeypatch):
    """On the device the drafts' distributions live in one buffer the next draft rewrites (the scheduler
    drafts every row of a step at once, then verifies): verifying row 0 after row 1's own draft would
    read row 1's q, so the executor stops on its invariant instead of deciding from it."""
    if not core.HAS_DEVICE_DECIDE:
        pytest.skip("the decision kernels are not built: the rule runs on the host from downloads")
    target, draft = small_pairs(tmp_path, tiny_pairs)["dflash2"]
    monkeypatch.setattr(torch_graphs, "native_core", lambda: FakeCudaCore(core, fake_cuda))
    executor = LLM(target, draft, block_size=4, backend="torch", draft_rule="drafter").executor(2, 64)
    sampled = core.RowSampling(core.SamplingParams(temperature=0.8, seed=3), 11, 4)
    assert len(executor.prefill([0, 1], [PROMPTS[0], PROMPTS[1]], [sampled, sampled])) == 2

    def draft(rows):
        return executor.draft(rows, [1] * len(rows), 4, [sampled] * len(rows))

    drafts = draft([0, 1])  # one draft for both rows, then their verifies: the scheduler's order
    assert len(executor.verify([0, 1], [[1, *d] for d in drafts], [sampled, sampled])) == 2
    first = draft([0])[0]
    draft([1])
    with pytest.raises(AssertionError, match="device_q_draw == device_draws_"):
        executor.verify([0], [[1, *first]], [sampled])

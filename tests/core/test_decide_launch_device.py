"""Which form of the target-token kernel decides a phase on a GPU of SM 9.0 or later (csrc/cuda_device.cpp):
a cluster of blocks per (row, position) (dflash_target_tokens_wide) for at most CudaDevice::kWidePairs
pairs, so one row's verify spreads over the GPU; a block per pair (dflash_target_tokens) beyond, where the
pairs fill it, with 512 threads while the blocks fit the SMs (one block an SM) and 256 past them (two an SM).
Every form gives the host executor's seeded tokens.

Through the fake CUDA driver, which runs the host rules for either form: what this shows is the executor's
choice and each launch's geometry (the fake refuses a cluster grid that is not a whole number of clusters),
not the kernels; the cluster kernel against the host rules on a GPU is the `gpu` tests' (test_executor_decisions)."""

import pytest
from fake_cuda_core import FakeCudaCore
from seeded_batches import counted, mixed_batch

from dflash_trt import LLM
from dflash_trt.runtime import torch_graphs


@pytest.mark.parametrize("block_size", [4, 16])
def test_few_positions_take_the_cluster_kernel_and_many_the_block_kernel_with_the_same_tokens(
        core, fake_cuda, tiny_pairs, monkeypatch, block_size):
    if not core.HAS_DEVICE_DECIDE:
        pytest.skip("the decision kernels are not built: the executor decides on the host")
    target, draft = map(str, tiny_pairs["llama"])
    want = mixed_batch(LLM(target, draft, block_size=block_size, backend="torch"), block_size=block_size)

    monkeypatch.setattr(torch_graphs, "native_core", lambda: FakeCudaCore(core, fake_cuda))
    names = ("fake_cuda_block_launches", "fake_cuda_wide_launches", "fake_cuda_halved_blocks",
             "fake_cuda_misfit_blocks")
    before = [counted(fake_cuda, name) for name in names]
    device = LLM(target, draft, block_size=block_size, backend="torch")
    assert mixed_batch(device, block_size=block_size) == want
    block, wide, halved, misfit = (counted(fake_cuda, name) - b for name, b in zip(names, before, strict=True))
    # four rows verifying blocks of 4 are 16 pairs: every launch a cluster's; blocks of 16 are 64 pairs
    # while all four rows verify (a block per pair, past the fake's 32 SMs: 256 threads each), 16 once one
    # row is left, and fewer at prefill
    assert wide > 0
    assert (block > 0) == (block_size == 16)
    assert (halved > 0) == (block_size == 16) and misfit == 0

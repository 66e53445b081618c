"""Seeded requests of every kind in one batch, as the drafter rule's executor tests run them (the fake
CUDA device's and the TensorRT executor's), and the fake CUDA driver's counters of the work its kernels did."""

import ctypes

from dflash_trt import SamplingParams
from dflash_trt.runtime.batch_runner import BatchRunner

PROMPTS = [[1, 2, 3], [4, 0, 1, 2], [3], [2, 2, 4, 1, 0]]
PARAMS = [SamplingParams(max_tokens=14, temperature=0.8, seed=3, ignore_eos=True),
          SamplingParams(max_tokens=14, ignore_eos=True),  # greedy: argmax drafts, beside the sampled rows
          SamplingParams(max_tokens=14, temperature=1.2, top_k=5, top_p=0.9, seed=5, ignore_eos=True),
          SamplingParams(max_tokens=14, temperature=1.0, seed=7, ignore_eos=True)]


def counted(driver, name: str) -> int:
    counter = getattr(ctypes.CDLL(str(driver)), name)
    counter.restype = ctypes.c_long
    return counter()


def mixed_batch(llm, max_batch: int = 4, block_size: int = 4, **runner) -> list[list[int]]:
    """Each prompt with its own PARAMS, all in one batch (max_batch 4) or rows joining as others end;
    `runner`: more of BatchRunner's arguments (a static capacity)."""
    runner = BatchRunner(llm, max_batch=max_batch, block_size=block_size, **runner)
    requests = [runner.prepare(p, params) for p, params in zip(PROMPTS, PARAMS)]
    for request in requests:
        runner.submit(request)
    while runner.has_work:
        runner.step()
    return [runner.output(r).token_ids for r in requests]

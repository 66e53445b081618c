"""Offline mode: run prompts through an in-process `LLM`, DFlash and `speculative=False` alike."""

from __future__ import annotations

import time

from tqdm import tqdm

from dflash_trt.bench.summary import RequestRecord
from dflash_trt.runtime.llm import LLM
from dflash_trt.spec.sampling import SamplingParams


def record_of(output) -> RequestRecord:
    m = output.metrics
    return RequestRecord(
        text=output.text,
        output_tokens=m.output_tokens,
        latency_s=m.prefill_s + m.decode_s,
        ttft_s=m.prefill_s,
        token_ids=list(output.token_ids),
        acceptance_lengths=list(m.acceptance_lengths) if m.block_size else None,
        draft_s=m.draft_s,
        verify_s=m.verify_s,
    )


def run_offline(llm: LLM, prompts: list[str], params: SamplingParams, speculative: bool,
                block_size: int | None, desc: str) -> tuple[list[RequestRecord], float]:
    """Requests one after another (concurrency 1); returns the records and the wall time."""
    if speculative:
        llm.block_size = block_size
    records = []
    start = time.perf_counter()
    for prompt in tqdm(prompts, desc=desc, unit="prompt", leave=False):
        records.append(record_of(llm.generate(prompt, params, speculative=speculative)[0]))
    return records, time.perf_counter() - start


def warm_up(llm: LLM, prompt: str, block_sizes: tuple[int, ...]) -> None:
    """First calls pay for lazy initialisation (allocator, kernels, caches, onnxruntime's per-shape
    plans); run each shape once untimed so no setting pays it inside the timing."""
    params = SamplingParams(max_tokens=8)
    llm.generate(prompt, params, speculative=False)
    for size in block_sizes:
        llm.block_size = size
        llm.generate(prompt, params, speculative=True)

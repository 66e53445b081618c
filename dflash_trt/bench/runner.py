"""Acceptance and speed of one (LLM, dataset, block size, temperature) setting, against AR."""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass

from tqdm import tqdm

from dflash_trt.runtime.llm import LLM
from dflash_trt.spec.sampling import SamplingParams


@dataclass
class BenchResult:
    dataset: str
    block_size: int
    temperature: float
    prompts: int
    output_tokens: int
    mean_acceptance_length: float  # mean over prompts of each prompt's mean τ (the paper's figure)
    step_acceptance_length: float  # all tokens committed by verify steps / all verify steps
    spec_tokens_per_s: float
    draft_ms_per_step: float
    verify_ms_per_step: float
    ar_tokens_per_s: float | None = None
    speedup: float | None = None  # decode throughput ratio vs speculative=False, same backend, same run

    def to_dict(self) -> dict:
        return asdict(self)


def run_setting(llm: LLM, dataset: str, prompts: list[str], block_size: int, temperature: float,
                max_tokens: int, baseline: bool, seed: int = 0) -> BenchResult:
    llm.block_size = block_size
    params = SamplingParams(max_tokens=max_tokens, temperature=temperature, seed=seed)
    per_prompt, taus, tokens, decode_s, draft_s, verify_s, ar_tokens, ar_s = [], [], 0, 0.0, 0.0, 0.0, 0, 0.0
    desc = f"{dataset} B={block_size} T={temperature}"
    for prompt in tqdm(prompts, desc=desc, unit="prompt"):
        out = llm.generate(prompt, params, speculative=True)[0]
        m = out.metrics
        if m.num_drafts:
            per_prompt.append(m.mean_acceptance_length)
            taus += m.acceptance_lengths
        tokens += m.output_tokens - 1  # decode tokens: the first comes from the prefill
        decode_s += m.decode_s
        draft_s += m.draft_s
        verify_s += m.verify_s
        if baseline:
            ar = llm.generate(prompt, params, speculative=False)[0].metrics
            ar_tokens += ar.output_tokens - 1
            ar_s += ar.decode_s
    steps = max(1, len(taus))
    spec_tps = tokens / decode_s if decode_s else 0.0
    ar_tps = ar_tokens / ar_s if baseline and ar_s else None
    return BenchResult(
        dataset=dataset,
        block_size=block_size,
        temperature=temperature,
        prompts=len(prompts),
        output_tokens=tokens,
        mean_acceptance_length=statistics.fmean(per_prompt) if per_prompt else 0.0,
        step_acceptance_length=sum(taus) / steps,
        spec_tokens_per_s=spec_tps,
        draft_ms_per_step=1000 * draft_s / steps,
        verify_ms_per_step=1000 * verify_s / steps,
        ar_tokens_per_s=ar_tps,
        speedup=spec_tps / ar_tps if ar_tps else None,
    )


def table(results: list[BenchResult]) -> str:
    head = "| dataset | B | T | prompts | τ (mean/prompt) | τ (per step) | spec tok/s | AR tok/s | speedup | draft ms | verify ms |"
    rows = [head, "|" + "---|" * 11]
    for r in results:
        ar = f"{r.ar_tokens_per_s:.1f}" if r.ar_tokens_per_s else "-"
        speed = f"{r.speedup:.2f}x" if r.speedup else "-"
        rows.append(
            f"| {r.dataset} | {r.block_size} | {r.temperature} | {r.prompts} | {r.mean_acceptance_length:.2f} | "
            f"{r.step_acceptance_length:.2f} | {r.spec_tokens_per_s:.1f} | {ar} | {speed} | "
            f"{r.draft_ms_per_step:.0f} | {r.verify_ms_per_step:.0f} |"
        )
    return "\n".join(rows)

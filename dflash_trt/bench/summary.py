"""What one benchmark request measured, and how a setting's requests add up (the method, in one place).

Method (both modes, both sides — DFlash and the autoregressive baseline — measured the same way):
- throughput (tok/s) = all output tokens / wall time of the whole setting, prefill included;
- decode tok/s = output tokens after the first / time after the first token, summed over requests
  (what speculative decoding changes; prefill is the same work on both sides);
- τ, mean acceptance length = 1 + accepted / drafts per request (bonus token counted), averaged over
  requests as the DFlash paper does; `step_acceptance_length` pools all verify steps instead;
- per-step timings split each verify step into draft, verify and the rest (sampling, stop checks,
  detokenisation, Python overhead).
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field


@dataclass
class RequestRecord:
    text: str
    output_tokens: int
    latency_s: float  # request start to last token
    ttft_s: float | None  # time to first token (None: the server did not stream)
    token_ids: list[int] | None = None  # None when a server returns text only
    acceptance_lengths: list[int] | None = None  # τ per verify step (None: not reported)
    draft_s: float = 0.0
    verify_s: float = 0.0
    cached_tokens: int | None = None  # prompt tokens served from the prefix cache (None: not reported)


@dataclass
class SideSummary:
    """One side (DFlash or baseline) of one setting."""

    requests: int
    output_tokens: int
    wall_s: float
    tokens_per_s: float
    decode_tokens_per_s: float | None
    mean_latency_s: float
    mean_ttft_s: float | None
    mean_acceptance_length: float | None = None
    step_acceptance_length: float | None = None
    histogram: dict[int, int] = field(default_factory=dict)  # steps per τ = 1..B
    acceptance_rate_per_position: list[float] = field(default_factory=list)  # slot 1..B-1
    draft_ms_per_step: float | None = None
    verify_ms_per_step: float | None = None
    other_ms_per_step: float | None = None
    # offline runs through the core: per core step (one batched step over every running request)
    steps: int | None = None
    prefill_ms_per_step: float | None = None
    overhead_pct: float | None = None  # wall time outside model execution (executor calls), in %
    # bytes the executor moved between host and device memory per core step (its own accounting:
    # 0 for onnxruntime's CPU provider; None where the executor keeps none)
    host_bytes_per_step: float | None = None
    cached_tokens: int | None = None  # prompt tokens served from the prefix cache, summed (None: not reported)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> SideSummary:
        # JSON object keys are strings; the histogram is keyed by τ.
        return cls(**{**data, "histogram": {int(k): v for k, v in data.get("histogram", {}).items()}})


def summarize(records: list[RequestRecord], wall_s: float, block_size: int | None) -> SideSummary:
    tokens = sum(r.output_tokens for r in records)
    streamed = [r for r in records if r.ttft_s is not None]
    decode_tokens = sum(r.output_tokens - 1 for r in streamed)
    decode_s = sum(r.latency_s - r.ttft_s for r in streamed)
    side = SideSummary(
        requests=len(records),
        output_tokens=tokens,
        wall_s=wall_s,
        tokens_per_s=tokens / wall_s if wall_s > 0 else 0.0,
        decode_tokens_per_s=decode_tokens / decode_s if streamed and decode_s > 0 else None,
        mean_latency_s=statistics.fmean(r.latency_s for r in records) if records else 0.0,
        mean_ttft_s=statistics.fmean(r.ttft_s for r in streamed) if streamed else None,
    )
    cached = [r.cached_tokens for r in records if r.cached_tokens is not None]
    side.cached_tokens = sum(cached) if cached else None
    reported = [r for r in records if r.acceptance_lengths]
    if block_size is None or not reported:
        return side
    steps = [tau for r in reported for tau in r.acceptance_lengths]
    side.mean_acceptance_length = statistics.fmean(statistics.fmean(r.acceptance_lengths) for r in reported)
    side.step_acceptance_length = statistics.fmean(steps)
    side.histogram = {tau: steps.count(tau) for tau in range(1, block_size + 1)}
    side.acceptance_rate_per_position = [
        sum(1 for tau in steps if tau > slot) / len(steps) for slot in range(1, block_size)
    ]
    draft_s = sum(r.draft_s for r in reported)
    verify_s = sum(r.verify_s for r in reported)
    if draft_s or verify_s:  # offline runs time their steps; servers usually do not say
        busy_s = sum(r.latency_s - (r.ttft_s or 0.0) for r in reported)
        side.draft_ms_per_step = 1000 * draft_s / len(steps)
        side.verify_ms_per_step = 1000 * verify_s / len(steps)
        side.other_ms_per_step = 1000 * max(0.0, busy_s - draft_s - verify_s) / len(steps)
    return side


def add_step_times(side: SideSummary, times: dict) -> SideSummary:
    """Per core step: the executor's prefill / draft / verify time, the rest of the step ("other":
    commit, scheduling, acceptance, sampling), and the share of the wall time spent outside the
    executor's calls (the runtime's own overhead: core and Python runner together)."""
    steps = times["steps"]
    if not steps:
        return side
    side.steps = steps
    side.prefill_ms_per_step = 1000 * times["prefill"] / steps
    side.draft_ms_per_step = 1000 * times["draft"] / steps
    side.verify_ms_per_step = 1000 * times["verify"] / steps
    side.other_ms_per_step = 1000 * (times["step"] - times["prefill"] - times["draft"] - times["verify"]) / steps
    executor = times["prefill"] + times["draft"] + times["verify"] + times["commit"]
    side.overhead_pct = 100 * max(0.0, times["wall"] - executor) / times["wall"] if times["wall"] > 0 else None
    if times.get("host_bytes") is not None:
        side.host_bytes_per_step = times["host_bytes"] / steps
    return side


def find_mismatches(dflash: list[RequestRecord], baseline: list[RequestRecord]) -> list[dict]:
    """Greedy outputs must be identical: report each request whose output differs, and where."""
    found = []
    for index, (ours, ref) in enumerate(zip(dflash, baseline, strict=True)):
        if ours.token_ids is not None and ref.token_ids is not None:
            a, b, unit = ours.token_ids, ref.token_ids, "token"
        else:
            a, b, unit = ours.text, ref.text, "character"
        if a != b:
            first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            found.append({"request": index, f"first_different_{unit}": first,
                          "dflash": ours.text[:200], "baseline": ref.text[:200]})
    return found

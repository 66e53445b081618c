"""Per-request speculative-decoding metrics, named as vLLM names them.

A "draft" is one verify step; its acceptance length τ counts the bonus token, so τ = accepted + 1
lies in [1, block_size] and mean_acceptance_length = 1 + accepted_tokens / drafts.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class RequestMetrics:
    """One request's counters and timing: what `LLM.generate` returns, what an Engine delivers with each
    output, and what the server exports."""

    block_size: int | None  # the largest verify block; None: autoregressive decoding
    acceptance_lengths: list[int] = field(default_factory=list)  # τ per verify step
    num_draft_tokens: int = 0  # drafts proposed (an adaptive step may verify a smaller block)
    prompt_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens its KV slot held already (prefix caching): not prefilled
    num_preemptions: int = 0  # times it gave its KV slot to a request of a higher priority (recomputed)
    output_tokens: int = 0
    queue_s: float | None = None  # arrival to the start of its first step (waiting for a slot)
    prefill_s: float = 0.0  # arrival to the first token (time to first token)
    decode_s: float = 0.0  # everything after the first token
    time_per_output_token_s: float | None = None  # decode_s per token after the first
    # seconds between the steps that gave it tokens, after the first (vLLM's inter-token latencies)
    token_gaps: list[float] = field(default_factory=list)
    e2e_latency_s: float = 0.0  # arrival to the last token (to now while running)

    def record(self, accepted: int, drafted: int | None = None) -> None:
        """One verify step that accepted `accepted` of `drafted` drafts (default: a whole block's)."""
        drafted = (self.block_size or 1) - 1 if drafted is None else drafted
        assert self.block_size is not None and 0 <= accepted <= drafted < self.block_size
        self.acceptance_lengths.append(accepted + 1)
        self.num_draft_tokens += drafted

    @property
    def num_drafts(self) -> int:
        return len(self.acceptance_lengths)

    @property
    def num_accepted_tokens(self) -> int:
        return sum(self.acceptance_lengths) - self.num_drafts

    @property
    def mean_acceptance_length(self) -> float | None:
        if not self.num_drafts:
            return None
        return 1 + self.num_accepted_tokens / self.num_drafts

    @property
    def accepted_per_position(self) -> list[int]:
        """How many steps accepted the draft at block slot 1, 2, ..., B-1."""
        slots = (self.block_size or 1) - 1
        return [sum(1 for tau in self.acceptance_lengths if tau > k + 1) for k in range(slots)]

    @property
    def acceptance_rate_per_position(self) -> list[float]:
        return [count / self.num_drafts for count in self.accepted_per_position] if self.num_drafts else []

    @property
    def histogram(self) -> dict[int, int]:
        """Steps per acceptance length τ = 1..B."""
        size = self.block_size or 1
        return {tau: self.acceptance_lengths.count(tau) for tau in range(1, size + 1)}

    @property
    def decode_tokens_per_s(self) -> float | None:
        # The first token comes from the prefill; decode throughput counts the rest.
        rest = self.output_tokens - 1
        return rest / self.decode_s if rest > 0 and self.decode_s > 0 else None

    def to_dict(self) -> dict:
        first = self.prefill_s if self.output_tokens else None
        queued = self.queue_s
        return {
            "block_size": self.block_size,
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens,
            "num_preemptions": self.num_preemptions,
            "output_tokens": self.output_tokens,
            "num_drafts": self.num_drafts,
            "num_draft_tokens": self.num_draft_tokens,
            "num_accepted_tokens": self.num_accepted_tokens,
            "mean_acceptance_length": self.mean_acceptance_length,
            "acceptance_lengths": self.acceptance_lengths,
            "accepted_per_position": self.accepted_per_position,
            "histogram": self.histogram,
            "prefill_s": self.prefill_s,
            "decode_s": self.decode_s,
            "decode_tokens_per_s": self.decode_tokens_per_s,
            # vLLM's names for the same clocks, and its phases: queued, then prefill to the first token,
            # then decode; inference is prefill and decode
            "time_to_first_token_s": first,
            "time_per_output_token_s": self.time_per_output_token_s,
            "e2e_latency_s": self.e2e_latency_s,
            "queue_time_s": self.queue_s,
            "prefill_time_s": None if first is None or queued is None else max(0.0, first - queued),
            "decode_time_s": self.decode_s if first is not None else None,
            "inference_time_s": None if queued is None else max(0.0, self.e2e_latency_s - queued),
        }


def summary_line(metrics: RequestMetrics) -> str:
    """One human line: tokens, speed, and acceptance when speculative."""
    speed = metrics.decode_tokens_per_s
    text = f"{metrics.output_tokens} tokens"
    if speed:
        text += f", {speed:.1f} tok/s decode"
    if metrics.block_size:  # speculative; adaptive blocks may have verified plain steps only (no drafts: "-")
        tau = metrics.mean_acceptance_length
        text += (f", mean acceptance length {'-' if tau is None else f'{tau:.2f}'} "
                 f"over {metrics.num_drafts} steps (B={metrics.block_size})")
    return text

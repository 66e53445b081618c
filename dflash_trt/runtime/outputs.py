"""RequestOutput: what every entry point returns for a request, streamed or whole."""

from __future__ import annotations

from dataclasses import dataclass, field

from dflash_trt.spec.metrics import RequestMetrics

Prompt = str | list[int]


@dataclass
class RequestOutput:
    prompt: Prompt
    prompt_token_ids: list[int]
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    # None while streaming; then "stop", "length", "abort", or "error" (vLLM's: the target gave no token,
    # its logits NaN, or the engine step failed; `error` says which)
    finish_reason: str | None = None
    stop_reason: str | int | None = None  # vLLM's: the stop string or stop token id that ended it (None: EOS)
    metrics: RequestMetrics | None = None
    # SamplingParams.logprobs n: per output token {token id: log-probability}, the token's own first,
    # then the n most probable (by logit, ties by id); None when not asked
    logprobs: list[dict[int, float]] | None = None
    # SamplingParams.prompt_logprobs n: per prompt token {token id: log-probability} as `logprobs`, None
    # for the first (nothing before it); None when not asked. Present once the prompt is prefilled.
    prompt_logprobs: list[dict[int, float] | None] | None = None
    error: str | None = None  # finish "error": why, in one line

"""RequestOutput: what every entry point returns for a request, streamed or whole."""

from __future__ import annotations

from dataclasses import dataclass, field

from dflash_trt.spec.metrics import RequestMetrics

Prompt = str | list[int]


@dataclass(frozen=True)
class CompletionOutput:
    """vLLM's view of a request's one completion (`RequestOutput.outputs[0]`), for code written against
    vLLM. Its `logprobs` are this API's: per token {token id: log-probability} floats, not vLLM's Logprob
    objects."""

    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None
    logprobs: list[dict[int, float]] | None
    finish_reason: str | None
    stop_reason: str | int | None


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
    # SamplingParams.n > 1 (LLM.generate): every sample of the prompt, this output's own first
    samples: list[CompletionOutput] | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def outputs(self) -> list[CompletionOutput]:
        """vLLM's shape: the completions (one, `out.outputs[0].text` being `out.text`, unless n > 1); a
        cumulative logprob is the sum of its tokens' own, when logprobs were asked."""
        return self.samples if self.samples is not None else [self.completion(0)]

    def completion(self, index: int) -> CompletionOutput:
        """This output as sample `index` of its prompt."""
        cumulative = None if self.logprobs is None else sum(
            entries[token] for token, entries in zip(self.token_ids, self.logprobs))
        return CompletionOutput(index, self.text, list(self.token_ids), cumulative, self.logprobs,
                                self.finish_reason, self.stop_reason)

"""Beam search as vLLM runs it (`LLM.beam_search`, the OpenAI API's `use_beam_search`), over the core.

Each step asks one token of every live beam, with the 2 x beam_width most probable tokens' log-
probabilities (the target's raw logits, as generate reports them); each candidate extends its beam by
one token, and each prompt keeps its beam_width best extensions by vLLM's score: the cumulative
log-probability over the sequence's length (prompt included, an ending EOS not) to the power
`length_penalty`. A candidate that is an EOS token ends its sequence (unless `ignore_eos`); after
`max_tokens` steps the live beams end too, and the beam_width best of all ended sequences are the
result, best first. Steps run through `LLM.generate` (or any function of its shape), so a beam's
prefix is prefilled once: a step's prompt starts with what its parent's KV slot holds (prefix caching).
Drafts have nothing to do here: every step generates one token.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from dflash_trt.errors import DFlashError
from dflash_trt.spec.sampling import RANGES, SamplingParams, integer, number

MAX_BEAM_WIDTH = RANGES["logprobs"]["maximum"] // 2  # a step asks for 2 x beam_width candidates


@dataclass(frozen=True)
class BeamSearchParams:
    beam_width: int
    max_tokens: int
    ignore_eos: bool = False
    temperature: float = 0.0  # > 0: each beam's sampled token joins its candidates (unseeded, as vLLM's)
    length_penalty: float = 1.0

    def __post_init__(self):
        if not (integer(self.beam_width) and 1 <= self.beam_width <= MAX_BEAM_WIDTH):
            raise DFlashError(f"BeamSearchParams.beam_width must be an integer in [1, {MAX_BEAM_WIDTH}] (each step "
                              f"reads 2 x beam_width log-probabilities, at most {2 * MAX_BEAM_WIDTH}), "
                              f"got {self.beam_width!r}")
        if not (integer(self.max_tokens) and self.max_tokens >= 1):
            raise DFlashError(f"BeamSearchParams.max_tokens must be an integer >= 1, got {self.max_tokens!r}")
        if not (number(self.temperature) and 0 <= self.temperature <= 2):
            raise DFlashError(f"BeamSearchParams.temperature must be in [0, 2], got {self.temperature!r}")
        if not number(self.length_penalty):
            raise DFlashError(f"BeamSearchParams.length_penalty must be a number, got {self.length_penalty!r}")


# what a beam search takes of a request's SamplingParams; any other field must keep its default
BEAM_FIELDS = ("max_tokens", "temperature", "ignore_eos", "logprobs", "skip_special_tokens")


def from_sampling(params: SamplingParams, beam_width: int, length_penalty: float = 1.0) -> BeamSearchParams:
    """A request's SamplingParams as a beam search's (vLLM's use_beam_search, with n its width) -> the
    search's; a field the search would not honour is refused, named (`DFlashError`: "<field>: ...")."""
    for spec in dataclasses.fields(SamplingParams):
        if spec.name in BEAM_FIELDS:
            continue
        default = spec.default if spec.default is not dataclasses.MISSING else spec.default_factory()
        if getattr(params, spec.name) != default:
            raise DFlashError(f"{spec.name}: beam search does not apply it (it takes max_tokens, temperature, "
                              f"ignore_eos, logprobs and length_penalty): leave it out")
    return BeamSearchParams(beam_width, params.max_tokens, params.ignore_eos, params.temperature, length_penalty)


@dataclass
class BeamSearchSequence:
    tokens: list[int]  # the prompt's and the generated ones (vLLM's form)
    cum_logprob: float = 0.0
    # per generated token, the candidates' log-probabilities at its position ({token: logprob})
    logprobs: list[dict[int, float]] = field(default_factory=list)
    finish_reason: str | None = None  # "stop" (an EOS token ended it) or "length"
    text: str | None = None  # the generated tokens' text, an ending EOS left out


@dataclass
class BeamSearchOutput:
    sequences: list[BeamSearchSequence]  # the beam_width best, best first


def beam_score(sequence: BeamSearchSequence, eos_token_ids, length_penalty: float) -> float:
    length = len(sequence.tokens) - (sequence.tokens[-1] in eos_token_ids)
    return sequence.cum_logprob / (length ** length_penalty)


def beam_search(generate: Callable, prompts: Sequence[list[int]], params: BeamSearchParams, eos_token_ids,
                decode: Callable[[list[int]], str] | None = None) -> list[BeamSearchOutput]:
    """`generate(token prompts, SamplingParams) -> outputs with .logprobs` runs each step (LLM.generate
    with speculative=False); `decode` writes each result's text."""
    eos = frozenset(eos_token_ids)
    step = SamplingParams(max_tokens=1, logprobs=2 * params.beam_width, temperature=params.temperature,
                          ignore_eos=True)  # the candidates' EOS is judged here

    def score(sequence: BeamSearchSequence) -> float:
        return beam_score(sequence, eos, params.length_penalty)

    beams = [[BeamSearchSequence(list(prompt))] for prompt in prompts]
    ended: list[list[BeamSearchSequence]] = [[] for _ in prompts]
    for _ in range(params.max_tokens):
        live = [(i, beam) for i, group in enumerate(beams) for beam in group]
        if not live:
            break
        outputs = generate([beam.tokens for _, beam in live], step)
        grown: list[list[BeamSearchSequence]] = [[] for _ in prompts]
        for (i, beam), output in zip(live, outputs, strict=True):
            if output.finish_reason == "error":  # the target gave this beam no token (NaN logits)
                raise DFlashError(f"beam search: {output.error}")
            candidates = output.logprobs[0]
            for token, logprob in candidates.items():
                child = BeamSearchSequence(beam.tokens + [token], beam.cum_logprob + logprob,
                                           beam.logprobs + [candidates])
                if token in eos and not params.ignore_eos:
                    child.finish_reason = "stop"
                    ended[i].append(child)
                else:
                    grown[i].append(child)
        beams = [sorted(group, key=score, reverse=True)[:params.beam_width] for group in grown]
    results = []
    for prompt, group, done in zip(prompts, beams, ended, strict=True):
        for beam in group:
            beam.finish_reason = "length"
        best = sorted(done + group, key=score, reverse=True)[:params.beam_width]
        for sequence in best:
            generated = sequence.tokens[len(prompt):]
            if sequence.finish_reason == "stop":
                generated = generated[:-1]
            sequence.text = decode(generated) if decode is not None else None
        results.append(BeamSearchOutput(best))
    return results

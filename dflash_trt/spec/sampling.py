"""SamplingParams and the target distribution they define (min_tokens, logit_bias, penalties, temperature,
top-k, top-p, seed)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from dflash_trt.errors import DFlashError
from dflash_trt.spec.structured import StructuredOutput


# Each numeric field's range as JSON Schema keywords: what SamplingParams enforces, and what the OpenAI
# front publishes in its schema (serve/protocol.py); one definition for both.
# The integer bounds fit the core's int64 fields and are exact in a JSON double.
RANGES = {"max_tokens": {"minimum": 1, "maximum": 2**31 - 1}, "temperature": {"minimum": 0},
          "top_p": {"exclusiveMinimum": 0, "maximum": 1}, "top_k": {"minimum": 0, "maximum": 2**31 - 1},
          "logprobs": {"minimum": 0, "maximum": 20}, "prompt_logprobs": {"minimum": 0, "maximum": 20},
          # vLLM's ranges
          # a positive logit is divided by it in float32: below 1e-6 the quotient overflows to inf (and the
          # draw to NaN), a penalty no reply means anyway
          "repetition_penalty": {"minimum": 1e-6, "maximum": 2},
          "frequency_penalty": {"minimum": -2, "maximum": 2}, "presence_penalty": {"minimum": -2, "maximum": 2},
          "logit_bias": {"minimum": -100, "maximum": 100}, "min_tokens": {"minimum": 0, "maximum": 2**31 - 1},
          "min_p": {"minimum": 0, "maximum": 1}, "truncate_prompt_tokens": {"minimum": 1, "maximum": 2**31 - 1},
          "thinking_token_budget": {"minimum": 0, "maximum": 2**31 - 1}, "n": {"minimum": 1, "maximum": 2**31 - 1},
          "num_speculative_tokens": {"minimum": 0, "maximum": 2**31 - 1}}
SEED_RANGE = {"minimum": 0, "maximum": 2**64 - 1}  # the core keys its RNG with 64 bits


def integer(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def in_range(value, field: str) -> bool:
    rule = RANGES[field]
    return (value >= rule.get("minimum", value) and value <= rule.get("maximum", value)
            and ("exclusiveMinimum" not in rule or value > rule["exclusiveMinimum"]))


@dataclass(frozen=True)
class SamplingParams:
    """What to sample and when to stop. temperature == 0 means greedy (argmax)."""

    max_tokens: int = 256
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0  # 0: no top-k cut
    seed: int | None = None
    stop: tuple[str, ...] = ()  # stop strings: excluded from the text
    include_stop_str_in_output: bool = False  # vLLM's: the text ends with the stop string that ended it
    skip_special_tokens: bool = True  # vLLM's: the text leaves special tokens (EOS, chat markers) out
    stop_token_ids: tuple[int, ...] = ()  # extra stop tokens besides EOS
    ignore_eos: bool = False
    # None: no log-probabilities; n: each output token's and the n most probable tokens' log-probability
    # under the target's raw logits (log_softmax before temperature and the cuts, as vLLM reports)
    logprobs: int | None = None
    # None: none; n: each prompt token's after the first, and the n most probable tokens' there, under the
    # target's raw logits at the position before it (vLLM's prompt_logprobs). Its prompt is prefilled at
    # most 256 tokens a step, never taken from the prefix cache.
    prompt_logprobs: int | None = None
    # What the raw logits get before everything above (greedy too), in vLLM's order: while the output is
    # shorter than min_tokens its stop tokens (EOS unless ignore_eos, stop_token_ids) are banned, and stop
    # strings are not looked for; logit_bias ({token id: bias in [-100, 100]}) is added; a token seen in the
    # prompt or the output so far has its logit divided by repetition_penalty where positive, multiplied
    # where not; then frequency_penalty x its count in the output is subtracted, and presence_penalty once
    # if it occurs there. Then, when sampling (T > 0), min_p keeps the tokens whose probability is at least
    # min_p x the largest (in logits: >= max + T ln(min_p)). With any of them, logprobs are those of the
    # adjusted logits.
    min_tokens: int = 0
    logit_bias: tuple[tuple[int, float], ...] = ()  # a dict is accepted (keys may be digit strings, as OpenAI's)
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    min_p: float = 0.0
    # a grammar the output follows (spec/structured.py; a dict of its fields is accepted): the tokens it
    # refuses get -inf at each position, after the adjustments above and before min_p and the rest
    structured_output: StructuredOutput | None = None
    # vLLM's, applied as a grammar's masks are (runtime/token_rules.py): the only token ids that may come
    # (EOS and stop ids too only if listed), and words the output may not hold (each word's tokens alone
    # and after a space: the last token is refused where the output ends with the others)
    allowed_token_ids: tuple[int, ...] | None = None
    bad_words: tuple[str, ...] = ()
    truncate_prompt_tokens: int | None = None  # vLLM's: the prompt's last n tokens only (None: all of it)
    # vLLM's: at most this many tokens inside a think block (from "<think>", in the prompt or the output, to
    # "</think>"); then "</think>" is forced, token by token, as a grammar's masks force (runtime/token_rules.py)
    thinking_token_budget: int | None = None
    # at most this many drafts a step verifies for this request (0: plain decoding; None: as many as the
    # engine's block allows): speculation per request, where vLLM sets it for the whole engine
    num_speculative_tokens: int | None = None
    # vLLM's: samples of the prompt, LLM.generate's (one request each; sample i seeded seed + i when seeded).
    # A request to the engine is one sequence (n 1); the OpenAI front's n are choices, each a request.
    n: int = 1

    def __post_init__(self):
        # The one check of sampling values: the Python API, the CLI, the Triton model and the OpenAI
        # front (serve/protocol.py) all refuse through here, with the field named first.
        def bad(field: str, rule: str, value) -> DFlashError:
            return DFlashError(f"SamplingParams.{field} must be {rule}, got {value!r}")

        # Accept a single string or lists from callers; store tuples so the params stay hashable.
        stop = (self.stop,) if isinstance(self.stop, str) else (self.stop or ())
        if not isinstance(stop, (list, tuple)) or not all(isinstance(s, str) and s for s in stop):
            raise bad("stop", "a non-empty string or a list of them", self.stop)
        object.__setattr__(self, "stop", tuple(stop))
        stop_ids = self.stop_token_ids or ()
        if not isinstance(stop_ids, (list, tuple)) or not all(map(integer, stop_ids)):
            raise bad("stop_token_ids", "a list of integers", self.stop_token_ids)
        object.__setattr__(self, "stop_token_ids", tuple(stop_ids))
        if not integer(self.max_tokens) or not in_range(self.max_tokens, "max_tokens"):
            raise bad("max_tokens", "an integer in [1, 2**31)", self.max_tokens)
        if not number(self.temperature) or not in_range(self.temperature, "temperature"):
            raise bad("temperature", ">= 0", self.temperature)
        if not number(self.top_p) or not in_range(self.top_p, "top_p"):
            raise bad("top_p", "in (0, 1]", self.top_p)
        if not integer(self.top_k) or not in_range(self.top_k, "top_k"):
            raise bad("top_k", "an integer in [0, 2**31)", self.top_k)
        if self.seed is not None and not (integer(self.seed) and 0 <= self.seed <= SEED_RANGE["maximum"]):
            raise bad("seed", "an integer in [0, 2**64) or None", self.seed)
        for field in ("ignore_eos", "include_stop_str_in_output", "skip_special_tokens"):
            if not isinstance(getattr(self, field), bool):
                raise bad(field, "a bool", getattr(self, field))
        if self.logprobs is not None and not (integer(self.logprobs) and in_range(self.logprobs, "logprobs")):
            raise bad("logprobs", "an integer in [0, 20] or None", self.logprobs)
        if self.prompt_logprobs is not None and not (integer(self.prompt_logprobs)
                                                     and in_range(self.prompt_logprobs, "prompt_logprobs")):
            raise bad("prompt_logprobs", "an integer in [0, 20] or None", self.prompt_logprobs)
        # past max_tokens it holds the stop tokens back for the whole reply
        if not integer(self.min_tokens) or not in_range(self.min_tokens, "min_tokens"):
            raise bad("min_tokens", "an integer in [0, 2**31)", self.min_tokens)
        bias = self.logit_bias or ()
        pairs = list(bias.items()) if isinstance(bias, dict) else bias
        try:
            pairs = sorted((int(token) if isinstance(token, str) and token.isdigit() else token, value)
                           for token, value in pairs)
        except (TypeError, ValueError):
            raise bad("logit_bias", "{token id: bias}", self.logit_bias) from None
        if len({t for t, _ in pairs}) < len(pairs) or not all(
                integer(t) and t >= 0 and number(v) and in_range(v, "logit_bias") for t, v in pairs):
            raise bad("logit_bias", "{token id: bias in [-100, 100]}", self.logit_bias)
        object.__setattr__(self, "logit_bias", tuple((t, float(v)) for t, v in pairs))
        if not number(self.repetition_penalty) or not in_range(self.repetition_penalty, "repetition_penalty"):
            raise bad("repetition_penalty", "in [1e-6, 2]", self.repetition_penalty)
        if not number(self.min_p) or not in_range(self.min_p, "min_p"):
            raise bad("min_p", "in [0, 1]", self.min_p)
        for field in ("frequency_penalty", "presence_penalty"):
            if not number(getattr(self, field)) or not in_range(getattr(self, field), field):
                raise bad(field, "in [-2, 2]", getattr(self, field))
        allowed = self.allowed_token_ids
        if allowed is not None:
            if not isinstance(allowed, (list, tuple)) or not allowed or not all(
                    integer(t) and t >= 0 for t in allowed):
                raise bad("allowed_token_ids", "a non-empty list of token ids", allowed)
            object.__setattr__(self, "allowed_token_ids", tuple(sorted(set(allowed))))
        cut = self.truncate_prompt_tokens
        if cut is not None and not (integer(cut) and in_range(cut, "truncate_prompt_tokens")):
            raise bad("truncate_prompt_tokens", "an integer in [1, 2**31) or None", cut)
        budget = self.thinking_token_budget
        if budget is not None and not (integer(budget) and in_range(budget, "thinking_token_budget")):
            raise bad("thinking_token_budget", "an integer in [0, 2**31) or None", budget)
        drafts = self.num_speculative_tokens
        if drafts is not None and not (integer(drafts) and in_range(drafts, "num_speculative_tokens")):
            raise bad("num_speculative_tokens", "an integer in [0, 2**31) or None", drafts)
        if not integer(self.n) or not in_range(self.n, "n"):
            raise bad("n", "an integer in [1, 2**31)", self.n)
        words = self.bad_words or ()
        if not isinstance(words, (list, tuple)) or not all(isinstance(w, str) and w.strip() for w in words):
            raise bad("bad_words", "a list of non-blank strings", self.bad_words)
        object.__setattr__(self, "bad_words", tuple(words))
        object.__setattr__(self, "structured_output", StructuredOutput.of(self.structured_output))
        if self.structured_output is not None and (self.ignore_eos or self.min_tokens):
            # once the grammar is complete only a stop token may come, and these would ban it
            raise DFlashError("SamplingParams.structured_output cannot be combined with ignore_eos or min_tokens")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def adjusts_logits(self) -> bool:
        """Whether min_tokens, logit_bias or a penalty changes the raw logits."""
        return (self.min_tokens > 0 or bool(self.logit_bias) or self.repetition_penalty != 1
                or self.frequency_penalty != 0 or self.presence_penalty != 0 or (self.min_p > 0 and not self.greedy))


def penalize(logits: torch.Tensor, prompt_ids: list[int], output_ids: list[int], params: SamplingParams,
             stop_ids: tuple[int, ...] = ()) -> torch.Tensor:
    """logits [V] -> float32 logits as the params adjust them at a position after `output_ids` (vLLM's
    order: `stop_ids` banned while the output is shorter than min_tokens, logit_bias added, repetition
    over the prompt and output, then frequency and presence over the output). float32 throughout, each
    sum, product and difference rounded alone, as the core computes them."""
    logits = logits.float().clone()
    if not params.adjusts_logits:
        return logits
    vocab = logits.shape[-1]
    for token, bias in params.logit_bias:
        logits[token] = logits[token] + torch.tensor(bias, dtype=torch.float32)
    counts = torch.bincount(torch.tensor(output_ids, dtype=torch.long), minlength=vocab)[:vocab]
    if params.repetition_penalty != 1:
        seen = counts > 0
        seen[torch.tensor(prompt_ids, dtype=torch.long)] = True
        r = torch.tensor(params.repetition_penalty, dtype=torch.float32)
        logits[seen] = torch.where(logits[seen] > 0, logits[seen] / r, logits[seen] * r)
    out = counts > 0
    frequency = torch.tensor(params.frequency_penalty, dtype=torch.float32)
    presence = torch.tensor(params.presence_penalty, dtype=torch.float32)
    logits[out] = (logits[out] - frequency * counts[out].float()) - presence
    if len(output_ids) < params.min_tokens:
        logits[[t for t in stop_ids if 0 <= t < vocab]] = float("-inf")
    if params.min_p > 0 and not params.greedy:
        margin = torch.tensor(params.temperature * math.log(params.min_p), dtype=torch.float32)
        logits[logits < logits.max() + margin] = float("-inf")
    return logits


def target_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Softmax(logits / T) restricted to the top-k, then to the top-p nucleus, renormalised.

    logits [..., V] -> probs [..., V] float32. Ties at the top-k boundary keep torch.topk's pick.
    """
    scores = logits.float() / params.temperature
    vocab = scores.shape[-1]
    if 0 < params.top_k < vocab:
        kth = torch.topk(scores, params.top_k, dim=-1).values[..., -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    if params.top_p < 1:
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        # Keep a token while the mass strictly before it is below top_p (the first always stays).
        keep_sorted = sorted_probs.cumsum(dim=-1) - sorted_probs < params.top_p
        keep = torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)
        probs = probs * keep
        probs = probs / probs.sum(dim=-1, keepdim=True)
    return probs


class Sampler:
    """Per-request sampling state: the params, a seeded generator and, for penalties, the prompt."""

    def __init__(self, params: SamplingParams, prompt_ids: list[int] | None = None, stop_ids: tuple[int, ...] = ()):
        self.params = params
        self.prompt_ids = list(prompt_ids or [])
        self.stop_ids = tuple(stop_ids)  # what min_tokens bans
        self.generator = torch.Generator()
        if params.seed is None:
            self.generator.seed()
        else:
            self.generator.manual_seed(params.seed)

    def sample(self, logits: torch.Tensor, output_ids: list[int] | None = None) -> int:
        """One token from logits [V] at the position after `output_ids` (what penalties count)."""
        if self.params.adjusts_logits:
            logits = penalize(logits, self.prompt_ids, output_ids or [], self.params, self.stop_ids)
        if self.params.greedy:
            return int(logits.argmax())
        return self.draw(target_probs(logits, self.params))

    def draw(self, probs: torch.Tensor) -> int:
        return int(torch.multinomial(probs.float().cpu(), 1, generator=self.generator))

    def uniform(self) -> float:
        return float(torch.rand((), generator=self.generator))

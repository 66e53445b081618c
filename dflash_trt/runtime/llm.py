"""LLM: the Python entry point. Load a (target, drafter) pair once, then generate."""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from dflash_trt.errors import DFlashError
from dflash_trt.models import embedded
from dflash_trt.models.chat import encode_prompt
from dflash_trt.models.checkpoints import load_drafter, load_target, load_tokenizer
from dflash_trt.models.pairing import validate_pair
from dflash_trt.runtime.torch_backend import TorchDraftSession, TorchTargetSession
from dflash_trt.spec.loop import autoregressive_decode, speculative_decode
from dflash_trt.spec.metrics import RequestMetrics
from dflash_trt.spec.sampling import Sampler, SamplingParams
from dflash_trt.spec.stopping import StopChecker

BACKENDS = ("torch", "onnxruntime", "tensorrt")
AUTO = "auto"  # draft=AUTO: the drafter shipped for the target alias, if there is one

Prompt = str | list[int]


@dataclass
class RequestOutput:
    prompt: Prompt
    prompt_token_ids: list[int]
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None  # None while streaming; then "stop" or "length"
    metrics: RequestMetrics | None = None


class LLM:
    def __init__(
        self,
        target: str = embedded.DEFAULT_TARGET,
        draft: str | None = AUTO,
        backend: str = "torch",
        block_size: int | None = None,
    ):
        if backend not in BACKENDS:
            raise DFlashError(f"backend '{backend}' is unknown; choose one of {', '.join(BACKENDS)}")
        if backend != "torch":
            raise DFlashError(f"backend '{backend}' is not available yet in this build; use backend='torch'")
        if block_size is not None and (not isinstance(block_size, int) or block_size < 2):
            raise DFlashError(f"block_size must be an integer >= 2, got {block_size!r}")
        if draft == AUTO:
            found = embedded.default_drafter(target)
            draft = None if found is None else str(found)
        self.target, self.tokenizer = load_target(target)
        self.drafter = None
        if draft is not None:
            self.drafter = load_drafter(draft)
            validate_pair(self.target, self.drafter.config, self.tokenizer, load_tokenizer(draft))
        self.block_size = block_size or (self.drafter.config.block_size if self.drafter else None)
        self.eos_token_ids = self._eos_token_ids()

    def _eos_token_ids(self) -> tuple[int, ...]:
        ids = self.target.model.generation_config.eos_token_id
        ids = [] if ids is None else [ids] if isinstance(ids, int) else list(ids)
        if self.tokenizer is not None and self.tokenizer.eos_token_id is not None:
            ids.append(self.tokenizer.eos_token_id)
        return tuple(sorted(set(ids)))

    # -- prompts -------------------------------------------------------------------------------

    def encode(self, prompt: Prompt) -> list[int]:
        """Strings get the chat template when the target has one; token-id lists pass through."""
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise DFlashError("this target has no tokenizer; pass prompts as lists of token ids")
            ids = encode_prompt(self.tokenizer, prompt)
        else:
            ids = list(prompt)
            bad = [t for t in ids if not (isinstance(t, int) and 0 <= t < self.target.vocab_size)]
            if bad:
                raise DFlashError(f"prompt token id {bad[0]!r} is outside the vocabulary (size {self.target.vocab_size})")
        if not ids:
            raise DFlashError("prompt is empty")
        return ids

    def decode(self, token_ids: list[int]) -> str:
        return "" if self.tokenizer is None else self.tokenizer.decode(token_ids, skip_special_tokens=True)

    # -- generation ----------------------------------------------------------------------------

    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        params: SamplingParams | None = None,
        speculative: bool = True,
    ) -> list[RequestOutput]:
        """Generate for each prompt (one after another for now); returns one output per prompt."""
        single = isinstance(prompts, str) or (
            isinstance(prompts, list) and prompts and all(isinstance(t, int) for t in prompts)
        )
        batch = [prompts] if single else list(prompts)
        if not batch:
            raise DFlashError("no prompts given")
        params = params or SamplingParams()
        self._check_request(params, speculative)
        encoded = [self.encode(p) for p in batch]  # every prompt is checked before any work
        outputs = []
        for prompt, ids in zip(batch, encoded, strict=True):
            *_, last = self._run(prompt, ids, params, speculative)
            outputs.append(last)
        return outputs

    def stream(self, prompt: Prompt, params: SamplingParams | None = None, speculative: bool = True) -> Iterator[RequestOutput]:
        """Yield the output (one object, updated) after every step; the last has finish_reason set."""
        params = params or SamplingParams()
        self._check_request(params, speculative)
        return self._run(prompt, self.encode(prompt), params, speculative)

    def _check_request(self, params: SamplingParams, speculative: bool) -> None:
        if speculative and self.drafter is None:
            raise DFlashError("speculative=True needs a drafter: pass draft=... or use speculative=False")
        if params.stop and self.tokenizer is None:
            raise DFlashError("stop strings need a tokenizer; this target has none (use stop_token_ids)")

    def _run(self, prompt: Prompt, ids: list[int], params: SamplingParams, speculative: bool) -> Iterator[RequestOutput]:
        sampler = Sampler(params)
        metrics = RequestMetrics(block_size=self.block_size if speculative else None, prompt_tokens=len(ids))
        if speculative:
            taps = self.drafter.config.target_layer_ids
            target = TorchTargetSession(self.target, taps)
            drafter = TorchDraftSession(self.drafter, self.target)
            steps = speculative_decode(target, drafter, ids, self.block_size, sampler)
        else:
            steps = autoregressive_decode(TorchTargetSession(self.target, ()), ids, sampler)
        stop = StopChecker(params, self.eos_token_ids, self.decode)
        output = RequestOutput(prompt=prompt, prompt_token_ids=ids, metrics=metrics)
        start = time.perf_counter()
        for index, step in enumerate(steps):
            if index == 0:
                metrics.prefill_s = time.perf_counter() - start
            if step.accepted is not None:
                metrics.record(step.accepted)
            metrics.draft_s += step.draft_s
            metrics.verify_s += step.verify_s
            finished = stop.add(step.tokens)
            output.token_ids = list(stop.token_ids)
            output.text = stop.final_text(self.decode(output.token_ids))
            metrics.output_tokens = len(output.token_ids)
            metrics.decode_s = time.perf_counter() - start - metrics.prefill_s
            if finished:
                output.finish_reason = stop.finish_reason
                yield output
                return
            yield output


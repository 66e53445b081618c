"""The tests' oracle: the Python reference loop (spec/loop.py) over the torch backend's sessions, one
request alone. Every entry point runs the C++ core; this loop is what the core's output is checked
against (greedy: token for token)."""

from __future__ import annotations

import numpy as np
import torch

from dflash_trt import SamplingParams
from dflash_trt.runtime.outputs import RequestOutput
from dflash_trt.runtime.torch_backend import TorchTargetSession, sessions
from dflash_trt.spec.loop import autoregressive_decode, speculative_decode
from dflash_trt.spec.metrics import RequestMetrics
from dflash_trt.spec.sampling import Sampler
from dflash_trt.spec.stopping import StopChecker
from dflash_trt.spec.structured import StructuredOutput


def reference_output(llm, prompt, params: SamplingParams | None = None, speculative: bool = False,
                     block_size: int | None = None) -> RequestOutput:
    """The final output of the reference loop for `prompt` on a torch-backend `llm` (speculative at
    `block_size`, default the LLM's block)."""
    params = params or SamplingParams()
    ids = llm.encode(prompt)
    stop_ids = tuple(params.stop_token_ids) + (() if params.ignore_eos else tuple(llm.eos_token_ids))
    sampler = Sampler(params, ids, stop_ids)
    target, drafter = sessions(llm, speculative)
    block = block_size or llm.block_size
    steps = speculative_decode(target, drafter, ids, block, sampler) if speculative else autoregressive_decode(
        target, ids, sampler)
    stop = StopChecker(params, llm.eos_token_ids, llm.text_stream())
    metrics = RequestMetrics(block_size=block if speculative else None, prompt_tokens=len(ids))
    for step in steps:
        if step.accepted is not None:
            metrics.record(step.accepted)
        if stop.add(step.tokens):
            break
    metrics.output_tokens = len(stop.token_ids)
    return RequestOutput(prompt=prompt, prompt_token_ids=ids, text=stop.text, token_ids=list(stop.token_ids),
                         finish_reason=stop.finish_reason, metrics=metrics)


def constrained_greedy(llm, prompt, structured: StructuredOutput, max_tokens: int,
                       bias: dict[int, float] | None = None) -> list[int]:
    """Greedy decoding of a torch-backend `llm`'s target alone, each step's argmax over the tokens
    llguidance's matcher allows (its EOS ids too once the grammar may end), written apart from the core;
    with `structured.after`, every token until that one; `bias` added to the logits first."""
    import llguidance.hf
    import llguidance.numpy

    tokenizer = llguidance.hf.from_tokenizer(llm.tokenizer, n_vocab=llm.vocab_size)
    matcher = llguidance.LLMatcher(tokenizer, structured.lark())
    session = TorchTargetSession(llm.target, ())
    logits, _ = session.prefill(llm.encode(prompt))
    words = np.zeros((1, (llm.vocab_size + 31) // 32), dtype=np.int32)
    after = None if structured.after is None else llm.tokenizer.convert_tokens_to_ids(structured.after)
    started = after is None
    out = []
    while len(out) < max_tokens:
        row = logits.float().clone()
        for token, value in (bias or {}).items():
            row[token] += value
        if started:
            llguidance.numpy.fill_next_token_bitmask(matcher, words, 0)
            bits = np.unpackbits(words.view(np.uint8), bitorder="little")[:llm.vocab_size].astype(bool)
            if matcher.is_accepting():
                bits[list(llm.eos_token_ids)] = True
            row[torch.from_numpy(~bits)] = -torch.inf
        token = int(row.argmax())
        out.append(token)
        if token in llm.eos_token_ids:
            break
        if started:
            assert matcher.consume_token(token)
        started = started or token == after
        logits, _ = session.forward([token])
        session.commit(1)
        logits = logits[-1]
    return out

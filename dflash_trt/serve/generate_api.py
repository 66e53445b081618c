"""SGLang's native POST /generate: a prompt (text, or token ids; a list of them is a batch) and its
`sampling_params`, no chat template. Each prompt and each of its n samples runs as a completion of its own
(so each answer carries its own meta_info); the answer is SGLang's {text, output_ids, meta_info}, a list
of them for a batch or n > 1, or a stream of cumulative chunks (a batch's or n samples' each with its
"index").
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, RootModel, ValidationError, WithJsonSchema

from dflash_trt.serve.event_streams import translated
from dflash_trt.serve.protocol import (
    MAX_CHOICES,
    CompletionRequest,
    JsonInt,
    LogitBias,
    StopString,
    TokenId,
    only,
    refusal,
)
from dflash_trt.serve.requests import RequestError
from dflash_trt.spec.sampling import RANGES

# SGLang's sampling parameters -> the completion's fields that take them (the rest keep their names)
RENAMED = {"max_new_tokens": "max_tokens", "min_new_tokens": "min_tokens", "json_schema": "guided_json",
           "regex": "guided_regex", "sampling_seed": "seed"}


class SGLangSampling(BaseModel):
    """SGLang's sampling_params (its defaults: 128 new tokens; the rest the server's, as the completion's:
    the model's generation config, else temperature 1)."""

    model_config = ConfigDict(extra="forbid", strict=True)
    max_new_tokens: JsonInt = Field(128, json_schema_extra=RANGES["max_tokens"])
    min_new_tokens: JsonInt | None = Field(None, json_schema_extra=RANGES["min_tokens"])
    temperature: float | None = Field(None, json_schema_extra=RANGES["temperature"])
    top_p: float | None = Field(None, json_schema_extra=RANGES["top_p"])
    top_k: JsonInt | None = Field(None, json_schema_extra={**RANGES["top_k"], "minimum": -1})
    min_p: float | None = Field(None, json_schema_extra=RANGES["min_p"])
    frequency_penalty: float | None = Field(None, json_schema_extra=RANGES["frequency_penalty"])
    presence_penalty: float | None = Field(None, json_schema_extra=RANGES["presence_penalty"])
    repetition_penalty: float | None = Field(None, json_schema_extra=RANGES["repetition_penalty"])
    stop: StopString | list[StopString] | None = None
    stop_token_ids: list[TokenId] | None = None
    ignore_eos: bool | None = None
    skip_special_tokens: bool | None = None
    spaces_between_special_tokens: only(True) | None = None
    no_stop_trim: bool | None = None
    json_schema: str | None = Field(None, description="a JSON schema's text")
    regex: str | None = None
    ebnf: str | None = None
    n: JsonInt = Field(1, ge=1, le=MAX_CHOICES)
    # JSON's exact integers (seed + j stays one)
    sampling_seed: Annotated[JsonInt, Field(ge=0, le=2**53 - 1), WithJsonSchema(
        {"type": "integer", "minimum": 0, "maximum": 2**53 - 1})] | None = None
    logit_bias: LogitBias | None = None
    thinking_token_budget: JsonInt | None = Field(None, json_schema_extra=RANGES["thinking_token_budget"])
    num_speculative_tokens: JsonInt | None = Field(None, json_schema_extra=RANGES["num_speculative_tokens"])


class GenerateRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    text: str | list[str] | None = None
    input_ids: list[TokenId] | list[list[TokenId]] | None = None
    sampling_params: SGLangSampling | Annotated[list[SGLangSampling], Field(min_length=1)] = Field(
        default_factory=SGLangSampling, description="one for every prompt, or one per prompt (a batch's)")
    stream: bool = False
    rid: str | list[str] | None = None
    return_logprob: bool = False
    top_logprobs_num: JsonInt = Field(0, ge=RANGES["logprobs"]["minimum"], le=RANGES["logprobs"]["maximum"])
    logprob_start_len: JsonInt = Field(-1, ge=-1, description="-1: no prompt logprobs; n: the prompt's from token n")
    return_text_in_logprobs: bool = Field(False, description="logprob entries [logprob, id, text]: each token's text "
                                                             "decoded alone (else null)")

    def _given(self) -> tuple[Any, bool]:
        """(the text or the ids, whether they are a list of prompts)."""
        given = self.text if self.text is not None else self.input_ids
        return given, isinstance(given, list) and bool(given) and isinstance(given[0], (str, list))

    def prompts(self) -> list[str | list[int]]:
        if (self.text is None) == (self.input_ids is None):
            raise RequestError("text", "send exactly one of text or input_ids")
        given, batch = self._given()
        prompts = list(given) if batch else [given]
        if not prompts or any(not p for p in prompts):
            raise RequestError("text" if self.text is not None else "input_ids", "a prompt is empty")
        return prompts

    def batched(self) -> bool:
        """Whether the answer is a list: a batch of prompts, or n > 1 samples."""
        given = self.sampling_params if isinstance(self.sampling_params, list) else [self.sampling_params]
        return self._given()[1] or any(sampling.n > 1 for sampling in given)

    def each_sampling(self, count: int) -> list[SGLangSampling]:
        """The sampling_params of each of `count` prompts."""
        if not isinstance(self.sampling_params, list):
            return [self.sampling_params] * count
        if len(self.sampling_params) != count:
            raise RequestError("sampling_params", f"{len(self.sampling_params)} sampling_params for {count} "
                                                  "prompts: send one, or one per prompt")
        return list(self.sampling_params)

    def ids(self, count: int) -> list[str | None]:
        """Each prompt's rid (SGLang's request id), or None."""
        if self.rid is None or isinstance(self.rid, str):
            return [self.rid] * count
        if len(self.rid) != count:
            raise RequestError("rid", f"{len(self.rid)} rids for {count} prompts: send one per prompt")
        return list(self.rid)

    def completions(self, model: str) -> list[tuple[CompletionRequest, str | None]]:
        """(a completion of one prompt and one sample, its rid) for each prompt, then each sample j (seed + j)."""
        prompts = self.prompts()
        each = self.each_sampling(len(prompts))
        total = sum(sampling.n for sampling in each)
        if total > MAX_CHOICES:
            raise RequestError("sampling_params.n", f"{len(prompts)} prompts, {total} samples in all: at most "
                                                    f"{MAX_CHOICES}")
        flags = {"model": model, "return_token_ids": True, "stream": self.stream}
        if self.stream:
            flags["stream_options"] = {"include_usage": True}
        if self.return_logprob:
            flags.update(logprobs=self.top_logprobs_num, return_tokens_as_token_ids=True)
            if self.logprob_start_len >= 0 and self.stream:  # as vLLM's prompt_logprobs
                raise RequestError("logprob_start_len", "the prompt's logprobs are not streamed: send "
                                                        "logprob_start_len -1 with stream")
            if self.logprob_start_len >= 0:
                flags["prompt_logprobs"] = self.top_logprobs_num
        out = []
        for prompt, rid, sampling in zip(prompts, self.ids(len(prompts)), each, strict=True):
            fields = {**_completion_fields(sampling), **flags}
            for j in range(sampling.n):
                seed = {} if sampling.sampling_seed is None else {"seed": sampling.sampling_seed + j}
                try:
                    out.append((CompletionRequest.model_validate({**fields, **seed, "prompt": prompt}), rid))
                except ValidationError as err:
                    raise refusal(list(err.errors()), fields) from None
        return out


def _completion_fields(sampling: SGLangSampling) -> dict:
    """SGLang's sampling_params -> the completion's fields (its names; the schema given as text parsed)."""
    fields = {RENAMED.get(name, name): value for name, value in sampling.model_dump(exclude_none=True).items()
              if name not in ("n", "spaces_between_special_tokens")}
    if sampling.json_schema is not None:  # SGLang sends the schema as text
        try:
            fields["guided_json"] = json.loads(sampling.json_schema)
        except ValueError:
            raise RequestError("sampling_params.json_schema", "json_schema is not valid JSON") from None
    return fields


def refused(err: RequestError, prompt_field: str = "text") -> RequestError:
    """A refusal of the completion a /generate request ran as, named by this body's field: the prompt's
    `prompt_field`, a sampling field under sampling_params (by SGLang's name)."""
    if err.param is None:
        return err
    head = err.param.split(".")[0].split("[")[0]
    if head in ("prompt", "model"):
        return RequestError(prompt_field, err.message, err.status)
    back = {theirs: ours for ours, theirs in RENAMED.items()}
    if head in ("text", "input_ids", "rid", "stream", "sampling_params") or head not in CompletionRequest.model_fields:
        return err
    name = back.get(head, head)
    return RequestError(f"sampling_params.{name}", err.message.replace(head, name, 1), err.status)


class Answer(BaseModel):
    text: str
    output_ids: list[int]
    meta_info: dict[str, Any] = Field(description="id, finish_reason {type, length | matched}, prompt_tokens, "
                                                  "completion_tokens, cached_tokens, spec_verify_ct, "
                                                  "spec_accept_length; with return_logprob the logprobs")


class GenerateReply(RootModel[Answer | list[Answer]]):
    """An answer, or a list of them (a batch, or n > 1: prompt by prompt, each prompt's samples in a row)."""


class GenerateRender:
    """One completion's reply -> SGLang's answer (`whole`), or its chunks -> SGLang's cumulative chunks."""

    def __init__(self, request: GenerateRequest, rid: str | None, token_text: Callable[[int], str] | None = None):
        self.request, self.rid = request, rid
        # an entry's text: with return_text_in_logprobs the token's (the front checked there is a tokenizer)
        self.text = token_text if request.return_text_in_logprobs else None
        self.answer: dict | None = None  # the whole answer, once written

    def _entry(self, logprob: float | None, token: int | str) -> list:
        """A logprob of a token (an id, or a completion's entry name "token_id:<id>") -> SGLang's [logprob,
        id, text]."""
        token = int(token.removeprefix("token_id:")) if isinstance(token, str) else token
        return [logprob, token, self.text(token) if self.text is not None else None]

    def _meta(self, usage: dict | None, finish: str | None, stop_reason, output_ids: list[int]) -> dict:
        usage = usage or {}
        lengths = usage.get("acceptance_lengths") or []
        meta: dict[str, Any] = {"id": self.rid, "finish_reason": None,
                                "prompt_tokens": usage.get("prompt_tokens", 0),
                                "completion_tokens": usage.get("completion_tokens", len(output_ids)),
                                "cached_tokens": (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0),
                                "spec_verify_ct": len(lengths)}
        if lengths:
            meta["spec_accept_length"] = sum(lengths) / len(lengths)
        if finish == "length":
            meta["finish_reason"] = {"type": "length", "length": meta["completion_tokens"]}
        elif finish == "stop":  # an EOS or stop token: the last output id (kept among them, as SGLang's)
            matched = stop_reason if stop_reason is not None else output_ids[-1] if output_ids else None
            meta["finish_reason"] = {"type": "stop", "matched": matched}
        elif finish is not None:
            meta["finish_reason"] = {"type": finish}
        return meta

    def _logprobs(self, meta: dict, logprobs: dict | None, prompt: list | None, prompt_ids: list[int]) -> None:
        if not self.request.return_logprob:
            return
        logprobs = logprobs or {"tokens": [], "token_logprobs": [], "top_logprobs": []}
        meta["output_token_logprobs"] = [self._entry(lp, t) for t, lp in zip(logprobs["tokens"],
                                                                             logprobs["token_logprobs"], strict=True)]
        meta["output_top_logprobs"] = [[self._entry(lp, t) for t, lp in (top or {}).items()]
                                       for top in logprobs["top_logprobs"]]
        if prompt is None:
            return
        start = self.request.logprob_start_len
        own = [None] + [entries[str(token)]["logprob"] for token, entries in zip(prompt_ids[1:], prompt[1:],
                                                                                   strict=True)]
        meta["input_token_logprobs"] = [self._entry(lp, token) for lp, token in zip(own, prompt_ids, strict=True)][start:]
        tops = [None] + [sorted((self._entry(e["logprob"], int(t)) for t, e in entries.items() if e["rank"] is not None),
                                key=lambda entry: -entry[0]) for entries in prompt[1:]]
        meta["input_top_logprobs"] = tops[start:]

    def whole(self, completion: dict) -> dict:
        (choice,) = completion["choices"]
        ids = list(choice.get("token_ids") or [])
        meta = self._meta(completion.get("usage"), choice["finish_reason"], choice.get("stop_reason"), ids)
        self._logprobs(meta, choice.get("logprobs"), choice.get("prompt_logprobs"), choice.get("prompt_token_ids") or [])
        self.answer = Answer(text=choice["text"], output_ids=ids, meta_info=meta).model_dump()
        return self.answer

    def events(self, chunks: AsyncIterator[dict | str]) -> AsyncIterator[dict]:
        """A completion's stream -> SGLang's: after each chunk with new tokens the text and ids so far, then
        (with the usage) the last one with its finish reason, then [DONE]."""
        text, ids, finish = [], [], {}
        logprobs = {"tokens": [], "token_logprobs": [], "top_logprobs": []}

        def chunk(usage: dict | None) -> dict:
            meta = self._meta(usage, finish.get("reason"), finish.get("stop"), ids)
            self._logprobs(meta, logprobs, None, [])
            return {"data": json.dumps({"text": "".join(text), "output_ids": ids, "meta_info": meta})}

        def feed(item: dict | str) -> list[dict]:
            if item == "[DONE]":
                return [{"data": "[DONE]"}]
            if "error" in item:  # a refusal mid-stream: the status line has gone already
                return [{"data": json.dumps(item)}]
            if item.get("usage"):
                return [chunk(item["usage"])]
            out = []
            for choice in item["choices"]:
                text.append(choice.get("text") or "")
                ids.extend(choice.get("token_ids") or [])
                for key in logprobs:
                    logprobs[key] += (choice.get("logprobs") or {}).get(key) or []
                if choice.get("finish_reason") is not None:
                    finish.update(reason=choice["finish_reason"], stop=choice.get("stop_reason"))
                elif choice.get("token_ids"):
                    out.append(chunk(None))
            return out

        return translated(chunks, [], feed)


class StreamTap:
    """A completion's render for a streamed batch: `complete` hands it the completion's chunks and writes
    its own response around nothing; the chunks' SGLang events wait here for `merged`."""

    def __init__(self, render: GenerateRender):
        self.render = render
        self.events_of: AsyncIterator[dict] | None = None

    def events(self, chunks: AsyncIterator[dict | str]) -> AsyncIterator[dict]:
        self.events_of = self.render.events(chunks)
        return _nothing()

    async def close(self) -> None:
        if self.events_of is not None:
            await self.events_of.aclose()


async def _nothing() -> AsyncIterator[dict]:
    return
    yield


async def merged(taps: list[StreamTap]) -> AsyncIterator[dict]:
    """A streamed batch (prompts, n samples): every completion's chunks as they come, each with its "index"
    (prompt by prompt, each prompt's samples in a row, as the whole answer's list), then one [DONE].
    Leaving closes every completion (so its Triton request)."""
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(index: int, tap: StreamTap) -> None:
        try:
            async for event in tap.events_of:
                queue.put_nowait((index, event))
        finally:
            await tap.close()
            queue.put_nowait((index, None))

    pumps = [asyncio.ensure_future(pump(index, tap)) for index, tap in enumerate(taps)]
    try:
        running = len(pumps)
        while running:
            index, event = await queue.get()
            if event is None:
                running -= 1
            elif event["data"] != "[DONE]":
                data = json.loads(event["data"])
                yield {"data": json.dumps(data if "error" in data else {**data, "index": index})}
        yield {"data": "[DONE]"}
    finally:
        for task in pumps:
            task.cancel()
        await asyncio.gather(*pumps, return_exceptions=True)

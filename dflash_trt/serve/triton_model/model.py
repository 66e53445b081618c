"""Triton Python-backend model: one decoupled model whose engine runs the whole speculative loop.

The pattern of vLLM's Triton backend: `initialize` builds the LLM and an Engine (its own stepping
thread); `execute` hands each request to the engine and returns at once; the engine's `on_output`
callback sends the responses through the request's response sender, the last one flagged FINAL.
A poller thread asks each live request's sender `is_cancelled()` (a client that went away) and
aborts it in the engine, which frees its slot; it also keeps the running/waiting gauges current.
Copied into the repository by dflash_trt/serve/repository.py; runs in Triton's Python stub.
"""

import dataclasses
import json
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils

from dflash_trt.errors import Busy, DFlashError
from dflash_trt.models.chat import encode_chat
from dflash_trt.models.tokenizers import token_text
from dflash_trt.runtime.beam_search import beam_search
from dflash_trt.runtime.batch_runner import check_priority
from dflash_trt.serve.deltas import DeltaStream
from dflash_trt.serve.reply_text import reasoning_tokens
from dflash_trt.serve.requests import (
    RequestError,
    beam_search_params,
    check_template_reads,
    parse_sampling,
    template_documents,
    template_kwargs,
    template_tools,
)
from dflash_trt.serve.triton_model.metrics import EngineMetrics
from dflash_trt.spec.sampling import SamplingParams

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
SAMPLING_FIELDS = {field.name for field in dataclasses.fields(SamplingParams)}
POLL_S = 0.05
HEARTBEAT_S = 0.25  # a beam search sends an empty response at least this often while it runs


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        params = {key: value["string_value"] for key, value in config["parameters"].items()}
        from dflash_trt.runtime.engine import Engine
        from dflash_trt.runtime.llm import AUTO, LLM

        capacity = int(params["capacity"]) if params["capacity"] else None
        block_size = int(params["block_size"]) if params["block_size"] else None
        rule = params.get("draft_rule") or "point-mass"
        # serve --generation-config / --override-generation-config: a request's sampling defaults
        generation = {"generation_config": params.get("generation_config") or "auto",
                      "override_generation_config": params.get("override_generation_config") or None}
        eager = params.get("enforce_eager") == "1"  # serve --enforce-eager
        if params["bundle"]:  # capacity None: the bundle's own, else 4096
            self.llm = LLM.from_bundle(params["bundle"], block_size=block_size, capacity=capacity, draft_rule=rule,
                                       enforce_eager=eager, **generation)
        else:
            placed = {name: params.get(name) or None for name in ("device", "dtype", "quant", "draft_quant")}
            self.llm = LLM(params["target"], params["draft"] or AUTO, backend=params.get("backend") or AUTO,
                           block_size=block_size, draft_rule=rule, enforce_eager=eager, **placed, **generation)
        self.engine = Engine(self.llm, max_batch=int(params["max_batch"]), capacity=capacity or self.llm.capacity,
                             block_size=block_size,
                             prefill_chunk=int(params.get("prefill_chunk") or 0),
                             max_waiting=int(params.get("max_waiting") or -1),
                             prefix_caching=params.get("prefix_caching", "1") == "1",
                             scheduling_policy=params.get("scheduling_policy") or "fcfs",
                             engine_seed=int(params["seed"]) if params.get("seed") else None,  # serve --seed
                             reserve_memory=True)  # memory at start is memory under load; a pool too large runs out here
        # serve --default-chat-template-kwargs: under every request's own
        self.default_variables = template_kwargs(params.get("default_chat_template_kwargs") or None)
        if params.get("chat_template"):  # serve --chat-template: in place of the checkpoint's
            with open(params["chat_template"], encoding="utf-8") as template:
                self.llm.tokenizer.chat_template = template.read()
        self.metrics = EngineMetrics(pb_utils, params["served_name"])
        self.live = {}  # engine request id -> _Responder, for the cancellation poller
        self.lock = threading.Lock()
        self.closing = threading.Event()
        self.poller = threading.Thread(target=self._poll, name="dflash-cancel-poll", daemon=True)
        self.poller.start()

    def execute(self, requests):
        for request in requests:
            self._start(request)
        return None  # decoupled: responses go through each request's sender

    def finalize(self):
        self.engine.shutdown(drain=True)  # Triton stops taking requests first; finish those in flight
        self.closing.set()
        self.poller.join()

    # -- requests ------------------------------------------------------------------------------

    def _start(self, request):
        sender = request.get_response_sender()
        try:
            if _bool(request, "health_check"):  # no prompt: the engine's state, at once
                self.engine.check_up()
                sender.send(_response(finish_reason="healthy", usage=json.dumps({"max_model_len": self.engine.capacity})),
                            flags=FINAL)
                return
            if _bool(request, "reset_prefix_cache"):  # no prompt: the engine forgets, then one answer
                self.engine.reset_prefix_cache()
                sender.send(_response(finish_reason="reset"), flags=FINAL)
                return
            ids = self._prompt_ids(request)
            if _bool(request, "tokenize_only"):
                self._tokenized(sender, ids)
                return
            sampling = _string(request, "sampling_parameters")
            params = parse_sampling(sampling, len(ids), self.engine.capacity, self.llm.sampling_defaults)
            salt = _string(request, "cache_salt") or None
            tokenizer = self.llm.tokenizer
            # a logprob entry's token: its text, or (vLLM's return_tokens_as_token_ids) "token_id:<id>"
            named = (lambda t: f"token_id:{t}") if _bool(request, "tokens_as_ids") else (
                lambda t: token_text(tokenizer, t))
            beams = _string(request, "beam_search")
            if beams is not None:
                search = _beam_params(beams, params)
                threading.Thread(target=self._beam_search, name="dflash-beam-search", daemon=True, args=(
                    sender, ids, params, search, _bool(request, "echo"), _bool(request, "return_token_ids"),
                    salt, named)).start()
                return
            priority = self._priority(request)
            responder = _Responder(self, sender, _bool(request, "stream"), params, tokenizer, named,
                                   echo=_bool(request, "echo"), prompt_ids=_bool(request, "return_token_ids"),
                                   reasoning_end=_string(request, "reasoning_end"))
            with self.lock:  # the engine may answer before add_request returns
                rid = self.engine.add_request(ids, params, on_output=responder, priority=priority, cache_salt=salt)
                if not responder.done:
                    self.live[rid] = responder
                responder.rid = rid
        except RequestError as err:
            _refuse(sender, err)
        except Busy as err:  # full queue (429) or draining (503): the request was fine, the moment was not
            _refuse(sender, RequestError(None, str(err), err.status))
        except DFlashError as err:  # the engine's own refusals: a sampling field's (named first), else the prompt's
            field = str(err).split(" ", 1)[0]
            _refuse(sender, RequestError(field if field in SAMPLING_FIELDS else "prompt", str(err)))
        except Exception as err:  # a bug of ours: the request still gets its one final answer, never a hang
            _refuse(sender, RequestError(None, f"internal error: {type(err).__name__}: {err}", 500))

    def _tokenized(self, sender, ids: list[int]) -> None:
        """A tokenize-only request's one answer: the prompt's ids and their text (special tokens kept, so
        that the text tokenizes back to them), and the tokens a request may hold (`max_model_len`)."""
        outside = [t for t in ids if not 0 <= t < self.llm.vocab_size]
        if outside:
            raise RequestError("prompt", f"token id {outside[0]} is outside the vocabulary (size {self.llm.vocab_size})")
        tokenizer = self.llm.tokenizer
        text = tokenizer.decode(ids, skip_special_tokens=False) if tokenizer is not None else ""
        usage = json.dumps({"prompt_tokens": len(ids), "max_model_len": self.engine.capacity})
        sender.send(_response(finish_reason="tokenized", usage=usage, prompt_text=text, prompt_token_ids=ids),
                    flags=FINAL)

    def _priority(self, request) -> int:
        """The request's priority input (0 when absent): one the engine's policy cannot honour is refused."""
        tensor = pb_utils.get_input_tensor_by_name(request, "priority")
        priority = int(tensor.as_numpy().reshape(-1)[0]) if tensor is not None else 0
        try:
            check_priority(priority, self.engine.runner.scheduling_policy)
        except DFlashError as err:
            raise RequestError("priority", str(err)) from None
        return priority

    def _prompt_ids(self, request) -> list:
        """text_input (raw text), messages (chat JSON, through the chat template) or input_ids."""
        tokenizer = self.llm.tokenizer
        ids = pb_utils.get_input_tensor_by_name(request, "input_ids")
        if ids is not None:
            return [int(t) for t in ids.as_numpy().reshape(-1)]
        messages = _string(request, "messages")
        text = _string(request, "text_input")
        if (messages is None) == (text is None):
            raise RequestError("text_input", "send exactly one of text_input, messages or input_ids")
        if tokenizer is None:
            raise RequestError("text_input", "this model has no tokenizer: send input_ids")
        if text is not None:
            return tokenizer(text)["input_ids"]
        try:
            chat = json.loads(messages)
        except ValueError:
            raise RequestError("messages", "messages is not valid JSON") from None
        asked = _string(request, "chat_template")  # the request's own (the front lets it through only if trusted)
        template = asked or tokenizer.chat_template
        tools = template_tools(_string(request, "tools"), template)
        documents = template_documents(_string(request, "documents"), template)
        if not template:  # a base model: the turns' text, one after another
            return tokenizer("\n".join(str(m.get("content", "")) for m in chat))["input_ids"]
        extra = {**self.default_variables, **template_kwargs(_string(request, "chat_template_kwargs"))}
        check_template_reads(extra, template)
        try:
            return encode_chat(tokenizer, chat, tools, extra, documents, asked)
        except Exception as err:  # a template that refuses these messages (roles, order) says why
            raise RequestError("messages", f"the chat template refused the messages: {err}") from None

    def _beam_search(self, sender, ids: list[int], params, search, echo: bool, prompt_ids: bool,
                     salt: str | None, named) -> None:
        """A beam search on this thread, each step through the engine; its sequences sent as whole
        responses, best first, the last FINAL. A client that leaves stops it between steps."""
        tokenizer = self.llm.tokenizer

        beat = [time.monotonic()]

        def step(prompts, sampling):
            # Triton notices a client that left when it writes to it: an empty response now and then
            if time.monotonic() - beat[0] > HEARTBEAT_S:
                sender.send(_response())  # no finish reason: a sign of life
                beat[0] = time.monotonic()
            outputs = self.engine.generate(prompts, sampling, speculative=False, cancelled=sender.is_cancelled,
                                           cache_salt=salt)
            if outputs is None:
                raise _Cancelled
            if any(out.finish_reason == "abort" for out in outputs):  # the engine stopped under it
                raise Busy("the engine stopped during the beam search", 503)
            return outputs

        def decode(tokens):
            return tokenizer.decode(tokens, skip_special_tokens=params.skip_special_tokens) if tokenizer else ""

        try:
            found = beam_search(step, [ids], search, self.llm.eos_token_ids, decode)[0].sequences
        except _Cancelled:
            self.metrics.finished({"prompt_tokens": len(ids)}, "abort")
            _send_cancelled(sender)
            return
        except Busy as err:
            _refuse(sender, RequestError(None, str(err), err.status))
            return
        except Exception as err:  # a bug of ours: still the one final answer
            _refuse(sender, RequestError(None, f"internal error: {type(err).__name__}: {err}", 500))
            return
        echoed = (tokenizer.decode(ids) if tokenizer is not None else " ".join(map(str, ids))) if echo else None
        self._send_beams(sender, ids, found, params, echoed, prompt_ids, named)

    def _send_beams(self, sender, ids: list[int], found: list, params, echoed: str | None, prompt_ids: bool,
                    named) -> None:
        """A beam search's sequences, best first, each a whole response (the last FINAL) with the
        prompt's text (`echoed`) and ids (`prompt_ids`) when asked; `named`: a logprob entry's token."""
        best = found[0].tokens[len(ids):]
        self.metrics.finished({"prompt_tokens": len(ids), "output_tokens": len(best)}, found[0].finish_reason)
        prompt_text = echoed or ""
        for k, sequence in enumerate(found):
            tokens = sequence.tokens[len(ids):]
            usage = json.dumps({"prompt_tokens": len(ids), "completion_tokens": len(tokens)})
            logprobs = "" if params.logprobs is None else json.dumps([
                _token_logprobs({token: entries[token], **entries}, params.logprobs, named)
                for token, entries in zip(tokens, sequence.logprobs, strict=True)])
            response = _response(sequence.text, tokens, sequence.finish_reason, usage, logprobs, prompt_text,
                                 prompt_token_ids=ids if prompt_ids else ())
            sender.send(response, flags=FINAL if k == len(found) - 1 else 0)

    def _finished(self, responder, out):
        with self.lock:
            self.live.pop(responder.rid, None)
        self.metrics.finished(out.metrics.to_dict(), out.finish_reason)
        self.metrics.later(out.metrics.token_gaps)
        self.metrics.gauges(self.engine.stats())

    def _poll(self):
        while not self.closing.wait(POLL_S):
            with self.lock:
                live = list(self.live.items())
            for rid, responder in live:
                if responder.went_away():
                    self.engine.abort(rid)  # its last output (finish "abort") closes the stream
            self.metrics.gauges(self.engine.stats())
            self.metrics.flush()


class _Responder:
    """on_output for one request: deltas while streaming, one response otherwise; FINAL on the last."""

    def __init__(self, model, sender, stream: bool, params, tokenizer, named, echo: bool = False,
                 prompt_ids: bool = False, reasoning_end: str | None = None):
        """`named`: a token id -> what its logprob entries call it."""
        self.model, self.sender, self.stream = model, sender, stream
        self._text = named
        self.deltas = DeltaStream(tuple(params.stop))
        self.top, self.tokenizer = params.logprobs, tokenizer
        self.prompt_top = params.prompt_logprobs
        self.echo, self.prompt_ids = echo, prompt_ids
        self.reasoning_end = reasoning_end  # the text that closes the reply's reasoning: its tokens are counted
        self.prompt_sent = False  # the prompt's text, ids and logprobs go in the first response
        self.rid = None
        self.done = False
        self.cancelled = False
        # Triton frees a sender's response factory with its FINAL response: asking it is_cancelled()
        # after (or while) that goes out crashes tritonserver (measured: SIGSEGV in
        # TRITONBACKEND_ResponseFactoryIsCancelled under a soak with clients leaving). The final send
        # and the poller's question never overlap, and nothing is asked once it went.
        self.guard = threading.Lock()

    def went_away(self) -> bool:
        """True once, when the client has gone (the poller then aborts the request)."""
        with self.guard:
            if self.done or self.cancelled:
                return False
            self.cancelled = self.sender.is_cancelled()
            return self.cancelled

    def __call__(self, out):
        final = out.finish_reason is not None
        if not final and not self.stream:
            return
        if not final:
            self._send(out, final)
            return
        with self.guard:
            self.done = True
            try:
                self.model._finished(self, out)
                if out.finish_reason == "error" and not self.cancelled:
                    _refuse(self.sender, RequestError(None, f"internal error: {out.error}", 500))
                else:
                    self._send(out, final)
            except Exception as err:  # a bug of ours: the request still gets its FINAL answer, or Triton waits
                pb_utils.Logger.log_error(f"request {self.rid}'s last response failed: {type(err).__name__}: {err}")
                _refuse(self.sender, RequestError(None, f"internal error: {type(err).__name__}: {err}", 500))

    def _logprobs(self, out, start: int, count: int) -> str:
        """The JSON of the new tokens' logprobs ("" when not asked)."""
        if self.top is None or not count:
            return ""
        return json.dumps([_token_logprobs(e, self.top, self._text) for e in out.logprobs[start:start + count]])

    def _prompt(self, out) -> tuple[str, list[int], str]:
        """(the prompt's text with echo, its ids with return_token_ids, its logprobs' JSON with
        prompt_logprobs) in the first response, else ("", [], ""). Per prompt token [id, text, logprob,
        [[id, text, logprob] of the top ones]], the first's logprob and top null."""
        if self.prompt_sent:
            return "", [], ""
        self.prompt_sent = True
        text, ids = "", out.prompt_token_ids if self.prompt_ids else []
        if self.echo:
            prompt = out.prompt_token_ids
            text = self.tokenizer.decode(prompt) if self.tokenizer is not None else " ".join(map(str, prompt))
        if self.prompt_top is None or out.prompt_logprobs is None:
            return text, ids, ""
        first, *rest = out.prompt_token_ids
        entries = [[first, self._text(first), None, None]]
        for token, found in zip(rest, out.prompt_logprobs[1:], strict=True):
            entries.append([token, self._text(token), _finite(found[token]),
                            [[t, self._text(t), _finite(lp)] for t, lp in _ranked(found, self.prompt_top)]])
        return text, ids, json.dumps(entries)

    def _send(self, out, final: bool) -> None:
        if final and self.cancelled:  # nobody reads it; Triton still needs the FINAL flag
            _send_cancelled(self.sender)
            return
        sent = self.deltas.tokens if self.stream else 0
        if self.stream:
            text, ids = self.deltas.next(out.text, out.token_ids, final)
        else:
            text, ids = out.text, out.token_ids
        if self.stream and not final and not text and not ids:
            return
        usage = _usage(out, self.tokenizer, self.reasoning_end) if final else ""
        prompt_text, prompt_ids, prompt_logprobs = self._prompt(out)
        response = _response(text, ids, out.finish_reason or "", usage, self._logprobs(out, sent, len(ids)),
                             prompt_text, prompt_logprobs, prompt_ids)
        self.sender.send(response, flags=FINAL if final else 0)


def _response(text: str = "", token_ids=(), finish_reason: str = "", usage: str = "", logprobs: str = "",
              prompt_text: str = "", prompt_logprobs: str = "", prompt_token_ids=()):
    """One response of the model's outputs (config.pbtxt's): strings as given ("": none), ids as int64."""
    def string(name: str, value: str):
        return pb_utils.Tensor(name, np.array([value.encode()], dtype=np.object_))

    def ids(name: str, values):
        return pb_utils.Tensor(name, np.array(list(values), dtype=np.int64))

    return pb_utils.InferenceResponse(output_tensors=[
        string("text_output", text), ids("token_ids", token_ids), string("finish_reason", finish_reason),
        string("usage", usage), string("logprobs", logprobs), string("prompt_text", prompt_text),
        string("prompt_logprobs", prompt_logprobs), ids("prompt_token_ids", prompt_token_ids)])


def _send_cancelled(sender) -> None:
    """The FINAL answer to a request whose client left (nobody reads it; Triton still needs the flag)."""
    sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError("request cancelled",
                                                                      pb_utils.TritonError.CANCELLED)), flags=FINAL)


class _Cancelled(Exception):
    """The client of a beam search went away."""


def _beam_params(text: str, params):
    """The beam_search input (JSON: beam_width, length_penalty) over the request's SamplingParams ->
    the search's BeamSearchParams; a refusal names the field."""
    try:
        spec = json.loads(text)
        width, penalty = spec["beam_width"], spec.get("length_penalty", 1.0)
    except (ValueError, TypeError, KeyError):
        raise RequestError("beam_search", 'beam_search must be JSON {"beam_width": N, "length_penalty": X}') from None
    return beam_search_params(params, width, penalty)


def _refuse(sender, error: RequestError) -> None:
    """The request's one and final response: its refusal, as JSON in the Triton error message."""
    sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(error.to_json())), flags=FINAL)


LOGPROB_FLOOR = -9999.0  # vLLM's stand-in for a token that cannot come (-inf, or NaN): JSON has neither


def _finite(logprob: float) -> float:
    return logprob if logprob >= LOGPROB_FLOOR else LOGPROB_FLOOR  # (NaN compares false)


def _token_logprobs(entries: dict, top: int, text) -> list:
    """One output token's {id: logprob} (its own first, then the top ones) -> [text, logprob, [[text,
    logprob] of the `top` most probable]]."""
    token, logprob = next(iter(entries.items()))
    return [text(token), _finite(logprob), [[text(t), _finite(lp)] for t, lp in _ranked(entries, top)]]


def _ranked(entries: dict, top: int) -> list:
    """A position's {id: logprob} (its token's own, then the top ones) -> the `top` most probable pairs."""
    return sorted(entries.items(), key=lambda e: -e[1])[:top]


def _usage(out, tokenizer, reasoning_end: str | None) -> str:
    metrics = out.metrics.to_dict()
    metrics["prompt_tokens"] = len(out.prompt_token_ids)
    metrics["completion_tokens"] = len(out.token_ids)
    if out.stop_reason is not None:  # the stop string or stop token id that ended it
        metrics["stop_reason"] = out.stop_reason
    if reasoning_end and tokenizer is not None:
        metrics["reasoning_tokens"] = reasoning_tokens(tokenizer, out.token_ids, reasoning_end)
    return json.dumps(metrics)


def _string(request, name):
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    if tensor is None:
        return None
    value = tensor.as_numpy().reshape(-1)[0]
    return value.decode() if isinstance(value, bytes) else str(value)


def _bool(request, name) -> bool:
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return bool(tensor.as_numpy().reshape(-1)[0]) if tensor is not None else False

"""OpenAI response bodies, stream chunks, Server-Sent Events and error objects (pure functions)."""

from __future__ import annotations

import json
import time
import uuid

ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
               405: "invalid_request_error", 413: "invalid_request_error", 422: "invalid_request_error",
               429: "rate_limit_error"}


def error_body(status: int, message: str, param: str | None = None, code: str | None = None) -> dict:
    kind = ERROR_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def sse(data: dict | str) -> bytes:
    return f"data: {data if isinstance(data, str) else json.dumps(data)}\n\n".encode()


def usage(info: dict | None) -> dict:
    """Triton's usage JSON -> OpenAI usage, plus acceptance: per verify step (bench/server.py reads
    `acceptance_lengths`) and the mean, as dflash-trt extensions."""
    info = info or {}
    prompt, completion = info.get("prompt_tokens", 0), info.get("completion_tokens", 0)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
            "acceptance_lengths": info.get("acceptance_lengths", []),
            "mean_acceptance_length": info.get("mean_acceptance_length")}


def meta_info(info: dict | None) -> dict:
    """SGLang's `meta_info` for a reply (what the DFlash authors' benchmark client reads): verify steps
    that drafted (`spec_verify_ct`) and the mean acceptance length τ per such step, bonus token
    included (`spec_accept_length`; absent when nothing was drafted)."""
    info = info or {}
    out = {"completion_tokens": info.get("completion_tokens", 0), "spec_verify_ct": info.get("num_drafts", 0)}
    if info.get("mean_acceptance_length") is not None:
        out["spec_accept_length"] = info["mean_acceptance_length"]
    return out


class Reply:
    """One request's identity and the shapes of its chat or completion objects."""

    def __init__(self, chat: bool, model: str, with_meta_info: bool = False):
        self.chat, self.model, self.with_meta_info = chat, model, with_meta_info
        self.id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        self.created = int(time.time())

    def _object(self, kind: str, choices: list, extra: dict | None = None) -> dict:
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model, "choices": choices,
                **(extra or {})}

    def whole(self, text: str, finish_reason: str | None, info: dict | None) -> dict:
        extra = {"usage": usage(info), **({"meta_info": meta_info(info)} if self.with_meta_info else {})}
        if self.chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                      "finish_reason": finish_reason}
            return self._object("chat.completion", [choice], extra)
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
        return self._object("text_completion", [choice], extra)

    def chunk(self, text: str | None, finish_reason: str | None = None, role: bool = False) -> dict:
        if self.chat:
            delta = {"role": "assistant", "content": ""} if role else ({} if text is None else {"content": text})
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
            return self._object("chat.completion.chunk", [choice])
        choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish_reason}
        return self._object("text_completion", [choice])

    def usage_chunk(self, info: dict | None) -> dict:
        return self._object("chat.completion.chunk" if self.chat else "text_completion", [], {"usage": usage(info)})

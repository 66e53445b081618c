"""What /openapi.json says the front's endpoints answer besides their replies: the error objects of each
status, and a completion's reply or its Server-Sent Events."""

from __future__ import annotations

from dflash_trt.serve.openai_models import ErrorResponse

ERRORS = {status: {"model": ErrorResponse, "description": what} for status, what in (
    (400, "a field is wrong (`error.param` names it)"), (401, "no valid API key"),
    (404, "unknown model, or no stored response of that id"),
    (413, "the body is over the limit"), (429, "the waiting queue is full (Retry-After)"),
    (503, "the model is not ready, is draining, or the inference server failed"))}
# any other status (an unknown path, a wrong method, a bug of ours) is an error object too; saying so
# also keeps FastAPI from documenting a 422 that this front never sends (its validation errors are 400)
ERRORS["default"] = {"model": ErrorResponse, "description": "any other error"}


def replies(whole: type, chunk: type) -> dict:
    """OpenAPI responses of a completion endpoint: the reply, or with `stream: true` its chunks as SSE."""
    # each event as schemathesis and SSE clients read it: its fields, `data` the chunk's JSON text
    stream = {"schema": {"type": "object", "properties": {"data": {"type": "string"}, "event": {"type": "string"}},
                         "description": f"Server-Sent Events: `data: <{chunk.__name__}>` per chunk, then "
                                        "`data: [DONE]`"}}
    return {200: {"model": whole, "content": {"text/event-stream": stream}}, **ERRORS}

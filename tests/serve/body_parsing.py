"""The steps the front's typed endpoints take with a request body, without HTTP, for tests of the
request models (serve/protocol.py): decode the JSON, validate it with the model as FastAPI does,
refuse through `protocol.refusal` (what the front's validation handler calls), then SamplingParams'
own checks (`check_sampling`, which the endpoint calls). tests/serve/test_front.py covers the same
through the app itself."""

from __future__ import annotations

import json

from pydantic import ValidationError

from dflash_trt.serve.protocol import refusal
from dflash_trt.serve.requests import RequestError


def parse(body: bytes, kind):
    """Request body -> the request, or a RequestError naming the first bad field."""
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        raise RequestError(None, "the request body is not valid JSON") from None
    try:
        request = kind.model_validate(data)
    except ValidationError as err:
        raise refusal(err.errors(), data) from None
    request.check_sampling()
    return request

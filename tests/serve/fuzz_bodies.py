"""Seeded request bodies for fuzzing the front: valid ones with one or two fields dropped, retyped or
set to edge values, plus raw byte noise. Deterministic for a seed."""

from __future__ import annotations

import json
import random

ODD_VALUES = [None, True, False, 0, -1, 1, 2**63, -(2**63), 1e308, -1e-9, 0.5, "", "x", "0.5", [], [1], ["a"],
              [[1]], {}, {"a": 1}, [{"role": "user"}], [{"role": "user", "content": None}],
              [{"role": "user", "content": [{"type": "image_url"}]}], "\u0000", "\ud7ff" * 3, "\ud800"]
CHAT_FIELDS = ["model", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k", "seed",
               "stop", "n", "stream", "stream_options", "logprobs", "user"]
COMPLETION_FIELDS = ["model", "prompt", "max_tokens", "temperature", "top_p", "top_k", "seed", "stop", "n", "stream",
                     "echo", "best_of"]


def bodies(model: str, count: int, seed: int = 0) -> list[tuple[str, bytes]]:
    """-> [(path, body)]: chat and completion requests, most of them wrong in some way."""
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        chat = rng.random() < 0.6
        body = ({"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4} if chat
                else {"model": model, "prompt": "hi", "max_tokens": 4})
        fields = CHAT_FIELDS if chat else COMPLETION_FIELDS
        for _ in range(rng.randint(1, 2)):
            name = rng.choice(fields)
            if rng.random() < 0.2:
                body.pop(name, None)
            else:
                body[name] = rng.choice(ODD_VALUES)
        raw = json.dumps(body).encode()
        if rng.random() < 0.1:  # broken JSON
            cut = rng.randrange(len(raw))
            raw = raw[:cut] + bytes([rng.randrange(256)]) + raw[cut + 1:]
        out.append(("/v1/chat/completions" if chat else "/v1/completions", raw))
    return out

"""Write the Triton model repository: ONE decoupled Python-backend model that owns the engine."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from dflash_trt.serve.config import TRITON_MODEL, ServeConfig

MODEL_SOURCE = Path(__file__).parent / "triton_model" / "model.py"

# Inputs: a prompt as raw text, chat messages (JSON, with the chat template's extra variables as a
# JSON object in chat_template_kwargs, the tools it offers and the documents it cites as JSON lists, and
# a template of the request's own in chat_template) or token ids; sampling parameters as one JSON
# string (vLLM backend's convention); stream=false gives one response (what /generate needs).
# Outputs: text and token ids (deltas when streaming, whole otherwise), the finish reason and a usage
# JSON (token counts, acceptance lengths) on the last response. The first response also carries, when
# asked, the prompt's text (echo: true), its token ids (return_token_ids: true) and its tokens' logprobs
# (sampling parameter prompt_logprobs). `priority` (vLLM's; lower first) needs the priority scheduling policy.
# With `reasoning_end` (the text that closes a reply's reasoning) the usage counts its reasoning tokens.
# `tokenize_only`: one answer, finish reason "tokenized", with the prompt's ids and text and no generation.
# `beam_search` (JSON: beam_width, length_penalty): a beam search over the sampling parameters'
# max_tokens, temperature and ignore_eos; its beam_width results come as that many whole responses, best
# first, each with its prompt's text and ids when asked, after empty responses (no finish reason) sent
# while it runs: Triton notices a client that left only when it writes to it. `cache_salt` (vLLM's): the request reuses KV
# positions only of requests with the same salt. `tokens_as_ids` (vLLM's return_tokens_as_token_ids):
# logprob entries name their tokens "token_id:<id>" instead of their text. `reset_prefix_cache` (no prompt):
# the engine drops what finished requests' slots keep, then one answer, finish reason "reset".
# `health_check` (no prompt): one answer, finish reason "healthy" (its usage: max_model_len), or a 503
# refusal once the engine is down.
CONFIG = """name: "{name}"
backend: "python"
max_batch_size: 0
model_transaction_policy {{ decoupled: true }}
input [
  {{ name: "text_input", data_type: TYPE_STRING, dims: [ 1 ], optional: true }},
  {{ name: "messages", data_type: TYPE_STRING, dims: [ 1 ], optional: true }},
  {{ name: "chat_template_kwargs", data_type: TYPE_STRING, dims: [ 1 ], optional: true }},
  {{ name: "tools", data_type: TYPE_STRING, dims: [ 1 ], optional: true }},
  {{ name: "documents", data_type: TYPE_STRING, dims: [ 1 ], optional: true }},
  {{ name: "chat_template", data_type: TYPE_STRING, dims: [ 1 ], optional: true }},
  {{ name: "input_ids", data_type: TYPE_INT64, dims: [ -1 ], optional: true }},
  {{ name: "sampling_parameters", data_type: TYPE_STRING, dims: [ 1 ], optional: true }},
  {{ name: "stream", data_type: TYPE_BOOL, dims: [ 1 ], optional: true }},
  {{ name: "echo", data_type: TYPE_BOOL, dims: [ 1 ], optional: true }},
  {{ name: "return_token_ids", data_type: TYPE_BOOL, dims: [ 1 ], optional: true }},
  {{ name: "priority", data_type: TYPE_INT64, dims: [ 1 ], optional: true }},
  {{ name: "reasoning_end", data_type: TYPE_STRING, dims: [ 1 ], optional: true }},
  {{ name: "tokenize_only", data_type: TYPE_BOOL, dims: [ 1 ], optional: true }},
  {{ name: "beam_search", data_type: TYPE_STRING, dims: [ 1 ], optional: true }},
  {{ name: "cache_salt", data_type: TYPE_STRING, dims: [ 1 ], optional: true }},
  {{ name: "tokens_as_ids", data_type: TYPE_BOOL, dims: [ 1 ], optional: true }},
  {{ name: "reset_prefix_cache", data_type: TYPE_BOOL, dims: [ 1 ], optional: true }},
  {{ name: "health_check", data_type: TYPE_BOOL, dims: [ 1 ], optional: true }}
]
output [
  {{ name: "text_output", data_type: TYPE_STRING, dims: [ 1 ] }},
  {{ name: "token_ids", data_type: TYPE_INT64, dims: [ -1 ] }},
  {{ name: "finish_reason", data_type: TYPE_STRING, dims: [ 1 ] }},
  {{ name: "usage", data_type: TYPE_STRING, dims: [ 1 ] }},
  {{ name: "logprobs", data_type: TYPE_STRING, dims: [ 1 ] }},
  {{ name: "prompt_text", data_type: TYPE_STRING, dims: [ 1 ] }},
  {{ name: "prompt_logprobs", data_type: TYPE_STRING, dims: [ 1 ] }},
  {{ name: "prompt_token_ids", data_type: TYPE_INT64, dims: [ -1 ] }}
]
instance_group [ {{ count: 1, kind: KIND_CPU }} ]
{parameters}
"""


def _parameters(values: dict[str, str]) -> str:
    # json.dumps quotes and escapes exactly as protobuf text format expects for these strings
    return "\n".join(f'parameters {{ key: {json.dumps(k)} value {{ string_value: {json.dumps(v)} }} }}'
                     for k, v in values.items())


def write_repository(root: Path, config: ServeConfig) -> Path:
    """root/<model>/config.pbtxt and root/<model>/1/model.py -> root."""
    model_dir = root / TRITON_MODEL
    (model_dir / "1").mkdir(parents=True, exist_ok=True)
    (model_dir / "config.pbtxt").write_text(
        CONFIG.format(name=TRITON_MODEL, parameters=_parameters(config.model_parameters())))
    shutil.copyfile(MODEL_SOURCE, model_dir / "1" / "model.py")
    return root

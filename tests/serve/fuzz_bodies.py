"""Schema-valid request bodies the server must accept, for schemathesis: that a completion's prompts
times n stay within the choices a request may have, that prompt_logprobs do not come with a stream,
whether a regex, a grammar or a JSON schema compiles, and that a request asks for structured output
once and not beside what bans its end, is beyond JSON Schema; a generated body keeps the prompts that fit,
its first structured-output field, holding one that compiles (a whitespace pattern only beside JSON, one
that compiles), no_stop_trim only as include_stop_str_in_output says, no template or documents of its own
(a template that cites them, trusted, is test_serve_end_to_end.py's), a forced tool_choice calls a function
the body offers (strict only with one), and beam search is not asked (its rules are test_protocol.py's); a Responses API body the same in its own shapes. Refusals of the
others are tests/serve/test_protocol.py's and tests/serve/test_responses_api.py's."""

from __future__ import annotations

from dflash_trt.serve.protocol import MAX_CHOICES

VALID = {"guided_json": {"type": "object"}, "guided_regex": "[a-z]+", "guided_grammar": 'start: "a" | "b"',
         "ebnf": 'root ::= "a" | "b"', "structured_outputs": {"json": {"type": "object"}},
         "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}}}
FIELDS = ["response_format", "structured_outputs", "guided_json", "guided_regex", "guided_choice", "guided_grammar",
          "ebnf"]
JSON_FIELDS = ("response_format", "structured_outputs", "guided_json")  # as VALID holds them


def asks(body: dict, field: str) -> bool:
    value = body.get(field)
    if field == "response_format":
        return isinstance(value, dict) and value.get("type") in ("json_object", "json_schema")
    return value is not None


def acceptable(body, path: str = ""):
    if not isinstance(body, dict):
        return body
    if path in ("/tokenize", "/detokenize"):
        return acceptable_tokenize(body)
    if path in ("/v1/messages", "/v1/messages/count_tokens"):
        return acceptable_message(body)
    if path == "/generate":
        return acceptable_generate(body)
    if "input" in body:
        return acceptable_response(body)
    # a beam search takes few of the sampling fields (tests/serve/test_protocol.py checks which): not fuzzed
    body["use_beam_search"] = body["length_penalty"] = None
    body.pop("chat_template", None)  # a template of the request's own: taken only if trusted, and may refuse
    body.pop("documents", None)  # documents: only for a template that cites them
    prompt, n = body.get("prompt"), body.get("n", 1)
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)) and isinstance(n, (int, float)) \
            and not isinstance(n, bool) and n >= 1:  # n may come as an integral float (56.0)
        body["prompt"] = prompt[:max(1, MAX_CHOICES // int(n))]
    if body.get("stream") is True:
        body["prompt_logprobs"] = None
    if body.get("include_stop_str_in_output") is not None:
        body["no_stop_trim"] = None
    choice = body.get("tool_choice")
    if choice == "required" or isinstance(choice, dict):  # forced calls: of a function the body offers
        body["tools"] = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
        if isinstance(choice, dict):
            body["tool_choice"] = {"type": "function", "function": {"name": "f"}}
        for field in FIELDS:
            body[field] = None
        body["ignore_eos"] = body["min_tokens"] = body["guided_whitespace_pattern"] = None
        return body
    for tool in body["tools"] if isinstance(body.get("tools"), list) else []:  # strict needs forced calls
        if isinstance(tool, dict) and isinstance(tool.get("function"), dict):
            tool["function"]["strict"] = None
    asked = [field for field in FIELDS if asks(body, field)]
    for field in asked[1:]:
        body[field] = None
    if asked:
        if asked[0] in VALID:
            body[asked[0]] = VALID[asked[0]]
        body["ignore_eos"] = body["min_tokens"] = None
    spaced = asked and asked[0] in JSON_FIELDS and body.get("guided_whitespace_pattern") is not None
    body["guided_whitespace_pattern"] = "[ ]?" if spaced else None
    return body


def acceptable_response(body: dict) -> dict:
    """The same for a Responses API body: top_logprobs with the include that returns them, a forced
    tool_choice calling a function it offers (strict only then), a text format's schema that compiles,
    and neither beside what bans the reply's end (ignore_eos, min_tokens), as a chat body's."""
    body["background"] = None  # its rules (not streamed, stored) are test_responses_api.py's
    if body.get("top_logprobs") is not None:
        body["include"] = ["message.output_text.logprobs"]
    if isinstance(body.get("input"), list):  # earlier reasoning alone is nothing to read
        body["input"].append({"role": "user", "content": "hi"})
    tools = body["tools"] if isinstance(body.get("tools"), list) else []
    choice = body.get("tool_choice")
    if choice == "required" or isinstance(choice, dict):
        body["tools"] = [{"type": "function", "name": "f", "parameters": {"type": "object"}}]
        if isinstance(choice, dict):
            body["tool_choice"] = {"type": "function", "name": "f"}
        body["text"] = None
        body["ignore_eos"] = body["min_tokens"] = None
        return body
    for tool in tools:
        if isinstance(tool, dict):
            tool["strict"] = None
    text = body.get("text")
    if isinstance(text, dict) and isinstance(text.get("format"), dict) and text["format"].get("type") == "json_schema":
        text["format"] = {"type": "json_schema", "name": "x", "schema": {"type": "object"}}
    if isinstance(text, dict) and isinstance(text.get("format"), dict) and text["format"].get("type") != "text":
        body["ignore_eos"] = body["min_tokens"] = None
    return body


def acceptable_tokenize(body: dict) -> dict:
    """/tokenize's turns the chat template renders (it may refuse others: roles, order, its variables),
    /detokenize's ids inside the vocabulary (the schema does not know its size). Only bodies the schema
    allows (the server's own models say so) are changed: one it refuses must stay refused."""
    from pydantic import ValidationError

    from dflash_trt.serve.tokenize_api import DetokenizeRequest, TokenizeChat

    for model in (TokenizeChat, DetokenizeRequest):
        try:
            model.model_validate(body)
        except ValidationError:
            continue
        if model is TokenizeChat:
            body.update(messages=[{"role": "user", "content": "hi"}], tools=None, chat_template_kwargs=None,
                        add_generation_prompt=None, continue_final_message=None, documents=None, chat_template=None)
        else:
            body["tokens"] = [int(t) % 50 for t in body["tokens"]]
    return body


def acceptable_message(body: dict) -> dict:
    """An Anthropic Messages body whose forced tool_choice (any, or a named tool) calls a tool it offers
    with a schema that compiles, and whose thinking budget is below its max_tokens (Anthropic's rule)."""
    thinking, most = body.get("thinking"), body.get("max_tokens")
    budget = thinking.get("budget_tokens") if isinstance(thinking, dict) else None
    # JSON numbers both (an integral float is an integer here, as JSON has it)
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (budget, most)) and most >= 1:
        thinking["budget_tokens"] = min(budget, int(most) - 1)
    choice = body.get("tool_choice")
    if isinstance(choice, dict) and choice.get("type") in ("any", "tool"):
        body["tools"] = [{"name": "f", "input_schema": {"type": "object"}}]
        if choice["type"] == "tool":
            choice["name"] = "f"
    return body


def acceptable_generate(body: dict) -> dict:
    """A /generate body with one text prompt, its rid one string, a reply that fits any context, no token
    ids of its own, no grammar (whether one compiles, and goes with min_new_tokens, is test_generate_api.py's)."""
    body.pop("input_ids", None)
    body["text"], body["rid"] = "hi", None
    sampling = body.get("sampling_params")
    if isinstance(sampling, list):  # one per prompt: this one's
        body["sampling_params"] = sampling = sampling[:1] or [{}]
        sampling = sampling[0]
    if isinstance(sampling, dict):  # a reply that fits any server's context (no model name refuses it first)
        if isinstance(sampling.get("max_new_tokens"), (int, float)):
            sampling["max_new_tokens"] = max(1, min(int(sampling["max_new_tokens"]), 16))
        sampling["logit_bias"] = None  # its ids, as the prompt's, are checked against the vocabulary
        for name in ("json_schema", "regex", "ebnf"):
            sampling.pop(name, None)
        if body.get("stream") is True:
            sampling["n"] = 1
    if body.get("stream") is True:
        body["logprob_start_len"] = -1
    return body

"""`dflash-trt serve` as real processes (tritonserver + the front) over a tiny random pair."""

from __future__ import annotations

import json
import os
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from factories import TOOLS_TEMPLATE
from fuzz_bodies import acceptable
from server_process import need_triton, start_server

from dflash_trt.spec.sampling import SamplingParams

CAPACITY = 1024
# Two runs of one prompt agree on a logprob to float32 rounding only: each step's verify block is sized by
# the costs measured then, and a block's logits round apart from one token's by ~1e-6 (seen: 1.2e-6).
LOGPROB_TOL = 1e-4
SERVED = "org/tiny-qwen3"  # --served-model-name: an id with a slash, as hub ids have
PROMPTS = ["hello", "write a poem", "def f(x):", "1 + 1 =", "tell me a story", "abc", "why?", "ok",
           "the sky is", "print(", "once upon", "zzz", "hi there", "list: 1,", "what is DFlash", "x"]


@pytest.fixture(scope="module")
def pair(tiny_pairs):
    return tiny_pairs["qwen3"]


@pytest.fixture(scope="module")
def server(pair, tmp_path_factory):
    need_triton()
    target, draft = pair
    # the target's own template, which renders tools too (tool calls: hermes, as the ready line says); it
    # opens no think block, so with the reasoning parser a reply is all content unless it opens one
    template = tmp_path_factory.mktemp("template") / "tools.jinja"
    template.write_text(TOOLS_TEMPLATE)
    # torch: the offline oracle's backend, and slow enough for the cancellation tests to leave mid-reply
    # (serving a slots bundle on the onnxruntime executor: test_server_bundle.py)
    # priority scheduling: requests that send no priority are served first come first served, as
    # under fcfs (one of equal priority never preempts)
    # (vLLM's names for --capacity and --max-batch; a placed, quantized target: test_serve_placement.py)
    started = start_server(["--target", str(target), "--draft", str(draft), "--max-model-len", str(CAPACITY),
                            "--max-num-seqs", "4", "--backend", "torch", "--chat-template", str(template),
                            "--reasoning-parser", "qwen3", "--scheduling-policy", "priority",
                            "--served-model-name", SERVED, "--trust-request-chat-template", "--log-stats-interval", "1",
                            "--enable-log-requests", "--max-log-len", "40", "--enable-request-id-headers",
                            "--uvicorn-log-level", "info"])
    assert any("tool calls: hermes; reasoning: qwen3" in line for line in started.output)
    assert started.model == SERVED
    yield started
    started.stop()


@pytest.fixture(scope="module")
def offline(pair):
    from dflash_trt.runtime.llm import LLM

    return LLM(str(pair[0]), str(pair[1]), backend="torch")


@pytest.fixture(scope="module")
def client(server):
    from openai import OpenAI

    return OpenAI(base_url=server.url, api_key="none", max_retries=0, timeout=120)


def chat(client, server, prompt, **kwargs):
    return client.chat.completions.create(model=server.model, messages=[{"role": "user", "content": prompt}],
                                          **kwargs)


def streamed(client, server, prompt, **kwargs) -> tuple[str, object, str]:
    text, usage, reason = [], None, None
    for chunk in chat(client, server, prompt, stream=True, stream_options={"include_usage": True}, **kwargs):
        usage = chunk.usage or usage
        for choice in chunk.choices:
            text.append(choice.delta.content or "")
            reason = choice.finish_reason or reason
    return "".join(text), usage, reason


def samples(server) -> dict[tuple, float]:
    text = httpx.get(f"{server.root}/metrics", timeout=10).text
    return {(s.name, tuple(sorted((k, v) for k, v in s.labels.items() if k != "model_name"))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def metric(values, name, **labels) -> float:
    return values.get((name, tuple(sorted(labels.items()))), 0.0)


def test_greedy_equals_offline(server, client, offline):
    params = SamplingParams(max_tokens=24)
    for prompt in PROMPTS[:3]:
        expected = offline.generate(prompt, params)[0]
        reply = chat(client, server, prompt, max_tokens=24, temperature=0)
        assert reply.choices[0].message.content == expected.text
        assert reply.usage.completion_tokens == len(expected.token_ids)
        assert reply.choices[0].finish_reason == expected.finish_reason
        # token for token, through Triton's own generate endpoint
        direct = httpx.post(f"{server.triton}/v2/models/dflash/generate", timeout=60, json={
            "messages": json.dumps([{"role": "user", "content": prompt}]),
            "sampling_parameters": json.dumps({"max_tokens": 24, "temperature": 0})}).json()
        ids = direct["token_ids"] if isinstance(direct["token_ids"], list) else [direct["token_ids"]]
        assert ids == expected.token_ids and direct["finish_reason"] == expected.finish_reason


def test_a_seeded_sampled_reply_equals_offline(server, client, offline):
    """A seeded T>0 request gets the same tokens through the server as through LLM.generate."""
    expected = offline.generate(PROMPTS[0], SamplingParams(max_tokens=16, temperature=0.8, top_p=0.9, top_k=20,
                                                           seed=11))[0]
    reply = chat(client, server, PROMPTS[0], max_tokens=16, temperature=0.8, top_p=0.9, seed=11,
                 extra_body={"top_k": 20})
    assert reply.choices[0].message.content == expected.text
    assert reply.usage.completion_tokens == len(expected.token_ids)


def test_n_choices_are_the_offline_replies_of_seed_plus_i(server, client, offline):
    """n = 3, seeded, T>0: choice i is LLM.generate's reply with seed + i (choice 0: the n = 1 reply);
    streamed greedy choices are each the greedy reply."""
    params = [SamplingParams(max_tokens=12, temperature=0.9, top_p=0.95, seed=21 + i) for i in range(3)]
    expected = [offline.generate(PROMPTS[2], p)[0] for p in params]
    reply = chat(client, server, PROMPTS[2], max_tokens=12, temperature=0.9, top_p=0.95, seed=21, n=3)
    assert [c.message.content for c in sorted(reply.choices, key=lambda c: c.index)] == [e.text for e in expected]
    assert reply.usage.completion_tokens == sum(len(e.token_ids) for e in expected)
    greedy = offline.generate(PROMPTS[3], SamplingParams(max_tokens=12))[0].text
    texts = {}
    for chunk in chat(client, server, PROMPTS[3], max_tokens=12, temperature=0, n=2, stream=True):
        for choice in chunk.choices:
            texts[choice.index] = texts.get(choice.index, "") + (choice.delta.content or "")
    assert texts == {0: greedy, 1: greedy}


def test_penalties_reach_the_core_and_give_offline_generate_s_reply(server, client, offline):
    """presence_penalty and frequency_penalty (OpenAI's) and repetition_penalty (vLLM's, in extra_body)."""
    params = SamplingParams(max_tokens=16, presence_penalty=1.5, frequency_penalty=0.5, repetition_penalty=1.2)
    expected = offline.generate(PROMPTS[4], params)[0]
    assert expected.token_ids != offline.generate(PROMPTS[4], SamplingParams(max_tokens=16))[0].token_ids
    reply = chat(client, server, PROMPTS[4], max_tokens=16, temperature=0, presence_penalty=1.5,
                 frequency_penalty=0.5, extra_body={"repetition_penalty": 1.2})
    assert reply.choices[0].message.content == expected.text
    assert reply.usage.completion_tokens == len(expected.token_ids)
    # logit_bias (OpenAI's, token ids as strings) banning the reply's first token; min_tokens (vLLM's)
    # holding back a stop token the reply has early
    free = offline.generate(PROMPTS[4], SamplingParams(max_tokens=16))[0].token_ids
    params = SamplingParams(max_tokens=16, logit_bias={free[0]: -100}, stop_token_ids=(free[2],), min_tokens=12)
    expected = offline.generate(PROMPTS[4], params)[0]
    assert expected.token_ids[0] != free[0] and len(expected.token_ids) >= 12
    reply = chat(client, server, PROMPTS[4], max_tokens=16, temperature=0, logit_bias={str(free[0]): -100},
                 extra_body={"stop_token_ids": [free[2]], "min_tokens": 12})
    assert reply.choices[0].message.content == expected.text


def test_vllm_s_stop_token_ids_end_a_reply_where_offline_generate_ends_it(server, client, offline):
    """stop_token_ids (vLLM's extension, sent in extra_body) reach the core: the reply stops at the first
    one generated, as LLM.generate's does with the same SamplingParams."""
    ids = offline.generate(PROMPTS[1], SamplingParams(max_tokens=24))[0].token_ids
    at = next(i for i in range(2, len(ids)) if ids[i] not in ids[:i])  # its first occurrence, a few tokens in
    expected = offline.generate(PROMPTS[1], SamplingParams(max_tokens=24, stop_token_ids=(ids[at],)))[0]
    assert expected.token_ids == ids[:at + 1] and expected.finish_reason == "stop"
    reply = chat(client, server, PROMPTS[1], max_tokens=24, temperature=0, extra_body={"stop_token_ids": [ids[at]]})
    assert reply.choices[0].message.content == expected.text and reply.choices[0].finish_reason == "stop"
    assert reply.usage.completion_tokens == at + 1


def test_the_dflash_authors_benchmark_client_gets_its_template_switch_and_meta_info(server, offline):
    """Exactly the body `python -m dflash.benchmark --backend sglang --reasoning off` sends: its
    chat_template_kwargs reach the chat template, and `meta_info` answers what it reads."""
    from dflash.benchmark import send_openai

    messages = [{"role": "user", "content": PROMPTS[0]}]
    out = send_openai(server.root, messages, model=server.model, max_new_tokens=16, temperature=0.0, top_p=1.0,
                      top_k=0, timeout_s=60, reasoning="off")
    template = offline.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False,
                                                     enable_thinking=False)
    assert template.endswith("<think>\n\n</think>\n\n")  # the switch is in the prompt the model saw
    prompt = offline.tokenizer(template, add_special_tokens=False)["input_ids"]
    expected = offline.generate(prompt, SamplingParams(max_tokens=16))[0]
    assert out["usage"]["prompt_tokens"] == len(prompt)
    assert out["choices"][0]["message"]["content"] == expected.text
    meta = out["meta_info"]
    assert meta["completion_tokens"] == out["usage"]["completion_tokens"] == len(expected.token_ids)
    taus = out["usage"]["acceptance_lengths"]
    assert meta["spec_verify_ct"] == len(taus)
    if taus:
        assert meta["spec_accept_length"] == pytest.approx(sum(taus) / len(taus))


WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "today's weather",
                                           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}


@pytest.mark.parametrize("messages", [
    [{"role": "user", "content": "Weather in Milan?"}],
    [{"role": "user", "content": "Weather in Milan?"},
     {"role": "assistant", "content": None, "tool_calls": [
         {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Milan"}'}}]},
     {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"}],
])
def test_tools_and_a_tool_turn_reach_the_chat_template(server, client, offline, messages):
    """The real server renders the tools a request offers, and a conversation's earlier calls and their
    answers, through --chat-template: the engine sees transformers' own rendering of them (greedy: the
    offline reply to those ids). The tiny random target writes no tool call of its own; parsing one is
    tests/serve/test_front.py's and test_tool_calls.py's."""
    history = [{**m, "content": m["content"] or ""} for m in messages]
    if len(history) > 1:  # templates get a call's arguments as an object
        call = history[1]["tool_calls"][0]["function"]
        history[1] = {**history[1], "tool_calls": [{"id": "call_1", "type": "function", "function": {
            **call, "arguments": json.loads(call["arguments"])}}]}
    rendered = offline.tokenizer.apply_chat_template(history, tools=[WEATHER], add_generation_prompt=True,
                                                     tokenize=False, chat_template=TOOLS_TEMPLATE)
    assert "get_weather" in rendered and (len(messages) == 1 or "sunny, 21 C" in rendered)
    prompt = offline.tokenizer(rendered, add_special_tokens=False)["input_ids"]
    expected = offline.generate(prompt, SamplingParams(max_tokens=12))[0]
    reply = client.chat.completions.create(model=server.model, messages=messages, tools=[WEATHER], max_tokens=12,
                                           temperature=0)
    assert reply.usage.prompt_tokens == len(prompt)
    assert reply.choices[0].message.content == expected.text and not reply.choices[0].message.tool_calls
    assert reply.choices[0].message.reasoning_content is None  # the reasoning parser found no think block


def test_a_named_tool_choice_through_the_real_server_calls_it_with_offline_generate_s_arguments(server, client,
                                                                                              offline):
    """tool_choice naming a function: the engine holds the reply to its parameters' schema (a grammar),
    which comes back as that function's call; its arguments are offline generate's reply under the same
    schema (or, cut by max_tokens before the JSON closed, that reply as content)."""
    messages = [{"role": "user", "content": "Weather in Milan?"}]
    rendered = offline.tokenizer.apply_chat_template(messages, tools=[WEATHER], add_generation_prompt=True,
                                                     tokenize=False, chat_template=TOOLS_TEMPLATE)
    prompt = offline.tokenizer(rendered, add_special_tokens=False)["input_ids"]
    expected = offline.generate(prompt, SamplingParams(max_tokens=40, structured_output={
        "json": WEATHER["function"]["parameters"]}))[0]
    reply = client.chat.completions.create(model=server.model, messages=messages, tools=[WEATHER], max_tokens=40,
                                           temperature=0, tool_choice={"type": "function",
                                                                       "function": {"name": "get_weather"}})
    message = reply.choices[0].message
    if expected.finish_reason == "stop":
        (call,) = message.tool_calls
        assert call.function.name == "get_weather" and json.loads(call.function.arguments) == json.loads(expected.text)
    else:
        assert message.content == expected.text and not message.tool_calls


def test_the_responses_api_gives_the_chat_s_reply_whole_and_streamed(server, client, offline):
    """/v1/responses through the official client runs as the chat it converts to: its text and usage
    are offline generate's (instructions a system turn first), streamed event by event the same."""
    turns = [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": PROMPTS[1]}]
    rendered = offline.tokenizer.apply_chat_template(turns, add_generation_prompt=True, tokenize=False,
                                                     chat_template=TOOLS_TEMPLATE)
    prompt = offline.tokenizer(rendered, add_special_tokens=False)["input_ids"]
    expected = offline.generate(prompt, SamplingParams(max_tokens=20))[0]
    asked = dict(model=server.model, instructions="Answer briefly.", input=PROMPTS[1], max_output_tokens=20,
                 temperature=0)
    response = client.responses.create(**asked)
    assert response.output_text == expected.text
    assert (response.usage.input_tokens, response.usage.output_tokens) == (len(prompt), len(expected.token_ids))
    assert response.status == ("incomplete" if expected.finish_reason == "length" else "completed")
    events = list(client.responses.create(**asked, stream=True))
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == expected.text
    assert events[-1].response.output_text == expected.text
    assert [e.sequence_number for e in events] == list(range(len(events)))
    # logprobs: the chat's (to LOGPROB_TOL), whole and streamed
    chat_reply = client.chat.completions.create(model=server.model, messages=turns, max_tokens=20, temperature=0,
                                                logprobs=True, top_logprobs=2)
    wanted = [(e.token, pytest.approx(e.logprob, abs=LOGPROB_TOL), [(t.token, pytest.approx(t.logprob, abs=LOGPROB_TOL))
                                                            for t in e.top_logprobs])
              for e in chat_reply.choices[0].logprobs.content]
    scored = dict(asked, include=["message.output_text.logprobs"], top_logprobs=2)
    whole = client.responses.create(**scored).output[0].content[0].logprobs
    streamed_entries = [entry for e in client.responses.create(**scored, stream=True)
                        if e.type == "response.output_text.delta" for entry in e.logprobs]
    for entries in (whole, streamed_entries):
        assert [(e.token, e.logprob, [(t.token, t.logprob) for t in e.top_logprobs]) for e in entries] == wanted
    # the stored response continued (its instructions not carried over) = the chat over its turns
    follow = client.responses.create(model=server.model, input=PROMPTS[2], previous_response_id=response.id,
                                     max_output_tokens=12, temperature=0)
    follow_chat = client.chat.completions.create(model=server.model, max_tokens=12, temperature=0, messages=[
        turns[1], {"role": "assistant", "content": response.output_text}, {"role": "user", "content": PROMPTS[2]}])
    assert follow.output_text == follow_chat.choices[0].message.content
    assert client.responses.retrieve(response.id).output_text == expected.text


def test_a_background_response_ends_as_the_foreground_one(server, client):
    """background: the reply is the response queued; followed by GET, it ends as the same request run in
    the foreground (greedy), and can be continued."""
    asked = dict(model=server.model, input=PROMPTS[5], max_output_tokens=12, temperature=0)
    queued = client.responses.create(**asked, background=True)
    assert queued.status == "queued"
    deadline = time.monotonic() + 120
    while (done := client.responses.retrieve(queued.id)).status in ("queued", "in_progress"):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    foreground = client.responses.create(**asked)
    assert (done.status, done.output_text) == (foreground.status, foreground.output_text)
    cancelled_late = client.responses.cancel(queued.id)  # it has ended: back as it is
    assert cancelled_late.status == done.status


def test_anthropic_s_messages_api_gives_the_chat_s_reply_whole_and_streamed(server, client):
    """/v1/messages through the official Anthropic client: the text, stop reason and usage of the chat
    reply to the same turns (system first), streamed the same; a stop sequence that ends it is named."""
    anthropic = pytest.importorskip("anthropic")
    claude = anthropic.Anthropic(base_url=server.root, api_key="none", max_retries=0, timeout=120)
    turns = [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": PROMPTS[3]}]
    chat_reply = client.chat.completions.create(model=server.model, messages=turns, max_tokens=16, temperature=0)
    asked = dict(model=server.model, max_tokens=16, system="Answer briefly.",
                 messages=[{"role": "user", "content": PROMPTS[3]}], extra_body={"temperature": 0})
    message = claude.messages.create(**asked)
    text = chat_reply.choices[0].message.content
    assert [b.text for b in message.content if b.type == "text"] == ([text] if text else [])
    assert message.stop_reason == {"stop": "end_turn", "length": "max_tokens"}[chat_reply.choices[0].finish_reason]
    assert message.usage.input_tokens + message.usage.cache_read_input_tokens == chat_reply.usage.prompt_tokens
    assert message.usage.output_tokens == chat_reply.usage.completion_tokens
    counted = claude.messages.count_tokens(model=server.model, system="Answer briefly.", messages=asked["messages"])
    assert counted.input_tokens == chat_reply.usage.prompt_tokens
    with claude.messages.stream(**asked) as stream:
        assert "".join(stream.text_stream) == text
    if len(text) > 2:  # its third character as a stop sequence ends the reply there, and is named
        stop = text[2]
        stopped = claude.messages.create(**asked, stop_sequences=[stop])
        assert (stopped.stop_reason, stopped.stop_sequence) == ("stop_sequence", stop)
        assert "".join(b.text for b in stopped.content if b.type == "text") == text[:text.index(stop)]


def test_a_responses_function_call_and_its_output_round_trip_as_the_chat_s(server, client):
    """A named tool_choice comes back as a function_call item with the chat's arguments; sent back with its
    output as input items, the next reply is the chat's reply to the same turns."""
    tool = {"type": "function", **WEATHER["function"]}
    question = [{"role": "user", "content": "Weather in Milan?"}]
    forced = {"type": "function", "function": {"name": "get_weather"}}
    chat_reply = client.chat.completions.create(model=server.model, messages=question, tools=[WEATHER],
                                                tool_choice=forced, max_tokens=40, temperature=0)
    response = client.responses.create(model=server.model, input=question, tools=[tool], max_output_tokens=40,
                                       temperature=0, tool_choice={"type": "function", "name": "get_weather"})
    calls = [item for item in response.output if item.type == "function_call"]
    chat_calls = chat_reply.choices[0].message.tool_calls or []
    assert [(c.name, c.arguments) for c in calls] == [(c.function.name, c.function.arguments) for c in chat_calls]
    if not calls:  # cut by max_tokens before its JSON closed: nothing to send back
        return
    answered = client.responses.create(model=server.model, tools=[tool], max_output_tokens=12, temperature=0, input=[
        *question, *[{"type": "function_call", "call_id": c.call_id, "name": c.name, "arguments": c.arguments}
                     for c in calls],
        *[{"type": "function_call_output", "call_id": c.call_id, "output": "sunny"} for c in calls]])
    turns = [*question, {"role": "assistant", "content": "", "tool_calls": [
        {"id": c.call_id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}} for c in calls]},
        *[{"role": "tool", "tool_call_id": c.call_id, "content": "sunny"} for c in calls]]
    chat_answer = client.chat.completions.create(model=server.model, messages=turns, tools=[WEATHER], max_tokens=12,
                                                 temperature=0)
    assert answered.output_text == (chat_answer.choices[0].message.content or "")
    continued = client.responses.create(  # the stored call: only its output is sent
        model=server.model, tools=[tool], max_output_tokens=12, temperature=0, previous_response_id=response.id,
        input=[{"type": "function_call_output", "call_id": c.call_id, "output": "sunny"} for c in calls])
    assert continued.output_text == answered.output_text


CHOICES = ["red", "green", "blue violet"]
SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"], "additionalProperties": False}


@pytest.mark.parametrize("fields, structured", [
    ({"extra_body": {"guided_choice": CHOICES}}, {"choice": CHOICES}),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "r", "schema": SCHEMA}}}, {"json": SCHEMA}),
    ({"extra_body": {"structured_outputs": {"regex": "[a-c]{2,4}!"}}}, {"regex": "[a-c]{2,4}!"}),
    ({"extra_body": {"ebnf": 'root ::= [a-c]{2,4} "!"'}}, {"grammar": 'root ::= [a-c]{2,4} "!"'}),  # SGLang's GBNF
    ({"extra_body": {"guided_json": SCHEMA, "guided_whitespace_pattern": "[ ]?"}},
     {"json": SCHEMA, "whitespace_pattern": "[ ]?"}),
])
def test_structured_output_through_the_real_server_equals_offline(server, client, offline, fields, structured):
    """OpenAI's response_format and vLLM's guided / structured_outputs fields reach the engine's grammar:
    whole and streamed, the reply is offline `generate`'s under the same structured_output."""
    expected = offline.generate(PROMPTS[2], SamplingParams(max_tokens=24, structured_output=structured))[0]
    reply = chat(client, server, PROMPTS[2], max_tokens=24, temperature=0, **fields)
    assert reply.choices[0].message.content == expected.text
    assert streamed(client, server, PROMPTS[2], max_tokens=24, temperature=0, **fields)[0] == expected.text
    if "choice" in structured:
        assert expected.text in CHOICES


def test_a_thinking_budget_through_the_real_server_equals_offline(server, client, offline):
    """vLLM's thinking_token_budget: a prompt that opens a think block; the reply (its first 4 tokens
    thinking, then "</think>" forced) is offline generate's with the same budget."""
    prompt = offline.tokenizer.encode("why? <think>\n", add_special_tokens=False)
    params = SamplingParams(max_tokens=20, thinking_token_budget=4)
    expected = offline.generate([prompt], params)[0]
    assert "</think>" in expected.text
    reply = client.completions.create(model=server.model, prompt=prompt, max_tokens=20, temperature=0,
                                      extra_body={"thinking_token_budget": 4})
    assert reply.choices[0].text == expected.text


def test_sglang_s_generate_gives_offline_generate_s_tokens_and_logprobs(server, offline):
    """SGLang's /generate (no chat template): text, output ids, finish reason and the output's and
    prompt's logprobs are offline generate's on the tokenizer's ids; a batch answers each prompt as alone;
    a stream's last chunk is the whole answer."""
    ids = offline.tokenizer(PROMPTS[8])["input_ids"]
    expected = offline.generate([ids], SamplingParams(max_tokens=10, logprobs=2, prompt_logprobs=2))[0]
    body = {"text": PROMPTS[8], "sampling_params": {"max_new_tokens": 10, "temperature": 0}, "rid": "r",
            "return_logprob": True, "top_logprobs_num": 2, "logprob_start_len": 0, "return_text_in_logprobs": True}
    answer = httpx.post(f"{server.root}/generate", json=body, timeout=60).json()
    assert (answer["text"], answer["output_ids"]) == (expected.text, list(expected.token_ids))
    meta = answer["meta_info"]
    assert (meta["id"], meta["prompt_tokens"], meta["completion_tokens"]) == ("r", len(ids), len(expected.token_ids))
    assert meta["finish_reason"] == {"type": "length", "length": 10}
    for (logprob, token, _), tops, wanted in zip(meta["output_token_logprobs"], meta["output_top_logprobs"],
                                                 expected.logprobs, strict=True):
        assert logprob == pytest.approx(wanted[token], abs=LOGPROB_TOL) and len(tops) == 2
        assert all(entry[0] == pytest.approx(wanted[entry[1]], abs=LOGPROB_TOL) for entry in tops)
    assert [entry[1] for entry in meta["input_token_logprobs"]] == ids
    assert meta["input_token_logprobs"][0][0] is None
    for (logprob, token, _), wanted in zip(meta["input_token_logprobs"][1:], expected.prompt_logprobs[1:],
                                           strict=True):
        assert logprob == pytest.approx(wanted[token], abs=LOGPROB_TOL)
    entries = [*meta["output_token_logprobs"], *meta["input_token_logprobs"],
               *(e for tops in meta["output_top_logprobs"] + meta["input_top_logprobs"][1:] for e in tops)]
    assert all(text == offline.tokenizer.decode([token]) for _, token, text in entries)  # return_text_in_logprobs
    greedy = {"sampling_params": {"max_new_tokens": 8, "temperature": 0}}
    batch = httpx.post(f"{server.root}/generate", json={"text": PROMPTS[8:10], **greedy}, timeout=60).json()
    alone = [httpx.post(f"{server.root}/generate", json={"text": p, **greedy}, timeout=60).json()["text"]
             for p in PROMPTS[8:10]]
    assert [a["text"] for a in batch] == alone
    with httpx.stream("POST", f"{server.root}/generate", json={"text": PROMPTS[8], "stream": True, **greedy},
                      timeout=60) as response:
        events = [line.removeprefix("data: ") for line in response.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]" and json.loads(events[-2])["text"] == alone[0]
    with httpx.stream("POST", f"{server.root}/generate", json={"text": PROMPTS[8:10], "stream": True, **greedy},
                      timeout=60) as response:  # a streamed batch: each answer's chunks by its index
        chunks = [json.loads(line[6:]) for line in response.iter_lines() if line.startswith("data: {")]
    assert [[c["text"] for c in chunks if c["index"] == k][-1] for k in (0, 1)] == alone
    # the budget forces "</think>": the other tokens' logprobs are -inf, which JSON cannot hold: vLLM's floor
    masked = httpx.post(f"{server.root}/generate", timeout=60, json={
        "text": "why? <think>\n", "return_logprob": True, "top_logprobs_num": 3,
        "sampling_params": {"max_new_tokens": 3, "temperature": 0, "thinking_token_budget": 0}})
    assert masked.status_code == 200, masked.text
    tops = [e[0] for position in masked.json()["meta_info"]["output_top_logprobs"] for e in position]
    assert -9999.0 in tops and all(-9999.0 <= v <= 0 for v in tops)
    tiny = httpx.post(f"{server.root}/generate", timeout=60, json={  # overflows float32 logits: refused
        "text": "hi", "sampling_params": {"repetition_penalty": 5e-324}})
    assert tiny.status_code == 400 and tiny.json()["error"]["param"] == "sampling_params.repetition_penalty"
    outside = httpx.post(f"{server.root}/generate", timeout=60, json={
        "text": "hi", "sampling_params": {"logit_bias": {"1000000": 1.0}}})
    assert outside.status_code == 400 and outside.json()["error"]["param"] == "sampling_params.logit_bias"


def test_echo_puts_the_prompt_before_the_same_completion(server, client):
    plain = client.completions.create(model=server.model, prompt=PROMPTS[3], max_tokens=8, temperature=0)
    echoed = client.completions.create(model=server.model, prompt=PROMPTS[3], max_tokens=8, temperature=0, echo=True)
    assert echoed.choices[0].text == PROMPTS[3] + plain.choices[0].text
    assert echoed.usage.completion_tokens == plain.usage.completion_tokens


def test_vllm_text_options_reach_the_engine(server, client, offline):
    """include_stop_str_in_output and skip_special_tokens: the reply is offline generate's with the same
    SamplingParams."""
    ids = offline.tokenizer(PROMPTS[7])["input_ids"]  # a completion's prompt: no chat template
    free = offline.generate(ids, SamplingParams(max_tokens=16))[0].text
    stop = next(ch for ch in free[len(free) // 2:] if ch != "\ufffd")
    for fields in ({"include_stop_str_in_output": True}, {"skip_special_tokens": False}):
        expected = offline.generate(ids, SamplingParams(max_tokens=16, stop=[stop], **fields))[0].text
        reply = client.completions.create(model=server.model, prompt=PROMPTS[7], max_tokens=16, temperature=0,
                                          stop=[stop], extra_body=fields)
        assert reply.choices[0].text == expected
        assert expected.endswith(stop) == ("include_stop_str_in_output" in fields)


def test_allowed_token_ids_and_bad_words_through_the_real_server_equal_offline(server, client, offline):
    """Letters only, then letters but no "a" (whichever the random target favours): offline's replies."""
    ids = offline.tokenizer(PROMPTS[8])["input_ids"]
    letters = offline.tokenizer.convert_tokens_to_ids(list("abcde"))
    texts = []
    for rules in ({"allowed_token_ids": letters}, {"allowed_token_ids": letters, "bad_words": ["a"]}):
        expected = offline.generate(ids, SamplingParams(max_tokens=12, **rules))[0].text
        reply = client.completions.create(model=server.model, prompt=ids, max_tokens=12, temperature=0,
                                          extra_body=rules)
        assert reply.choices[0].text == expected and set(expected) <= set("abcde")
        texts.append(expected)
    assert "a" not in texts[1] and texts[0] != texts[1]


def test_a_continued_final_message_equals_offline_chat(server, client, offline):
    turns = [{"role": "user", "content": PROMPTS[9]}, {"role": "assistant", "content": "Sure: "}]
    expected = offline.chat(turns, SamplingParams(max_tokens=10), add_generation_prompt=False,
                            continue_final_message=True)[0]
    reply = client.chat.completions.create(model=server.model, messages=turns, max_tokens=10, temperature=0,
                                           extra_body={"continue_final_message": True, "add_generation_prompt": False})
    assert reply.choices[0].message.content == expected.text
    assert reply.usage.prompt_tokens == len(expected.prompt_token_ids)
    echoed = client.chat.completions.create(model=server.model, messages=turns, max_tokens=10, temperature=0,
                                            extra_body={"continue_final_message": True, "echo": True,
                                                        "add_generation_prompt": False})
    assert echoed.choices[0].message.content == "Sure: " + expected.text  # vLLM's chat echo


def test_tokenize_and_detokenize_give_the_ids_and_text_the_model_reads(server, client, offline):
    """vLLM's /tokenize: a prompt's ids (the tokenizer's), a chat's as the chat template renders them
    (what a chat request's usage counts); /detokenize: ids back to their text."""
    turns = [{"role": "user", "content": PROMPTS[4]}]
    tokenized = httpx.post(f"{server.root}/tokenize", json={"model": server.model, "messages": turns},
                           timeout=30).json()
    rendered = offline.tokenizer.apply_chat_template(turns, add_generation_prompt=True, tokenize=False,
                                                     chat_template=TOOLS_TEMPLATE)
    ids = offline.tokenizer(rendered, add_special_tokens=False)["input_ids"]
    assert tokenized == {"count": len(ids), "max_model_len": CAPACITY, "tokens": ids, "token_strs": None}
    assert chat(client, server, PROMPTS[4], max_tokens=2, temperature=0).usage.prompt_tokens == len(ids)
    text = httpx.post(f"{server.root}/tokenize", json={"prompt": "hello there"}, timeout=30).json()
    assert text["tokens"] == offline.tokenizer("hello there")["input_ids"]
    back = httpx.post(f"{server.root}/detokenize", json={"tokens": ids}, timeout=30).json()
    assert back == {"prompt": offline.tokenizer.decode(ids, skip_special_tokens=False)}
    outside = httpx.post(f"{server.root}/detokenize", json={"tokens": [1, 10**6]}, timeout=30)
    assert outside.status_code == 400 and outside.json()["error"]["param"] == "tokens"


RAG_TEMPLATE = ("{% for d in documents %}[{{ d.title }}] {{ d.text }}\n{% endfor %}"
                "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}assistant:")


def test_a_request_s_template_and_documents_render_its_prompt_as_offline_chat(server, client, offline):
    """vLLM's chat_template (the server trusts requests' templates) and documents: the reply, its prompt
    tokens and /tokenize's ids are offline `LLM.chat`'s with the same template and documents."""
    turns = [{"role": "user", "content": PROMPTS[6]}]
    docs = [{"title": "A", "text": "alpha"}, {"title": "B", "text": "beta"}]
    expected = offline.chat(turns, SamplingParams(max_tokens=10), chat_template=RAG_TEMPLATE, documents=docs)[0]
    reply = client.chat.completions.create(model=server.model, messages=turns, max_tokens=10, temperature=0,
                                           extra_body={"chat_template": RAG_TEMPLATE, "documents": docs})
    assert reply.choices[0].message.content == expected.text
    assert reply.usage.prompt_tokens == len(expected.prompt_token_ids)
    tokenized = httpx.post(f"{server.root}/tokenize", timeout=30, json={
        "messages": turns, "chat_template": RAG_TEMPLATE, "documents": docs}).json()
    assert tokenized["tokens"] == list(expected.prompt_token_ids)
    refused = httpx.post(f"{server.url}/chat/completions", timeout=30, json={
        "model": server.model, "messages": turns, "documents": docs})  # the server's template cites none
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "documents"


def test_reasoning_effort_reaches_a_template_that_reads_it(server, client, offline):
    """OpenAI's reasoning_effort is a variable of the chat template (a request's own here): the reply is
    offline chat's with it among chat_template_kwargs; the server's template reads none: a 400 naming it."""
    template = ("effort: {{ reasoning_effort }}\n{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
                "assistant:")
    turns = [{"role": "user", "content": PROMPTS[9]}]
    expected = offline.chat(turns, SamplingParams(max_tokens=8), chat_template=template,
                            chat_template_kwargs={"reasoning_effort": "low"})[0]
    reply = client.chat.completions.create(model=server.model, messages=turns, max_tokens=8, temperature=0,
                                           reasoning_effort="low", extra_body={"chat_template": template})
    assert reply.choices[0].message.content == expected.text
    assert reply.usage.prompt_tokens == len(expected.prompt_token_ids)
    refused = httpx.post(f"{server.url}/chat/completions", timeout=30, json={
        "model": server.model, "messages": turns, "reasoning_effort": "low"})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "reasoning_effort"


def test_completion_of_token_ids_equals_offline(server, client, offline):
    ids = offline.tokenizer("plain text, no template")["input_ids"]
    expected = offline.generate(ids, SamplingParams(max_tokens=12))[0]
    reply = client.completions.create(model=server.model, prompt=ids, max_tokens=12, temperature=0)
    assert reply.choices[0].text == expected.text and reply.usage.completion_tokens == len(expected.token_ids)
    asked = client.completions.create(model=server.model, prompt=ids, max_tokens=12, temperature=0,
                                      extra_body={"return_token_ids": True}).choices[0]
    assert asked.prompt_token_ids == ids and asked.token_ids == expected.token_ids  # vLLM's return_token_ids
    streamed_ids, prompt_ids = [], None
    for chunk in client.completions.create(model=server.model, prompt=ids, max_tokens=12, temperature=0, stream=True,
                                           extra_body={"return_token_ids": True}):
        choice = chunk.choices[0].model_extra
        prompt_ids = prompt_ids or choice.get("prompt_token_ids")
        streamed_ids += choice.get("token_ids") or []
    assert prompt_ids == ids and streamed_ids == expected.token_ids


def test_logprobs_equal_offline(server, client, offline):
    """OpenAI's chat and legacy completion logprobs: each token's and the top ones' log-probability, the
    values LLM.generate gives (the target's raw logits), whole and streamed."""
    expected = offline.generate(PROMPTS[1], SamplingParams(max_tokens=10, logprobs=2))[0]
    text = offline.tokenizer.decode
    want = [(text([t]), e[t], sorted(e.items(), key=lambda x: -x[1])[:2])
            for t, e in zip(expected.token_ids, expected.logprobs, strict=True)]
    reply = chat(client, server, PROMPTS[1], max_tokens=10, temperature=0, logprobs=True, top_logprobs=2)
    content = reply.choices[0].logprobs.content
    assert [(c.token, c.bytes) for c in content] == [(w[0], list(w[0].encode())) for w in want]
    for c, (_, logprob, tops) in zip(content, want, strict=True):
        assert c.logprob == pytest.approx(logprob, abs=LOGPROB_TOL)
        assert [(top.token, top.logprob) for top in c.top_logprobs] == [(text([t]), pytest.approx(v, abs=LOGPROB_TOL))
                                                                          for t, v in tops]
    # vLLM's return_tokens_as_token_ids: every token named by its id, the top ones' too
    by_id = chat(client, server, PROMPTS[1], max_tokens=10, temperature=0, logprobs=True, top_logprobs=2,
                 extra_body={"return_tokens_as_token_ids": True}).choices[0].logprobs.content
    assert [(c.token, [top.token for top in c.top_logprobs]) for c in by_id] == [
        (f"token_id:{t}", [f"token_id:{u}" for u, _ in sorted(e.items(), key=lambda x: -x[1])[:2]])
        for t, e in zip(expected.token_ids, expected.logprobs, strict=True)]
    streamed_tokens = [c.token for chunk in chat(client, server, PROMPTS[1], max_tokens=10, temperature=0,
                                                 logprobs=True, stream=True)
                       for choice in chunk.choices if choice.logprobs for c in choice.logprobs.content]
    assert streamed_tokens == [w[0] for w in want]
    assert chat(client, server, PROMPTS[1], max_tokens=4).choices[0].logprobs is None  # not asked, not sent
    legacy = client.completions.create(model=server.model, prompt=PROMPTS[1], max_tokens=6, temperature=0,
                                       logprobs=1).choices[0].logprobs
    assert legacy.tokens == [text([t]) for t in legacy_ids(offline, PROMPTS[1], 6)]
    assert legacy.text_offset == [sum(len(t) for t in legacy.tokens[:k]) for k in range(len(legacy.tokens))]
    assert all(len(top) == 1 for top in legacy.top_logprobs) and all(lp <= 0 for lp in legacy.token_logprobs)


def test_echoed_prompts_with_logprobs_equal_offline_prompt_logprobs(server, client, offline):
    """What lm-evaluation-harness sends to score continuations: several token-id prompts, echo,
    logprobs, one token. Each choice's text is its decoded prompt + offline's reply, and its logprobs
    begin with the prompt's tokens, their values those LLM.generate's prompt_logprobs gives; vLLM's
    prompt_logprobs field carries the same."""
    prompts = [offline.tokenizer(p)["input_ids"] for p in PROMPTS[4:6]]
    expected = offline.generate(prompts, SamplingParams(max_tokens=1, prompt_logprobs=2))
    text = offline.tokenizer.decode
    reply = client.completions.create(model=server.model, prompt=prompts, echo=True, logprobs=2, max_tokens=1,
                                      temperature=0, extra_body={"prompt_logprobs": 1})
    assert [c.index for c in reply.choices] == [0, 1]
    assert reply.usage.prompt_tokens == sum(map(len, prompts))
    for choice, ids, want in zip(reply.choices, prompts, expected, strict=True):
        assert choice.text == text(ids) + want.text
        logprobs = choice.logprobs
        assert logprobs.tokens[:len(ids)] == [text([t]) for t in ids]
        assert logprobs.token_logprobs[0] is None and logprobs.top_logprobs[0] is None
        for j in range(1, len(ids)):
            assert logprobs.token_logprobs[j] == pytest.approx(want.prompt_logprobs[j][ids[j]], abs=LOGPROB_TOL)
            tops = sorted(want.prompt_logprobs[j].items(), key=lambda e: -e[1])[:2]
            assert logprobs.top_logprobs[j] == {text([t]): pytest.approx(v, abs=LOGPROB_TOL) for t, v in tops}
        assert len(logprobs.tokens) == len(ids) + 1  # then the reply's one token
        vllm = choice.prompt_logprobs  # vLLM's extension field
        assert vllm[0] is None and [float(next(iter(e.values()))["logprob"]) for e in vllm[1:]] == [
            pytest.approx(want.prompt_logprobs[j][ids[j]], abs=LOGPROB_TOL) for j in range(1, len(ids))]


def legacy_ids(offline, prompt, max_tokens):
    ids = offline.tokenizer(prompt)["input_ids"]
    return offline.generate(ids, SamplingParams(max_tokens=max_tokens))[0].token_ids


def test_streamed_equals_whole(server, client):
    for prompt in PROMPTS[:4]:
        for kwargs in ({"temperature": 0}, {"temperature": 0.8, "top_p": 0.9, "seed": 7, "extra_body": {"top_k": 20}},
                       {"temperature": 0, "stop": ["a", "e"]}):
            whole = chat(client, server, prompt, max_tokens=20, **kwargs)
            text, usage, reason = streamed(client, server, prompt, max_tokens=20, **kwargs)
            assert text == whole.choices[0].message.content and reason == whole.choices[0].finish_reason
            assert usage.completion_tokens == whole.usage.completion_tokens
    # vLLM's continuous usage: every chunk counts the reply so far, up to the whole reply's usage
    whole = chat(client, server, PROMPTS[0], max_tokens=20, temperature=0)
    chunks = list(chat(client, server, PROMPTS[0], max_tokens=20, temperature=0, stream=True,
                       stream_options={"include_usage": True, "continuous_usage_stats": True}))
    counts = [(c.usage.prompt_tokens, c.usage.completion_tokens) for c in chunks]
    assert counts == sorted(counts) and counts[-1] == (whole.usage.prompt_tokens, whole.usage.completion_tokens)


def test_beam_search_equals_offline_beam_search(server, client, offline):
    """vLLM's use_beam_search (n its width) runs LLM.beam_search's search in the Triton model: the same
    sequences, best first, whole and streamed; a chat's the same over its rendered prompt."""
    from dflash_trt import BeamSearchParams

    ids = offline.tokenizer(PROMPTS[2])["input_ids"]
    want = offline.beam_search([ids], BeamSearchParams(beam_width=3, max_tokens=8))[0].sequences
    asked = dict(model=server.model, prompt=ids, n=3, max_tokens=8, temperature=0,
                 extra_body={"use_beam_search": True, "return_token_ids": True})
    reply = client.completions.create(**asked)
    assert [(c.model_extra["token_ids"], c.text, c.finish_reason) for c in reply.choices] == [
        (s.tokens[len(ids):], s.text, s.finish_reason) for s in want]
    streamed = ["", "", ""]
    for chunk in client.completions.create(**asked, stream=True):
        for choice in chunk.choices:
            streamed[choice.index] += choice.text
    assert streamed == [s.text for s in want]
    turns = [{"role": "user", "content": PROMPTS[5]}]
    rendered = offline.tokenizer.apply_chat_template(turns, add_generation_prompt=True, tokenize=False,
                                                     chat_template=TOOLS_TEMPLATE)
    prompt = offline.tokenizer(rendered, add_special_tokens=False)["input_ids"]
    chat_want = offline.beam_search([prompt], BeamSearchParams(beam_width=2, max_tokens=6))[0].sequences
    chat_reply = client.chat.completions.create(model=server.model, messages=turns, n=2, max_tokens=6,
                                                extra_body={"use_beam_search": True})
    assert [c.message.content for c in chat_reply.choices] == [s.text for s in chat_want]


def test_concurrent_streams_equal_sequential_replies(server, client):
    prompts = [f"{p} {i}" for i in range(4) for p in PROMPTS]  # 64 clients at once
    sequential = [chat(client, server, p, max_tokens=16, temperature=0).choices[0].message.content for p in prompts]
    with ThreadPoolExecutor(len(prompts)) as pool:
        concurrent = list(pool.map(lambda p: streamed(client, server, p, max_tokens=16, temperature=0), prompts))
    assert [text for text, _, _ in concurrent] == sequential
    assert all(reason in ("stop", "length") for _, _, reason in concurrent)


def test_a_higher_priority_request_preempts_a_running_stream_and_every_reply_equals_offline(server, client,
                                                                                              offline):
    """Four streams of priority 5 hold the four slots; a request of priority -1 preempts one of them
    (the one that came last), which later prefills what it had again and goes on: its text and every
    other reply equal offline generate's."""
    before = samples(server)
    low = SamplingParams(max_tokens=300, ignore_eos=True)
    prompts = [f"a long story {i}" for i in range(4)]
    started = [threading.Event() for _ in prompts]

    def stream(i):
        pieces = []
        for chunk in chat(client, server, prompts[i], stream=True, max_tokens=300, temperature=0,
                          extra_body={"ignore_eos": True, "priority": 5}):
            pieces += [choice.delta.content or "" for choice in chunk.choices]
            started[i].set()
        return "".join(pieces)

    with ThreadPoolExecutor(len(prompts)) as pool:
        streams = [pool.submit(stream, i) for i in range(len(prompts))]
        assert all(event.wait(60) for event in started)
        urgent = chat(client, server, PROMPTS[0], max_tokens=24, temperature=0, extra_body={"priority": -1})
        texts = [s.result(timeout=300) for s in streams]
    assert urgent.choices[0].message.content == offline.generate(PROMPTS[0], SamplingParams(max_tokens=24))[0].text
    assert texts == [o.text for o in offline.generate(prompts, low)]
    assert metric(samples(server), "vllm:num_preemptions_total") - metric(before, "vllm:num_preemptions_total") == 1


@pytest.mark.parametrize("body, status, param", [
    (b"{not json", 400, None),
    ({"model": "nope", "messages": [{"role": "user", "content": "x"}]}, 404, "model"),
    ({"model": "MODEL", "messages": [{"role": "user", "content": "x" * 1100}]}, 400, "messages"),
    ({"model": "MODEL", "messages": [{"role": "user", "content": "x"}], "max_tokens": 10_000}, 400, "max_tokens"),
    ({"model": "MODEL", "messages": [{"role": "user", "content": "x"}], "top_p": 0}, 400, "top_p"),
    ({"model": "MODEL", "messages": [{"role": "user", "content": "x"}], "n": 65}, 400, "n"),
    ({"model": "MODEL", "messages": [{"role": "user", "content": "x"}], "temperature": -1}, 400, "temperature"),
    ({"model": "MODEL", "messages": "x"}, 400, "messages"),
    ({"model": "MODEL", "prompt": [10**9]}, 400, "prompt"),  # a token id outside the vocabulary
    ({"model": "MODEL", "messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}, 400, "top_logprobs"),
    ({"model": "MODEL", "messages": [{"role": "user", "content": "x"}], "logprobs": True, "top_logprobs": 21}, 400,
     "top_logprobs"),
    ({"model": "MODEL", "prompt": "x", "logprobs": -1}, 400, "logprobs"),
])
def test_bad_requests_get_4xx_errors(server, body, status, param):
    path = "/completions" if isinstance(body, dict) and "prompt" in body else "/chat/completions"
    if isinstance(body, dict):
        body = json.dumps(body).replace('"MODEL"', json.dumps(server.model)).encode()
    for stream in (False, True):
        sent = body if not stream or body.startswith(b"{not") else body[:-1] + b', "stream": true}'
        response = httpx.post(server.url + path, content=sent, headers={"content-type": "application/json"}, timeout=30)
        assert response.status_code == status, response.text
        assert response.json()["error"]["param"] == param
    assert httpx.get(f"{server.root}/health", timeout=10).status_code == 200


@pytest.mark.filterwarnings("ignore")
def test_schemathesis_finds_no_5xx_or_undocumented_reply_on_the_real_server(server):
    """Bounded: a dozen generated requests per operation and mode (most refused: the model name is
    random); it replaces a hand-written body generator."""
    schemathesis = pytest.importorskip("schemathesis")  # a test dependency (.[test]); the GPU image lacks it
    from hypothesis import HealthCheck, given, settings

    from schemathesis import GenerationMode

    schema = schemathesis.openapi.from_url(f"{server.root}/openapi.json")
    for found in schema.get_all_operations():
        operation = found.ok()
        # bodies the schema allows, and (where there is a body) ones it does not
        modes = [GenerationMode.POSITIVE] + [GenerationMode.NEGATIVE] * bool(operation.body)
        for mode in modes:
            positive = mode == GenerationMode.POSITIVE

            @given(case=operation.as_strategy(mode))
            @settings(max_examples=12, deadline=None, database=None, suppress_health_check=list(HealthCheck))
            def check(case):
                if positive:
                    case.body = acceptable(case.body, case.operation.path)
                case.call_and_validate(timeout=60)

            check()


def test_the_real_server_is_healthy_after_schema_fuzzing(server):
    assert httpx.get(f"{server.root}/health", timeout=10).json() == {"status": "ready"}


def test_the_served_model_name_is_what_clients_list_and_retrieve(server, client):
    assert [m.id for m in client.models.list().data] == [SERVED]
    assert client.models.retrieve(SERVED).id == SERVED
    assert client.models.retrieve(SERVED).model_extra["max_model_len"] == CAPACITY  # vLLM's field


def test_num_speculative_tokens_caps_a_requests_drafts_and_keeps_its_reply(server, client):
    """Speculation per request: at most k drafts a step (0: plain decoding), the reply the same. (Whether a
    step drafts at all is the adaptive policy's choice here, from measured costs: that the cap binds is
    test_speculation_per_request.py's, on a fixed block.)"""
    asked = dict(model=server.model, prompt="count me", max_tokens=24, temperature=0)
    default = client.completions.create(**asked)
    capped = {k: client.completions.create(**asked, extra_body={"num_speculative_tokens": k}) for k in (0, 1)}
    assert {reply.choices[0].text for reply in capped.values()} == {default.choices[0].text}
    assert capped[0].usage.model_extra["acceptance_lengths"] == []
    assert all(tau <= 2 for tau in capped[1].usage.model_extra["acceptance_lengths"])
    refused = httpx.post(f"{server.url}/completions", json={**asked, "num_speculative_tokens": -1}, timeout=60)
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "num_speculative_tokens"


def test_a_request_s_id_is_on_its_reply_and_in_the_log(server):
    """--enable-request-id-headers and --enable-log-requests (--max-log-len 40), as vLLM's; at
    --uvicorn-log-level info, the HTTP server's status line of each request too."""
    body = {"model": server.model, "prompt": PROMPTS[0], "max_tokens": 4, "temperature": 0}
    reply = httpx.post(f"{server.url}/completions", json=body, headers={"X-Request-Id": "e2e-7"}, timeout=60)
    assert reply.headers["x-request-id"] == "e2e-7" and reply.json()["id"] == "cmpl-e2e-7"
    deadline = time.monotonic() + 5  # said before the request ran; the test's reader thread may lag
    while not (said := [line for line in server.output if line.startswith("Received request cmpl-e2e-7: ")]):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    (said,) = said
    head, params = said.split(", params: ")
    assert head == f"Received request cmpl-e2e-7: prompt: {PROMPTS[0][:40]!r}"
    assert json.loads(params)["max_tokens"] == 4 and json.loads(params)["temperature"] == 0
    assert any('"POST /v1/completions HTTP/1.1" 200' in line for line in server.output)


def test_the_log_has_vllms_stats_lines_while_requests_run(server, client):
    """Each second with work (--log-stats-interval 1): throughput, requests, KV cache and prefix cache hits,
    then, for an interval with drafts (the adaptive policy's choice), speculative decoding's acceptance
    (stats_log.py's figures are checked in test_stats_log.py)."""
    throughput = re.compile(r"Avg prompt throughput: [\d.]+ tokens/s, Avg generation throughput: ([\d.]+) tokens/s, "
                            r"Running: \d+ reqs, Waiting: \d+ reqs, KV cache usage: [\d.]+%, Prefix cache hit rate: "
                            r"[\d.]+%$")
    speculation = re.compile(r"SpecDecoding metrics: Mean acceptance length: [\d.]+, Accepted throughput: [\d.]+ "
                             r"tokens/s, Drafted throughput: [\d.]+ tokens/s, Accepted: \d+ tokens, Drafted: \d+ "
                             r"tokens, Per-position acceptance rate: [\d., ]+, Avg Draft acceptance rate: [\d.]+%$")
    start = len(server.output)
    client.completions.create(model=server.model, prompt="count me", max_tokens=10, temperature=0)
    deadline = time.monotonic() + 10
    while not any((m := throughput.match(line)) and float(m[1]) > 0 for line in server.output[start:]):
        assert time.monotonic() < deadline, server.output[start:]
        time.sleep(0.1)
    said = server.output[start:]
    assert all(speculation.match(line) for line in said if line.startswith("SpecDecoding metrics: ")), said


def test_metrics_move_by_a_requests_amounts(server, client):
    before = samples(server)
    reply = client.completions.create(model=server.model, prompt="count me", max_tokens=10, temperature=0)
    after = samples(server)
    usage = reply.usage.model_extra
    taus = usage["acceptance_lengths"]

    def moved(name, **labels):
        return metric(after, name, **labels) - metric(before, name, **labels)

    assert moved("vllm:prompt_tokens_total") == reply.usage.prompt_tokens
    assert moved("vllm:generation_tokens_total") == reply.usage.completion_tokens
    assert moved("vllm:spec_decode_num_drafts_total") == len(taus)
    assert moved("vllm:spec_decode_num_accepted_tokens_total") == sum(t - 1 for t in taus)
    assert moved("vllm:request_success_total", finished_reason=reply.choices[0].finish_reason) == 1
    assert moved("vllm:e2e_request_latency_seconds_count") == 1
    assert moved("vllm:time_to_first_token_seconds_count") == 1
    for phase in ("queue", "prefill", "decode", "inference"):  # vLLM's request phases
        assert moved(f"vllm:request_{phase}_time_seconds_count") == 1
    assert 0 <= after[("vllm:kv_cache_usage_perc", ())] <= 1
    # its inter-token latencies, one per step after its first (the poller observes them within ~50 ms)
    deadline = time.monotonic() + 10
    while moved("vllm:inter_token_latency_seconds_count") < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
        after = samples(server)
    assert moved("vllm:inter_token_latency_seconds_count") >= 2  # (an earlier test's may come in this window)


def test_a_repeated_prompt_reuses_a_finished_requests_slot(server, client):
    """The same prompt again: a slot that held it serves it, all but its last token reused (the
    first output comes from prefilling one), reported as OpenAI's cached_tokens and in vLLM's counters."""
    prompt = "the same words twice, the same words twice"
    first = client.completions.create(model=server.model, prompt=prompt, max_tokens=6, temperature=0)
    before = samples(server)
    again = client.completions.create(model=server.model, prompt=prompt, max_tokens=6, temperature=0)
    after = samples(server)
    assert again.choices[0].text == first.choices[0].text
    cached = again.usage.prompt_tokens_details.cached_tokens
    assert cached == again.usage.prompt_tokens - 1
    assert metric(after, "vllm:prefix_cache_hits_total") - metric(before, "vllm:prefix_cache_hits_total") == cached
    assert (metric(after, "vllm:prefix_cache_queries_total") - metric(before, "vllm:prefix_cache_queries_total")
            == again.usage.prompt_tokens)


def test_a_prefix_cache_reset_makes_a_repeated_prompt_prefill_whole(server, client):
    """vLLM's /reset_prefix_cache and SGLang's /flush_cache: after either, the prompt a finished request
    held is prefilled again, and its reply is the same."""
    prompt = "reset words, reset words, reset words"
    for path in ("/reset_prefix_cache", "/flush_cache"):
        first = client.completions.create(model=server.model, prompt=prompt, max_tokens=4, temperature=0)
        assert httpx.post(f"{server.root}{path}", timeout=30).status_code == 200
        again = client.completions.create(model=server.model, prompt=prompt, max_tokens=4, temperature=0)
        assert again.usage.prompt_tokens_details.cached_tokens == 0
        assert again.choices[0].text == first.choices[0].text


def test_a_cache_salt_keeps_a_prompt_from_another_salt_s_cached_positions(server, client):
    """vLLM's cache_salt: the same prompt again under another salt prefills all of it; under its own
    salt again, all but its last token; the reply is the same each time."""
    prompt = "salted words, salted words, salted words"
    replies = [client.completions.create(model=server.model, prompt=prompt, max_tokens=4, temperature=0,
                                         extra_body={} if salt is None else {"cache_salt": salt})
               for salt in (None, "tenant-a", "tenant-a")]
    cached = [r.usage.prompt_tokens_details.cached_tokens for r in replies]
    assert cached[1] == 0 and cached[2] == replies[2].usage.prompt_tokens - 1
    assert len({r.choices[0].text for r in replies}) == 1


def test_disconnects_free_every_slot(server, client):
    before = samples(server)
    count = 200

    def leave_early(prompt, n=1):
        body = {"model": server.model, "messages": [{"role": "user", "content": prompt}], "max_tokens": 200,
                "temperature": 0, "stream": True, "n": n}  # greedy: no early EOS before the client leaves
        with httpx.stream("POST", f"{server.url}/chat/completions", json=body, timeout=60) as response:
            for line in response.iter_lines():
                if line.startswith("data: "):
                    return  # closing the connection after the first event

    with ThreadPoolExecutor(32) as pool:
        list(pool.map(leave_early, [PROMPTS[i % len(PROMPTS)] for i in range(count - 15)]))
    # and requests of 3 choices, streamed side by side, one at a time (each choice gets a slot at once: a
    # choice queued behind others would hold the stream's start back while the first one could finish):
    # each of the 15 choices is cancelled
    for prompt in PROMPTS[:5]:
        leave_early(prompt, n=3)
    deadline = time.monotonic() + 30
    while True:
        now = samples(server)
        finished = sum(v - metric(before, n, **dict(labels)) for (n, labels), v in now.items()
                       if n == "vllm:request_success_total")
        if finished == count and metric(now, "vllm:num_requests_running") == 0 \
                and metric(now, "vllm:num_requests_waiting") == 0:
            break
        assert time.monotonic() < deadline, f"{finished} of {count} finished; running/waiting not 0"
        time.sleep(0.2)
    aborted = metric(now, "vllm:request_success_total", finished_reason="abort") - \
        metric(before, "vllm:request_success_total", finished_reason="abort")
    assert aborted == count
    # the slots serve again
    assert chat(client, server, "still there?", max_tokens=4).choices[0].finish_reason in ("stop", "length")


def wait_for_aborts(server, before: dict, count: int) -> None:
    """Wait (30 s at most) until `count` more requests than `before` counted finished "abort" and nothing
    runs."""
    deadline = time.monotonic() + 30
    while True:
        now = samples(server)
        aborted = metric(now, "vllm:request_success_total", finished_reason="abort") - \
            metric(before, "vllm:request_success_total", finished_reason="abort")
        if aborted == count and metric(now, "vllm:num_requests_running") == 0:
            break
        assert time.monotonic() < deadline, f"{aborted} of {count} requests cancelled"
        time.sleep(0.2)


def leave_and_wait_for_abort(server, path: str, body: dict) -> None:
    """Send a non-streaming request and leave after 0.5 s; then wait until it counts as one aborted
    request and nothing runs."""
    before = samples(server)
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{server.url}{path}", json=body, timeout=httpx.Timeout(60, read=0.5))
    wait_for_aborts(server, before, 1)


def test_a_non_streaming_client_that_leaves_is_cancelled(server):
    # no end of sequence can finish it before the client leaves (the server samples at T=1 by default)
    leave_and_wait_for_abort(server, "/chat/completions", {"model": server.model, "max_tokens": 900,
                                                           "ignore_eos": True,
                                                           "messages": [{"role": "user", "content": "long answer"}]})


def test_a_streamed_sglang_batch_whose_client_leaves_cancels_every_answer(server):
    before = samples(server)
    body = {"text": PROMPTS[:2], "stream": True, "sampling_params": {"max_new_tokens": 900, "n": 2,
                                                                     "ignore_eos": True}}
    with httpx.stream("POST", f"{server.root}/generate", json=body, timeout=60) as response:
        next(line for line in response.iter_lines() if line.startswith("data: {"))  # then leave
    wait_for_aborts(server, before, 4)


def test_a_beam_search_whose_client_leaves_stops_between_steps(server):
    """Its steps' requests end, nothing more is started for it, and it counts as one aborted request."""
    # 8 beams for up to 1,000 steps: seconds of work here, far more than the client waits
    leave_and_wait_for_abort(server, "/completions", {"model": server.model, "prompt": [5, 6, 7],
                                                      "max_tokens": CAPACITY - 24, "n": 8, "use_beam_search": True,
                                                      "ignore_eos": True})
    for _ in range(10):  # a search still going would hold its beams' requests nearly all the time
        assert metric(samples(server), "vllm:num_requests_running") == 0
        time.sleep(0.1)


def test_sigterm_drains_then_stops_both_processes(server):
    body = {"model": server.model, "messages": [{"role": "user", "content": "last one"}], "max_tokens": 300,
            "stream": True}
    children = server.children()
    assert children, "tritonserver is not a child of serve"
    events = []
    with httpx.stream("POST", f"{server.url}/chat/completions", json=body, timeout=60) as response:
        for line in response.iter_lines():
            if line.startswith("data: "):
                events.append(line)
                if len(events) == 1:
                    server.process.send_signal(15)  # SIGTERM while this request is in flight
    assert events[-1] == "data: [DONE]"  # drained: the in-flight request finished
    assert json.loads(events[-2][6:])["choices"][0]["finish_reason"] in ("stop", "length")
    assert server.stop() == 0
    for pid in children:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)

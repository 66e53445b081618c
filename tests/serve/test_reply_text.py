"""A chat reply's text -> reasoning, content and tool calls (serve/reply_text.py, tool_calls.py): both
call formats, what stays text, the think block, and a stream's pieces adding up to the whole reply
wherever the text is cut."""

import json

import pytest

from dflash_trt.serve.reply_text import Delta, ReplyText
from dflash_trt.serve.tool_calls import detect_parser, split

WEATHER = {"name": "get_weather", "parameters": {"type": "object", "properties": {
    "city": {"type": "string"}, "days": {"type": "integer"}, "metric": {"type": "boolean"},
    "hours": {"type": "array"}, "scale": {"type": "number"}, "note": {"type": ["null", "string"]}}}}
TIME = {"name": "get_time", "parameters": {"type": "object", "properties": {}}}
TOOLS = {"get_weather": WEATHER, "get_time": TIME}


def calls(found):
    return [(call.name, json.loads(call.arguments)) for call in found]


HERMES = ('Let me check.\n\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Milan", "days": 2}}\n'
          '</tool_call>\n<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>')
CODER = ("I will look it up.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nSão Paulo\n</parameter>\n"
         "<parameter=days>\n3\n</parameter>\n<parameter=metric>\nTrue\n</parameter>\n<parameter=hours>\n[1, 2]\n"
         "</parameter>\n<parameter=scale>\n1.5\n</parameter>\n<parameter=note>\nnull\n</parameter>\n"
         "<parameter=extra>\n two\nlines \n</parameter>\n</function>\n</tool_call>")


def test_hermes_calls_and_the_content_before_them():
    content, found = split(HERMES, "hermes", TOOLS, final=True)
    assert content == "Let me check."
    assert calls(found) == [("get_weather", {"city": "Milan", "days": 2}), ("get_time", {})]
    assert len({call.id for call in found}) == 2 and found[0].id.startswith("call_")


def test_qwen3_coder_values_take_their_schema_types():
    content, found = split(CODER, "qwen3_coder", TOOLS, final=True)
    assert content == "I will look it up."
    assert calls(found) == [("get_weather", {"city": "São Paulo", "days": 3, "metric": True, "hours": [1, 2],
                                             "scale": 1.5, "note": None, "extra": " two\nlines "})]
    assert "São" in found[0].arguments  # JSON text as the model wrote it, not \\u-escaped


@pytest.mark.parametrize("parser, text", [
    ("hermes", '<tool_call>\n{"name": "get_weather", "arguments": {"city": \n</tool_call>'),  # not JSON
    ("hermes", '<tool_call>\n{"name": "launch_rockets", "arguments": {}}\n</tool_call>'),  # not offered
    ("hermes", '<tool_call>\n{"name": "get_time", "arguments": "now"}\n</tool_call>'),  # arguments not an object
    ("qwen3_coder", "<tool_call>\n<function=get_weather>\n<parameter=city>\nMilan\n</parameter>\n</tool_call>"),
    ("qwen3_coder", "<tool_call>\n<function=get_weather>\nMilan\n</function>\n</tool_call>"),  # text, no parameter
    ("qwen3_coder", "<tool_call>\n<function=rm_rf>\n</function>\n</tool_call>"),
])
def test_a_block_that_does_not_parse_stays_text(parser, text):
    reply = f"Sure. {text} Done."
    assert split(reply, parser, TOOLS, final=True) == (reply, [])


def test_an_unclosed_block_is_text_once_the_reply_ends_and_held_back_before():
    text = 'Hi <tool_call>\n{"name": "get_time", "arg'
    assert split(text, "hermes", TOOLS, final=False) == ("Hi", [])
    assert split(text, "hermes", TOOLS, final=True) == (text, [])


def test_text_between_and_after_calls_is_content_without_the_whitespace_next_to_them():
    text = ('A <tool_call>{"name": "get_time"}</tool_call>\n B \n<tool_call>{"name": "get_time"}</tool_call>\n\n'
            ' C ')
    content, found = split(text, "hermes", TOOLS, final=True)
    assert (content, calls(found)) == ("ABC ", [("get_time", {}), ("get_time", {})])


LLAMA = '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Milan", "days": 2}}; {"name": "get_time"}'


@pytest.mark.parametrize("text, content, found", [
    (LLAMA, "", [("get_weather", {"city": "Milan", "days": 2}), ("get_time", {})]),
    ('\n{"name": "get_time", "arguments": {}}', "", [("get_time", {})]),
    ('{"name": "get_time"} and more', '{"name": "get_time"} and more', []),  # not calls alone: content
    ('{"name": "launch", "parameters": {}}', '{"name": "launch", "parameters": {}}', []),  # not offered
    ("It is sunny.", "It is sunny.", []),
])
def test_llama3_json_replies_are_calls_or_content(text, content, found):
    got, calls_found = split(text, "llama3_json", TOOLS, final=True)
    assert (got, calls(calls_found)) == (content, found)


@pytest.mark.parametrize("parser, text", [
    ("hermes", HERMES),
    ("qwen3_coder", CODER),
    ("llama3_json", LLAMA),
    ("llama3_json", "<|py no tag, just text"),
    ("llama3_json", '  {"name": "get_time"} trailing'),
    ("hermes", 'x <tool_call>{"name": "nope"}</tool_call> y <tool_call>{"name": "get_time"}</tool_call> <tool'),
    ("hermes", "no calls at all,\n but <tool_ and < and trailing space  "),
    ("qwen3_coder", "<tool_call><function=get_time></function></tool_call><tool_call><function=get_time>"),
])
def test_a_stream_cut_anywhere_adds_up_to_the_whole_reply(parser, text):
    whole_content, whole_calls = split(text, parser, TOOLS, final=True)
    for cuts in ([n] for n in range(len(text) + 1)):
        stream = ReplyText(parser=parser, tools=TOOLS)
        content, found = "", []
        for end in [*cuts, len(text)]:
            new = stream.next(text[:end], final=end == len(text))
            content += new.content
            found += new.calls
        assert content == whole_content, cuts
        assert calls(found) == calls(whole_calls), cuts
    stream = ReplyText(parser=parser, tools=TOOLS)  # one character at a time
    pieces = [stream.next(text[:end], final=end == len(text)) for end in range(len(text) + 1)]
    assert "".join(new.content for new in pieces) == whole_content
    assert calls([call for new in pieces for call in new.calls]) == calls(whole_calls)


def test_parallel_tool_calls_false_keeps_the_first_call():
    new = ReplyText(parser="hermes", tools=TOOLS, max_calls=1).next(HERMES, final=True)
    assert new.content == "Let me check." and calls(new.calls) == [("get_weather", {"city": "Milan", "days": 2})]


@pytest.mark.parametrize("template, parser", [
    ("{% for tool in tools %}{{ tool | tojson }}{% endfor %}<tool_call>\n{\"name\": ...}\n</tool_call>", "hermes"),
    ("{{- '<tool_call>\\n<function=' + tool_call.name + '>\\n' }}", "qwen3_coder"),
    ("{%- if builtin_tools is defined %}{{- '<|python_tag|>' }}{% endif %}", "llama3_json"),
    ("{{ messages[0].content }}", None),
    (None, None),
])
def test_the_parser_follows_what_the_template_teaches(template, parser):
    assert detect_parser(template) == parser


@pytest.mark.parametrize("text, thinking, reasoning, content", [
    ("Let me think.\n</think>\n\nHello", True, "Let me think.\n", "Hello"),  # the prompt opened the block
    ("<think>\nhm\n</think>\n\nHi", False, "\nhm\n", "Hi"),  # the reply opens it
    ("Hi <think>", False, None, "Hi <think>"),
    ("still thinking", True, "still thinking", ""),  # cut before </think>: all reasoning
    ("", True, "", ""),
])
def test_reasoning_is_the_text_up_to_the_end_of_the_think_block(text, thinking, reasoning, content):
    reader = ReplyText(thinking)
    reader.next(text, final=True)
    assert (reader.reasoning, reader.content) == (reasoning, content)


def test_a_call_in_the_reasoning_is_thought_not_made():
    text = ('maybe <tool_call>{"name": "get_time"}</tool_call>?\n</think>\n\nOK.\n'
            '<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}</tool_call>')
    reader = ReplyText(True, "hermes", TOOLS)
    reader.next(text, final=True)
    assert reader.reasoning == 'maybe <tool_call>{"name": "get_time"}</tool_call>?\n'
    assert (reader.content, calls(reader.calls)) == ("OK.", [("get_weather", {"city": "Oslo"})])


@pytest.mark.parametrize("text, thinking", [
    ('plan </thin k> more\n</think>\n\nOK <tool_call>{"name": "get_time"}</tool_call> done', True),
    ("  <think>a</think>b", False),
    ("<thin", False),
    ("no </think in it", True),
])
def test_a_stream_of_reasoning_content_and_calls_adds_up_to_the_whole_reply(text, thinking):
    whole = ReplyText(thinking, "hermes", TOOLS)
    whole.next(text, final=True)
    for cut in range(len(text) + 1):
        reader, parts = ReplyText(thinking, "hermes", TOOLS), ["", "", []]
        for end in (cut, len(text)):
            new = reader.next(text[:end], final=end == len(text))
            parts[0] += new.reasoning
            parts[1] += new.content
            parts[2] += new.calls
        assert parts[0] == (whole.reasoning or "") and parts[1] == whole.content, cut
        assert calls(parts[2]) == calls(whole.calls), cut


def test_the_prompt_opens_thinking_when_its_last_think_tag_is_open():
    from dflash_trt.serve.reply_text import opens_thinking

    assert opens_thinking("<|im_start|>assistant\n<think>\n")
    assert not opens_thinking("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert not opens_thinking("<|im_start|>assistant\n")


@pytest.mark.parametrize("forced, text, content, found", [
    ("get_weather", '{"city": "Oslo"}', "", [("get_weather", {"city": "Oslo"})]),
    ("required", '[{"name": "get_time", "parameters": {}}]', "", [("get_time", {})]),
    ("get_weather", '{"city": "Os', '{"city": "Os', []),  # cut by max_tokens: the text is the reply
    ("required", '{"name": "get_time"}', '{"name": "get_time"}', []),
])
def test_a_forced_reply_is_read_once_it_ends(forced, text, content, found):
    reader = ReplyText(forced=forced, tools=TOOLS)
    assert reader.next(text[:5], final=False) == Delta()  # nothing while it runs
    reader.next(text, final=True)
    assert (reader.content, calls(reader.calls)) == (content, found)


def test_reasoning_tokens_are_the_fewest_whose_text_closes_the_reasoning(tiny_pairs):
    from transformers import AutoTokenizer

    from dflash_trt.serve.reply_text import UNTHINK, reasoning_tokens

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_pairs["qwen3"][0]))
    for text in ("I greet back.</think>\n\nHello!", "</think>x", "still thinking", "a</think>b</think>c"):
        ids = tokenizer.encode(text, add_special_tokens=False)
        # every prefix, one by one: the first whose text holds the end (all of them when none does)
        closed = [k for k in range(len(ids) + 1) if UNTHINK in tokenizer.decode(ids[:k], skip_special_tokens=False)]
        assert reasoning_tokens(tokenizer, ids, UNTHINK) == (closed[0] if closed else len(ids))
    assert reasoning_tokens(tokenizer, [], UNTHINK) == 0

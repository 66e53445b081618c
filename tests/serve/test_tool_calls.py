"""Tool calls parsed out of a reply's text (serve/tool_calls.py): both formats, what stays text, and a
stream's pieces adding up to the whole reply wherever the text is cut."""

import json

import pytest

from dflash_trt.serve.tool_calls import ToolCallStream, detect_parser, split

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


@pytest.mark.parametrize("parser, text", [
    ("hermes", HERMES),
    ("qwen3_coder", CODER),
    ("hermes", 'x <tool_call>{"name": "nope"}</tool_call> y <tool_call>{"name": "get_time"}</tool_call> <tool'),
    ("hermes", "no calls at all,\n but <tool_ and < and trailing space  "),
    ("qwen3_coder", "<tool_call><function=get_time></function></tool_call><tool_call><function=get_time>"),
])
def test_a_stream_cut_anywhere_adds_up_to_the_whole_reply(parser, text):
    whole_content, whole_calls = split(text, parser, TOOLS, final=True)
    for cuts in ([n] for n in range(len(text) + 1)):
        stream = ToolCallStream(parser, TOOLS)
        content, found = "", []
        for end in [*cuts, len(text)]:
            delta, new = stream.next(text[:end], final=end == len(text))
            content += delta
            found += new
        assert content == whole_content, cuts
        assert calls(found) == calls(whole_calls), cuts
    stream = ToolCallStream(parser, TOOLS)  # one character at a time
    pieces = [stream.next(text[:end], final=end == len(text)) for end in range(len(text) + 1)]
    assert "".join(delta for delta, _ in pieces) == whole_content
    assert calls([call for _, new in pieces for call in new]) == calls(whole_calls)


def test_parallel_tool_calls_false_keeps_the_first_call():
    stream = ToolCallStream("hermes", TOOLS, max_calls=1)
    content, found = stream.next(HERMES, final=True)
    assert content == "Let me check." and calls(found) == [("get_weather", {"city": "Milan", "days": 2})]


@pytest.mark.parametrize("template, parser", [
    ("{% for tool in tools %}{{ tool | tojson }}{% endfor %}<tool_call>\n{\"name\": ...}\n</tool_call>", "hermes"),
    ("{{- '<tool_call>\\n<function=' + tool_call.name + '>\\n' }}", "qwen3_coder"),
    ("{{ messages[0].content }}", None),
    (None, None),
])
def test_the_parser_follows_what_the_template_teaches(template, parser):
    assert detect_parser(template) == parser

"""Structured output (SamplingParams.structured_output, llguidance's grammars) through the LLM's one
core path: greedy replies equal a constrained autoregressive loop written here (the torch target's
argmax over the tokens llguidance's matcher allows, a stop token once the grammar may end), with DFlash
and plainly; replies follow their grammar; a seeded sampled reply is the same on every entry point."""

import json
import re

import pytest
from reference import constrained_greedy

from dflash_trt import LLM, SamplingParams
from dflash_trt.errors import DFlashError
from dflash_trt.runtime.engine import Engine
from dflash_trt.spec.structured import StructuredOutput

pytest.importorskip("dflash_trt._core", reason="dflash_trt._core is not built: run `bash scripts/setup.sh`")
llguidance = pytest.importorskip("llguidance")

GRAMMARS = [
    {"regex": "[a-c]{2,5}(x|yz)"},
    {"choice": ["yes", "no", "maybe so"]},
    {"json": {"type": "object", "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer"}},
              "required": ["ok", "n"], "additionalProperties": False}},
    {"grammar": 'start: "(" item ("," item)* ")"\nitem: /[0-9]/'},
    {"grammar": 'root ::= "(" item ("," item)* ")"\nitem ::= [0-9]'},  # the same in GBNF (vLLM's, SGLang's ebnf)
]
PROMPTS = ["abc", "hello there", "zz top"]


@pytest.fixture(scope="module")
def llm(tiny_pairs):
    target, draft = tiny_pairs["llama"]
    return LLM(str(target), str(draft), block_size=4, max_batch=4, backend="torch")


def follows(structured: StructuredOutput, text: str) -> bool:
    if structured.regex is not None:
        return re.fullmatch(structured.regex, text) is not None
    if structured.choice is not None:
        return text in structured.choice
    if structured.json is not None:
        value = json.loads(text)
        return set(value) == {"ok", "n"} and isinstance(value["ok"], bool) and isinstance(value["n"], int)
    return re.fullmatch(r"\([0-9](,[0-9])*\)", text) is not None


@pytest.mark.parametrize("grammar", GRAMMARS, ids=lambda g: next(iter(g)) + ("-gbnf" if "::=" in str(g) else ""))
def test_greedy_replies_equal_the_constrained_autoregressive_loop(llm, grammar):
    params = SamplingParams(max_tokens=40, structured_output=grammar)
    finished = 0
    for prompt in PROMPTS:
        want = constrained_greedy(llm, prompt, params.structured_output, 40)
        dflash = llm.generate(prompt, params)[0]
        assert dflash.token_ids == want, prompt
        assert llm.generate(prompt, params, speculative=False)[0].token_ids == want
        if dflash.finish_reason == "stop":
            finished += 1
            assert follows(params.structured_output, dflash.text), dflash.text
        else:  # cut by max_tokens: a prefix the grammar still allows
            assert dflash.finish_reason == "length"
    assert finished or "json" in grammar  # the random target may still be inside a JSON string at 40 tokens


@pytest.mark.parametrize("grammar", GRAMMARS[:2], ids=lambda g: next(iter(g)))
def test_a_seeded_sampled_constrained_reply_is_the_same_on_every_entry_point(llm, grammar):
    params = SamplingParams(max_tokens=30, temperature=1.0, seed=11, structured_output=grammar)
    want = llm.generate("hello there", params)[0]
    assert want.finish_reason == "stop" and follows(params.structured_output, want.text)
    batch = llm.generate(PROMPTS, params)  # beside other constrained requests
    assert batch[PROMPTS.index("hello there")].token_ids == want.token_ids
    assert llm.generate("hello there", params, speculative=False)[0].token_ids == want.token_ids
    *_, streamed = llm.stream("hello there", params)
    engine = Engine(llm, max_batch=2)  # the core asks the grammar from the engine's own thread
    try:
        *_, threaded = engine.stream("hello there", params)
    finally:
        engine.shutdown()
    assert streamed.token_ids == threaded.token_ids == want.token_ids


def test_a_whitespace_pattern_is_the_only_spacing_json_output_may_have(llm):
    """vLLM's guided_whitespace_pattern: between JSON tokens either nothing or a match of the pattern."""
    from dflash_trt.runtime.constraints import grammar_tokenizer

    tokenizer = grammar_tokenizer(llm.tokenizer, len(llm.tokenizer))
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}

    def takes(structured: StructuredOutput, text: str) -> bool:
        matcher = llguidance.LLMatcher(tokenizer, structured.lark())
        taken = matcher.consume_tokens(llm.tokenizer.encode(text, add_special_tokens=False))
        return taken and not matcher.is_error() and matcher.is_accepting()

    texts = ['{"ok":true}', '{"ok": true}', '{  "ok":  true}', '{\n"ok":\ntrue}']
    assert [takes(StructuredOutput(json=schema), text) for text in texts] == [True] * 4
    assert [takes(StructuredOutput(json=schema, whitespace_pattern="[ ]{2}"), text) for text in texts] == \
        [True, False, True, False]
    assert [takes(StructuredOutput(json_object=True, whitespace_pattern="\n"), text) for text in texts] == \
        [True, False, False, True]


@pytest.mark.parametrize("value, words", [
    ({"regex": "("}, "structured_output.regex does not compile"),
    ({"json": {"type": "objec"}}, "structured_output.json does not compile"),
    ({"regex": "a", "choice": ["a"]}, "must set exactly one of"),
    ({"choice": []}, "choice must be a non-empty list"),
    ({"grammar": 'root ::= "a'}, "structured_output.grammar does not compile"),
    ({"regex": "a", "whitespace_pattern": " "}, "whitespace_pattern applies to JSON output"),
    ({"xml": "<a/>"}, "has no field 'xml'"),
    ("json", "must be a dict of one of"),
])
def test_a_structured_output_that_cannot_be_followed_is_refused_in_one_line(value, words):
    with pytest.raises(DFlashError, match=re.escape(words)) as err:
        SamplingParams(structured_output=value)
    assert str(err.value).startswith("SamplingParams.structured_output") and "\n" not in str(err.value)


def test_a_grammar_cannot_be_combined_with_what_bans_its_end(llm, small_vocab_pair):
    for extra in (dict(ignore_eos=True), dict(min_tokens=3)):
        with pytest.raises(DFlashError, match="cannot be combined with ignore_eos or min_tokens"):
            SamplingParams(structured_output={"regex": "a+"}, **extra)
    tokenless = LLM(str(small_vocab_pair[0]), str(small_vocab_pair[1]), backend="torch", block_size=4)
    with pytest.raises(DFlashError, match="structured_output needs a tokenizer"):
        tokenless.generate([1, 2], SamplingParams(structured_output={"regex": "a+"}))


def test_refused_drafts_become_the_token_a_grammar_forces_where_that_is_lossless(llm):
    """GrammarConstraint.masks: a draft the grammar refuses, where it allows one token only, is replaced
    by it when the core says it may (greedy rows, point-mass drafts); the masks follow the drafts kept."""
    constraint = llm.constraint(SamplingParams(structured_output={"choice": ["hello world"]}))
    word = llm.tokenizer("hello w", add_special_tokens=False)["input_ids"]
    garbage = [7] * len(word)
    k, masks, drafts = constraint.masks(garbage, may_replace=False)
    assert (k, drafts, masks.shape[0]) == (0, garbage, 1)
    k, masks, drafts = constraint.masks(garbage, may_replace=True)
    assert (k, drafts, masks.shape[0]) == (len(word), word, len(word) + 1)
    for j, token in enumerate(word):  # mask j allows exactly the forced token
        allowed = [t for t in range(llm.vocab_size) if masks[j][t // 32] >> (t % 32) & 1]
        assert allowed == [token]
    k, _, drafts = constraint.masks(word[:3] + [7, 7], may_replace=False)  # valid drafts are kept as they are
    assert (k, drafts) == (3, word[:3] + [7, 7])
    constraint.advance(word)  # committed: the next masks start after them
    assert constraint.masks([], may_replace=False)[1].shape[0] == 1


def test_a_grammar_after_a_token_lets_every_token_come_until_it(llm):
    """structured_output.after (a reasoning model's "</think>"; here a special token a logit_bias puts
    first): the reply is free until that token, then follows the grammar; = the constrained loop, DFlash
    and plain; the masks before it allow every token."""
    after = "<|im_start|>"
    after_id = llm.tokenizer.convert_tokens_to_ids(after)
    params = SamplingParams(max_tokens=30, logit_bias={after_id: 60.0},
                            structured_output={"regex": "[a-c]{2,5}x", "after": after})
    want = constrained_greedy(llm, "abc", params.structured_output, 30, bias={after_id: 60.0})
    out = llm.generate("abc", params)[0]
    assert out.token_ids == want and llm.generate("abc", params, speculative=False)[0].token_ids == want
    assert out.token_ids[0] == after_id and out.finish_reason == "stop"
    assert re.fullmatch("[a-c]{2,5}x", out.text)  # the special token is not text
    constraint = llm.constraint(params)
    a, x = llm.tokenizer.convert_tokens_to_ids(["a", "x"])
    k, masks, _ = constraint.masks([x, after_id, a, x], may_replace=False)
    assert k == 3  # x is anything before the grammar starts; after it, "a" fits and a lone "x" does not
    assert (masks[:2] == 0xFFFFFFFF).all() and not (masks[2][x // 32] >> (x % 32)) & 1
    with pytest.raises(DFlashError, match="structured_output.after 'abc' is 3 tokens for this tokenizer"):
        llm.generate("abc", SamplingParams(structured_output={"regex": "a", "after": "abc"}))


def test_choices_are_matched_literally_whatever_characters_they_hold(llm):
    """Regex meta characters and control characters in a choice stand for themselves."""
    choices = ["a.b*", "(x|y)", "\x01~\x7f"]
    constraint = llm.constraint(SamplingParams(structured_output={"choice": choices}))
    for text, whole in [("a.b*", True), ("(x|y)", True), ("\x01~\x7f", True), ("aXb*", False), ("x", False)]:
        ids = llm.tokenizer(text, add_special_tokens=False)["input_ids"]
        assert (constraint.matcher.validate_tokens(ids) == len(ids)) == whole, text

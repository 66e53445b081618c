"""Every entry point runs one path: the LLM's one C++ core runner. Plain and speculative requests
share its KV slots, and a seeded T>0 request gets the same tokens whichever entry point, batch or
decoding mode runs it."""

import json

import pytest
from click.testing import CliRunner
from reference import reference_output

from dflash_trt import LLM, SamplingParams
from dflash_trt.cli import main
from dflash_trt.runtime.engine import Engine

pytest.importorskip("dflash_trt._core", reason="dflash_trt._core is not built: run `bash scripts/setup.sh`")

PROMPTS = [[5, 6, 7], "abc", [1] * 9, "zz top", [3, 1, 4], "hello there"]
SEEDED = SamplingParams(max_tokens=10, temperature=0.9, top_p=0.9, top_k=20, seed=1234)


@pytest.fixture(scope="module")
def llm(tiny_pairs):
    target, draft = tiny_pairs["llama"]
    return LLM(str(target), str(draft), block_size=4, max_batch=4, backend="torch")


def test_plain_and_speculative_requests_share_one_runner_and_its_slots(llm):
    params = SamplingParams(max_tokens=12, ignore_eos=True)
    llm.generate(PROMPTS[:2], params, speculative=True)
    runner = llm._runner()
    llm.generate(PROMPTS[:2], params, speculative=False)
    assert llm._runner() is runner  # no second runner, executor or KV pool for plain decoding
    requests = [runner.prepare(p, params, speculative=i % 2 == 0) for i, p in enumerate(PROMPTS)]
    for request in requests:
        runner.submit(request)
    busy = []
    while runner.has_work:
        runner.step()
        busy.append(runner.slots.num_free)
    assert min(busy) == 0  # 6 requests of both kinds took turns in the same 4 slots
    assert runner.slots.num_free == 4 and not runner.executor.live_rows
    for i, (prompt, request) in enumerate(zip(PROMPTS, requests, strict=True)):
        want = reference_output(llm, prompt, params, speculative=i % 2 == 0)
        assert request.stop.token_ids == want.token_ids, prompt
        drafted = request.core_metrics["num_drafts"]
        assert drafted > 0 if i % 2 == 0 else drafted == 0  # plain requests verified blocks of 1


def test_a_seeded_sampled_request_gets_the_same_tokens_on_every_entry_point(llm, tiny_pairs):
    want = llm.generate("hello there", SEEDED)[0].token_ids
    assert len(want) == 10
    *_, streamed = llm.stream("hello there", SEEDED)
    assert streamed.token_ids == want
    batch = llm.generate(PROMPTS, SEEDED)  # beside other requests with the same seed
    assert batch[PROMPTS.index("hello there")].token_ids == want
    # the target's draw at each position does not depend on what was drafted, or whether anything was
    assert llm.generate("hello there", SEEDED, speculative=False)[0].token_ids == want
    engine = Engine(llm, max_batch=2)
    try:
        *_, threaded = engine.stream("hello there", SEEDED)
    finally:
        engine.shutdown()
    assert threaded.token_ids == want
    target, draft = tiny_pairs["llama"]
    args = ["generate", "--target", str(target), "--draft", str(draft), "--backend", "torch", "--block-size", "4",
            "--max-tokens", "10",
            "--temperature", "0.9", "--top-p", "0.9", "--top-k", "20", "--seed", "1234", "hello there"]
    as_json = CliRunner().invoke(main, [*args[:-1], "--json", args[-1]])
    assert as_json.exit_code == 0, as_json.output
    assert json.loads(as_json.stdout)["token_ids"] == want
    text = CliRunner().invoke(main, args)
    assert text.exit_code == 0, text.output
    assert text.stdout == llm.generate("hello there", SEEDED)[0].text + "\n"


def test_penalties_reach_the_core_from_every_entry_point(llm, tiny_pairs):
    """SamplingParams' penalties: greedy replies equal the reference loop's penalized autoregressive
    replies (torch backend on the CPU), with DFlash and plainly; a seeded sampled one is the same from
    generate, stream and the Engine."""
    params = SamplingParams(max_tokens=12, ignore_eos=True, presence_penalty=1.5, repetition_penalty=1.2)
    for prompt in PROMPTS[:3]:
        want = reference_output(llm, prompt, params)
        assert want.token_ids != reference_output(llm, prompt, SamplingParams(max_tokens=12, ignore_eos=True)).token_ids
        assert llm.generate(prompt, params)[0].token_ids == want.token_ids
        assert llm.generate(prompt, params, speculative=False)[0].token_ids == want.token_ids
    seeded = SamplingParams(max_tokens=10, temperature=0.9, seed=7, frequency_penalty=0.8)
    want = llm.generate("hello there", seeded)[0].token_ids
    *_, streamed = llm.stream("hello there", seeded)
    engine = Engine(llm, max_batch=2)
    try:
        *_, threaded = engine.stream("hello there", seeded)
    finally:
        engine.shutdown()
    assert streamed.token_ids == threaded.token_ids == want


def test_chat_renders_each_conversation_through_the_template_as_generate_runs_it(llm):
    from dflash_trt.errors import DFlashError

    params = SamplingParams(max_tokens=8)
    assert llm.chat([{"role": "user", "content": "hello there"}], params)[0].token_ids == \
        llm.generate("hello there", params)[0].token_ids  # one user turn: what generate's template gives
    conversations = [[{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}],
                     [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
                      {"role": "user", "content": "c"}]]
    outs = llm.chat(conversations, params, chat_template_kwargs={"enable_thinking": False})
    for turns, out in zip(conversations, outs, strict=True):
        text = llm.tokenizer.apply_chat_template(turns, add_generation_prompt=True, tokenize=False,
                                                 enable_thinking=False)
        assert text.endswith("<think>\n\n</think>\n\n")  # the template's variable reached it
        ids = llm.tokenizer(text, add_special_tokens=False)["input_ids"]
        assert out.prompt_token_ids == ids and out.token_ids == llm.generate(ids, params)[0].token_ids
    with pytest.raises(DFlashError, match="does not render tools"):
        llm.chat(conversations[0], params, tools=[{"type": "function", "function": {"name": "f"}}])


def test_chat_renders_a_template_of_its_own_with_the_documents_it_cites(llm):
    """vLLM's chat_template and documents: the prompt is that template's rendering of the turns and the
    documents (written out here), and the reply generate's for it."""
    from dflash_trt.errors import DFlashError

    template = ("{% for d in documents %}[{{ d.title }}] {{ d.text }}\n{% endfor %}"
                "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}assistant:")
    turns = [{"role": "user", "content": "which?"}]
    docs = [{"title": "A", "text": "alpha"}, {"title": "B", "text": "beta"}]
    params = SamplingParams(max_tokens=8)
    out = llm.chat(turns, params, chat_template=template, documents=docs)[0]
    ids = llm.tokenizer("[A] alpha\n[B] beta\nuser: which?\nassistant:", add_special_tokens=False)["input_ids"]
    assert out.prompt_token_ids == ids and out.token_ids == llm.generate(ids, params)[0].token_ids
    with pytest.raises(DFlashError, match="does not render documents"):
        llm.chat(turns, params, documents=docs)  # the tokenizer's own template cites none


def test_chat_continues_a_final_message_when_asked(llm):
    """vLLM's continue_final_message: the assistant's first words are given and the reply continues them
    (the template leaves the last message open, no turn opened)."""
    from dflash_trt.errors import DFlashError

    turns = [{"role": "user", "content": "count"}, {"role": "assistant", "content": "one, two,"}]
    params = SamplingParams(max_tokens=8)
    out = llm.chat(turns, params, add_generation_prompt=False, continue_final_message=True)[0]
    text = llm.tokenizer.apply_chat_template(turns, add_generation_prompt=False, continue_final_message=True,
                                             tokenize=False)
    assert text.endswith("one, two,")  # open: no end of turn after it
    ids = llm.tokenizer(text, add_special_tokens=False)["input_ids"]
    assert out.prompt_token_ids == ids and out.token_ids == llm.generate(ids, params)[0].token_ids
    with pytest.raises(DFlashError, match="continue_final_message needs add_generation_prompt=False"):
        llm.chat(turns, params, continue_final_message=True)

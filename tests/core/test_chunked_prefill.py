"""Chunked prefill (SchedulerConfig.prefill_chunk): a prompt enters its slot N tokens per step while the
running requests keep decoding. Output equals each request's autoregressive output whatever the
chunk, on the Python session executor and on the C++ onnxruntime executor (attention-only and hybrid
slots bundles, whose linear-attention states carry from one chunk to the next)."""

import pytest
from factories import export_tiny_slots_bundle
from scheduler_checks import autoregressive, drive, workload

from dflash_trt import LLM, SamplingParams
from dflash_trt.errors import DFlashError


@pytest.mark.parametrize("name", ["qwen3", "small_vocab"])
@pytest.mark.parametrize("chunk", [1, 3])
def test_chunked_prefill_equals_each_requests_autoregressive_output(runner_module, llms, name, chunk):
    llm = llms[name]
    work = workload(llm.vocab_size, 6, seed=chunk)
    engine = runner_module.BatchRunner(llm, max_batch=3, capacity=64, block_size=llm.block_size, prefill_chunk=chunk)
    whole = runner_module.BatchRunner(llm, max_batch=3, capacity=64, block_size=llm.block_size)
    for (_, prompt, params), out, ref in zip(work, drive(engine, work), drive(whole, work), strict=True):
        assert out.token_ids == autoregressive(llm, name, prompt, params).token_ids, (prompt, params)
        # the drafter saw the same context: every chunk's features reached it, in order
        assert out.core_metrics["num_accepted_tokens"] == ref.core_metrics["num_accepted_tokens"]
    assert engine.slots.num_free == 3 and not engine.executor.live_rows


def test_seeded_sampling_is_the_same_chunked_or_whole(runner_module, llms):
    llm = llms["llama"]
    params = SamplingParams(max_tokens=12, temperature=0.9, top_p=0.95, seed=5, ignore_eos=True)
    prompts = [list(range(3, 20)), [7, 8]]
    outputs = []
    for chunk in (0, 4):
        engine = runner_module.BatchRunner(llm, max_batch=2, capacity=64, block_size=4, prefill_chunk=chunk)
        outputs.append(drive(engine, [(0, p, params) for p in prompts]))
    assert [o.token_ids for o in outputs[0]] == [o.token_ids for o in outputs[1]]


def test_a_long_prompt_enters_over_several_steps_while_the_running_request_decodes(runner_module, llms):
    llm = llms["qwen3"]
    engine = runner_module.BatchRunner(llm, max_batch=2, capacity=64, speculative=False, prefill_chunk=4)
    params = SamplingParams(max_tokens=20, ignore_eos=True)
    running = engine.add([5, 6], params)
    engine.step()  # its prefill: the first token
    long = engine.add(list(range(10, 30)), params)  # 20 tokens: 5 chunks of 4
    for step in range(5):
        touched = {o.id for o in engine.step()}
        assert running.id in touched  # one token every step, the long prefill notwithstanding
        assert (long.id in touched) == (step == 4)  # its first token once the last chunk is in
    assert len(running.token_ids) == 6 and len(long.token_ids) == 1
    while engine.has_work:
        engine.step()
    ar = autoregressive(llm, "qwen3", list(range(10, 30)), params)
    assert long.token_ids == ar.token_ids


def test_a_negative_chunk_is_refused_in_one_line(core, runner_module, llms):
    from dflash_trt.runtime.batch_runner import BatchRunner

    with pytest.raises(DFlashError, match=r"prefill_chunk must be an integer >= 0 \(0: whole prompts\), got -1"):
        BatchRunner(llms["qwen3"], max_batch=1, capacity=64, prefill_chunk=-1)
    executor = llms["qwen3"].executor(1, 64)
    with pytest.raises(ValueError, match=r"prefill_chunk must be 0 \(whole prompts\) or at least 1 token, got -2"):
        core.Scheduler(executor, core.SchedulerConfig(prefill_chunk=-2))


@pytest.fixture(scope="module")
def slots_pairs(core, tmp_path_factory):
    """family -> (slots bundle, torch LLM over its pair): attention-only and hybrid."""
    if not core.HAS_ORT_EXECUTOR:
        pytest.skip("dflash_trt._core was built without the onnxruntime executor (see csrc/README.md, Build)")
    made = {}
    for family in ("qwen3", "qwen3_5_text"):
        root = tmp_path_factory.mktemp(f"chunked-{family}")
        bundle = export_tiny_slots_bundle(root, family=family)
        made[family] = (bundle, LLM(str(root / family), str(root / f"{family}-draft"), backend="torch"))
    return made


@pytest.mark.parametrize("family", ["qwen3", "qwen3_5_text"])
def test_the_cpp_executor_prefills_in_chunks_and_decodes_as_autoregressive(slots_pairs, family):
    bundle, reference = slots_pairs[family]
    llm = LLM.from_bundle(bundle, block_size=4, max_batch=3, capacity=64, prefill_chunk=3)
    params = SamplingParams(max_tokens=16, ignore_eos=True)
    prompts = ["hello there, a longer prompt", [5, 6, 7], "abcdefghij"]
    whole = LLM.from_bundle(bundle, block_size=4, max_batch=3, capacity=64)
    for prompt, out, ref in zip(prompts, llm.generate(prompts, params), whole.generate(prompts, params), strict=True):
        assert out.token_ids == reference.generate(prompt, params, speculative=False)[0].token_ids
        assert out.metrics.acceptance_lengths == ref.metrics.acceptance_lengths  # the same drafts, chunked or not

"""A slots bundle (graph contract 2) through the public API: LLM.from_bundle runs every request on the
C++ onnxruntime executor, batched; the torch reference loop on the same pair is the oracle."""

import pytest
from factories import export_tiny_slots_bundle

from dflash_trt import LLM, DFlashError, SamplingParams
from dflash_trt.runtime.engine import Engine

core = pytest.importorskip("dflash_trt._core", reason="dflash_trt._core is not built: run `bash scripts/setup.sh`")
pytestmark = pytest.mark.skipif(not getattr(core, "HAS_ORT_EXECUTOR", False),
                                reason="dflash_trt._core was built without the onnxruntime executor (no headers)")

PROMPTS = ["abc", [5, 6, 7], "hello there", [1] * 9, "x", [3, 1, 4, 1, 5, 9, 2, 6]]


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("slots")
    bundle = export_tiny_slots_bundle(root)
    return bundle, LLM(str(root / "qwen3"), str(root / "qwen3-draft"), block_size=4)


@pytest.mark.parametrize("speculative", [True, False])
def test_generate_on_a_slots_bundle_equals_the_torch_reference(pair, speculative):
    bundle, ref = pair
    llm = LLM.from_bundle(bundle, block_size=4, max_batch=4)
    assert llm.backend == "onnxruntime" and llm.batched_only
    params = SamplingParams(max_tokens=16, ignore_eos=True)
    for prompt, out in zip(PROMPTS, llm.generate(PROMPTS, params, speculative=speculative), strict=True):
        *_, want = ref.stream(prompt, params, speculative=speculative)
        assert out.token_ids == want.token_ids and out.text == want.text
        if speculative:  # the same drafts accepted at every step, except where the core shrinks the last blocks
            ours = out.metrics.acceptance_lengths
            assert ours[:-2] == want.metrics.acceptance_lengths[:len(ours) - 2]


def test_stream_and_the_engine_run_on_the_executor(pair):
    bundle, ref = pair
    llm = LLM.from_bundle(bundle, block_size=4, max_batch=2)
    params = SamplingParams(max_tokens=12, stop=["e"])
    steps = list(llm.stream("hello there", params))
    assert steps[-1].finish_reason is not None and all(s.finish_reason is None for s in steps[:-1])
    assert steps[-1].text == ref.generate("hello there", params)[0].text
    engine = Engine(llm, max_batch=2)
    finals = [list(engine.stream(p, params))[-1] for p in PROMPTS[:3]]
    engine.shutdown()
    assert [f.token_ids for f in finals] == [ref.generate(p, params)[0].token_ids for p in PROMPTS[:3]]


def test_capacity_is_checked_before_any_work(pair):
    bundle, _ = pair
    llm = LLM.from_bundle(bundle, block_size=4, max_batch=2, capacity=32)
    with pytest.raises(DFlashError, match="exceeds the context capacity of 32"):
        llm.generate(["abc", [1] * 30], SamplingParams(max_tokens=8))

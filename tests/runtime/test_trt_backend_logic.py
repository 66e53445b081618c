"""The TensorRT backend's own logic, on the CPU: profile choice, feeds by name, shape and address, the
shape tensor on the host, outputs sized from the context, commit / rollback, draft context growth and
the max_seq_len refusal. TensorRT is faked (tests/fake_tensorrt.py): its engines are onnxruntime
sessions over the source bundle's graphs, so the backend must decode exactly what the onnxruntime
backend does. test_trt_backend.py runs the same backend on real engines, on a GPU."""

import functools
import sys

import fake_tensorrt
import pytest

from dflash_trt import LLM, SamplingParams
from dflash_trt.engines import machine, trt_engine
from dflash_trt.engines.build import build_engines
from dflash_trt.engines.config import BuildConfig
from dflash_trt.errors import DFlashError
from dflash_trt.runtime import trt_backend

MAX_SEQ_LEN = 96
LONG_PROMPT = [5, 4, 3, 2, 1, 0, 1, 2]  # longer than a block: the draft context's prefill profile
# The 6-token pairs get drafts accepted (the random tiny drafters of the others never do), so commits
# keep more than the bonus token and the draft context grows by whole blocks.
PROMPTS = {"llama": ["hello there", [5, 6, 7], [9], LONG_PROMPT], "qwen3": ["hello there", [5, 6, 7], [9], LONG_PROMPT],
           "small-vocab": [[1, 2, 3], [0, 4, 1, 1], [2], LONG_PROMPT],
           "hybrid": ["hello there", [5, 6, 7], LONG_PROMPT],  # Gated DeltaNet states beside the K/V
           "small-vocab-fp16": [[1, 2, 3], [2], LONG_PROMPT]}


@pytest.fixture(scope="module")
def sources(bundles, small_vocab_pair, hybrid_bundles, tmp_path_factory):
    """pair -> ONNX bundle: the tiny llama and qwen3 pairs, the 6-token pair in float32 and float16, and
    a hybrid (qwen3_5_moe_text) target's."""
    from dflash_trt.export.bundle import export_bundle
    from dflash_trt.models.checkpoints import load_drafter, load_target

    root = tmp_path_factory.mktemp("fake-trt-sources")
    target, drafter = load_target(str(small_vocab_pair[0]))[0], load_drafter(small_vocab_pair[1])
    return {"llama": bundles["llama"][0], "qwen3": bundles["qwen3"][0],
            "small-vocab": export_bundle(target, drafter, None, root / "fp32", check=False),
            "small-vocab-fp16": export_bundle(target, drafter, None, root / "fp16", dtype="float16", check=False),
            "hybrid": hybrid_bundles["qwen3_5_moe_text"][2]}


@pytest.fixture(scope="module")
def fake(sources, tmp_path_factory):
    """(fake TensorRT module, pair -> TensorRT-RTX engine bundle of fake engines). While this module's
    tests run, the fake is `tensorrt_rtx`, this machine has an SM 12.0 GPU and TrtBundle lives on the CPU."""
    root = tmp_path_factory.mktemp("fake-trt")
    with pytest.MonkeyPatch.context() as patch:
        trt = fake_tensorrt.module()
        patch.setitem(sys.modules, "tensorrt_rtx", trt)
        patch.setattr(machine, "gpu_compute_capability", lambda: "12.0")
        patch.setattr(trt_backend, "TrtBundle", functools.partial(trt_backend.TrtBundle, device="cpu"))
        config = BuildConfig(engine="tensorrt-rtx", compute_capabilities=("12.0",), max_seq_len=MAX_SEQ_LEN)
        with pytest.MonkeyPatch.context() as building:
            building.setattr(trt_engine, "build_trt_graph", fake_tensorrt.build_graph)
            for pair, source in sources.items():
                build_engines(source, root / pair, config)
        yield trt, {pair: root / pair for pair in sources}


@pytest.fixture(scope="module")
def llms(fake, sources):
    """pair -> (LLM on the fake TensorRT engines, LLM on onnxruntime over the source bundle)."""
    return {pair: (LLM.from_bundle(fake[1][pair]), LLM.from_bundle(source)) for pair, source in sources.items()}


@pytest.mark.parametrize("pair", list(PROMPTS))
@pytest.mark.parametrize("block", [2, 4])
def test_greedy_dflash_on_tensorrt_equals_autoregressive_and_onnxruntime(llms, pair, block):
    ours, reference = llms[pair]
    assert (ours.backend, reference.backend) == ("tensorrt", "onnxruntime")
    ours.block_size = reference.block_size = block
    params = SamplingParams(max_tokens=24, ignore_eos=True)
    accepted = []
    for prompt in PROMPTS[pair]:
        spec, ref = ours.generate(prompt, params)[0], reference.generate(prompt, params)[0]
        assert spec.token_ids == ours.generate(prompt, params, speculative=False)[0].token_ids == ref.token_ids
        assert spec.metrics.acceptance_lengths == ref.metrics.acceptance_lengths  # the same drafts, step for step
        accepted += spec.metrics.acceptance_lengths
    if pair.startswith("small-vocab"):
        assert max(accepted) == block and min(accepted) < block  # whole blocks kept, and rollbacks


def test_each_step_runs_on_the_tightest_profile_that_holds_it(fake, llms):
    trt, _ = fake
    ours, _ = llms["small-vocab"]
    ours.block_size = 4
    params = SamplingParams(max_tokens=24, ignore_eos=True)
    for prompt, injection in ((LONG_PROMPT, "prefill"), ([1, 2, 3], "step")):
        trt.runs.clear()
        list(ours.stream(prompt, params))  # the Python loop: every verify is a full block (the core shrinks the last)
        runs = {graph: [run for run in trt.runs if run.graph == graph] for graph in ("target", "draft_context", "draft_block")}
        prefill, *verifies = runs["target"]
        assert (prefill.phase, prefill.sizes["past"], prefill.sizes["logits_from"]) == ("prefill", 0, len(prompt) - 1)
        assert verifies and all((r.phase, r.sizes["new"], r.sizes["logits_from"]) == ("verify", 4, 0) for r in verifies)
        first, *steps = runs["draft_context"]
        assert (first.phase, first.sizes["new"]) == (injection, len(prompt))  # a prompt within a block fits the step's box
        assert steps and all(r.phase == "step" for r in steps) and {r.sizes["new"] for r in steps} > {1}
        # the draft context grows by what each verify kept: the prompt, then the accepted drafts plus one
        contexts = [r.sizes["context"] for r in runs["draft_block"]]
        assert contexts == [len(prompt) + sum(r.sizes["new"] for r in steps[:i]) for i in range(len(contexts))]
        assert {r.phase for r in runs["draft_block"]} == {"draft"}
    trt.runs.clear()
    list(ours.stream([1, 2, 3], SamplingParams(max_tokens=12, ignore_eos=True), speculative=False))
    assert [r.phase for r in trt.runs] == ["prefill"] + ["verify"] * 11  # plain decoding: one-token verifies


def test_a_sequence_beyond_max_seq_len_is_refused_in_one_line(fake, llms):
    trt, _ = fake
    ours, _ = llms["qwen3"]
    trt.runs.clear()
    with pytest.raises(DFlashError, match=f"reach {MAX_SEQ_LEN + 1} tokens, beyond the engine's --max-seq-len "
                                          f"{MAX_SEQ_LEN}: rebuild with a larger one") as refusal:
        ours.generate([7] * (MAX_SEQ_LEN + 1), SamplingParams(max_tokens=1))
    assert "\n" not in str(refusal.value) and trt.runs == []  # refused before any engine ran
    # Plain decoding fills the cache to exactly max_seq_len, on the edges of the decode profiles, and no further.
    prompt = [7] * (MAX_SEQ_LEN - 4)
    assert len(ours.generate(prompt, SamplingParams(max_tokens=5, ignore_eos=True), speculative=False)[0].token_ids) == 5
    assert trt.runs[-1].sizes["past"] + trt.runs[-1].sizes["new"] == MAX_SEQ_LEN
    with pytest.raises(DFlashError, match=f"reach {MAX_SEQ_LEN + 1} tokens"):
        ours.generate(prompt, SamplingParams(max_tokens=6, ignore_eos=True), speculative=False)


def test_a_block_outside_every_profile_is_refused_in_one_line(fake):
    bundle = trt_backend.TrtBundle(fake[1]["small-vocab"])
    target, drafter = trt_backend.TrtTargetSession(bundle), trt_backend.TrtDraftSession(bundle)
    _, features = target.prefill([1, 2, 3])
    with pytest.raises(DFlashError, match=r"outside every optimization profile of this engine: rebuild with a larger"):
        drafter.draft(features, 1, block_size=5)  # the engines were built for blocks of at most 4


@pytest.mark.parametrize("pair", ["llama", "small-vocab"])
def test_sampled_tensorrt_matches_onnxruntime_with_the_same_seed(llms, pair):
    ours, reference = llms[pair]
    ours.block_size = reference.block_size = 4
    params = SamplingParams(max_tokens=20, temperature=0.8, top_p=0.9, seed=7, ignore_eos=True)
    for prompt in ([1, 2, 3], LONG_PROMPT):
        a, b = ours.generate(prompt, params)[0], reference.generate(prompt, params)[0]
        assert a.token_ids == b.token_ids and a.metrics.acceptance_lengths == b.metrics.acceptance_lengths

"""LLM(draft_rule="drafter") end to end on the C++ executors: T>0 drafts drawn from the drafter's own
distribution (csrc/acceptance.h). A seeded request's tokens are the same alone or in any batch and
through every entry point; greedy requests are unchanged; what cannot run the rule is refused in one
line before any request. That its tokens follow the target's distribution is tested in
tests/core/test_drafter_rule.py (the rule) and tests/runtime/test_llm.py (through the core)."""

import pytest

from dflash_trt import LLM, DFlashError, SamplingParams
from dflash_trt.runtime.engine import Engine
from dflash_trt.export.bundle import export_bundle
from dflash_trt.models.checkpoints import load_drafter, load_target

core = pytest.importorskip("dflash_trt._core", reason="dflash_trt._core is not built: run `bash scripts/setup.sh`")
pytestmark = pytest.mark.skipif(not getattr(core, "HAS_ORT_EXECUTOR", False),
                                reason="dflash_trt._core was built without the onnxruntime executor (no headers)")

PROMPTS = [[1, 2, 3], [4, 0, 1, 2], [3], [2, 2, 4, 1, 0]]


@pytest.fixture(scope="module")
def bundle(small_vocab_pair, tmp_path_factory):
    """The 6-token pair (drafts often kept) as a slots bundle."""
    target_dir, draft_dir = small_vocab_pair
    target, tokenizer = load_target(str(target_dir))
    return export_bundle(target, load_drafter(draft_dir), tokenizer, tmp_path_factory.mktemp("rule") / "bundle",
                         flavour="slots", check=False)


def _tokens(llm, prompts, params):
    return [o.token_ids for o in llm.generate(prompts, params)]


def test_a_seeded_request_gets_the_same_tokens_alone_in_any_batch_and_streamed(bundle):
    llm = LLM.from_bundle(bundle, block_size=4, max_batch=4, draft_rule="drafter")
    params = SamplingParams(max_tokens=24, temperature=1.0, seed=7, ignore_eos=True)
    batched = _tokens(llm, PROMPTS, params)
    assert batched == [_tokens(llm, [p], params)[0] for p in PROMPTS]
    assert batched[1:3] == _tokens(llm, PROMPTS[1:3], params)
    assert [list(llm.stream(p, params))[-1].token_ids for p in PROMPTS[:2]] == batched[:2]
    two_rows = LLM.from_bundle(bundle, block_size=4, max_batch=2, draft_rule="drafter")  # rows join as others end
    assert _tokens(two_rows, PROMPTS, params) == batched
    outputs = llm.generate(PROMPTS, params)
    assert any(max(o.metrics.acceptance_lengths) > 1 for o in outputs)  # drafts were kept, not only rejected


def test_the_rule_is_in_effect_at_t_above_0_and_greedy_is_unchanged(bundle):
    drafter = LLM.from_bundle(bundle, block_size=4, draft_rule="drafter")
    point_mass = LLM.from_bundle(bundle, block_size=4)
    greedy = SamplingParams(max_tokens=20, ignore_eos=True)
    assert _tokens(drafter, PROMPTS, greedy) == _tokens(point_mass, PROMPTS, greedy)
    # point mass emits the plain sampled tokens; the drafter's rule emits other draws of the same distribution
    sampled = [SamplingParams(max_tokens=20, temperature=1.0, seed=s, ignore_eos=True) for s in range(6)]
    plain = [point_mass.generate(PROMPTS, p, speculative=False) for p in sampled]
    assert [_tokens(point_mass, PROMPTS, p) for p in sampled] == [[o.token_ids for o in r] for r in plain]
    assert [_tokens(drafter, PROMPTS, p) for p in sampled] != [[o.token_ids for o in r] for r in plain]


def test_the_torch_backend_runs_the_rule_with_a_draft_vocabulary(tiny_pairs):
    """The llama pair's drafter proposes 90 of 264 ids: q's columns map onto target ids."""
    target, draft = tiny_pairs["llama"]
    llm = LLM(str(target), str(draft), block_size=4, backend="torch", draft_rule="drafter")
    params = SamplingParams(max_tokens=10, temperature=0.8, seed=3, ignore_eos=True)
    prompts = ["abc", [5, 6, 7], "hello there"]
    batched = _tokens(llm, prompts, params)
    assert batched == [_tokens(llm, [p], params)[0] for p in prompts]


def test_what_cannot_run_the_rule_is_refused_in_one_line(bundle, small_vocab_pair, tmp_path):
    """(A plugin-flavour DFlash2 bundle's refusal: tests/models/test_dflash2.py.)"""
    with pytest.raises(DFlashError, match="draft_rule must be one of point-mass, drafter"):
        LLM.from_bundle(bundle, block_size=4, draft_rule="typical")
    with pytest.raises(DFlashError, match="needs a fixed block_size"):
        LLM.from_bundle(bundle, draft_rule="drafter")
    pinned = LLM.from_bundle(bundle, block_size=4, draft_rule="drafter")
    with pytest.raises(DFlashError, match="needs a fixed block size"):
        Engine(pinned, max_batch=2)  # an engine adapts its blocks unless given one
    engine = Engine(pinned, max_batch=2, block_size=4)
    engine.shutdown()
    target_dir, draft_dir = small_vocab_pair
    with pytest.raises(DFlashError, match="needs a fixed block_size"):
        LLM(str(target_dir), str(draft_dir), backend="torch", draft_rule="drafter")
    # a bundle whose draft block graph returns no draft_logits: slots-trt's (for TensorRT builds)
    target, tokenizer = load_target(str(target_dir))
    trt_flavour = export_bundle(target, load_drafter(draft_dir), tokenizer, tmp_path / "slots-trt",
                                flavour="slots-trt", check=False, capacity=64)
    with pytest.raises(DFlashError, match="needs the draft block graph's draft_logits"):
        LLM.from_bundle(trt_flavour, block_size=4, capacity=64, draft_rule="drafter")
    assert LLM.from_bundle(trt_flavour, block_size=4, capacity=64).generate([1, 2], SamplingParams(max_tokens=3))

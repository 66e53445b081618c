"""A slots bundle (graph contract 2) through the public API: LLM.from_bundle runs every request on the
C++ onnxruntime executor, batched; the torch reference loop on the same pair is the oracle."""

import pytest
from factories import export_tiny_slots_bundle
from reference import reference_output

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
    return bundle, LLM(str(root / "qwen3"), str(root / "qwen3-draft"), block_size=4, backend="torch")


@pytest.mark.parametrize("speculative", [True, False])
def test_generate_on_a_slots_bundle_equals_the_torch_reference(pair, speculative):
    bundle, ref = pair
    llm = LLM.from_bundle(bundle, block_size=4, max_batch=4)
    assert llm.backend == "onnxruntime"
    params = SamplingParams(max_tokens=16, ignore_eos=True)
    for prompt, out in zip(PROMPTS, llm.generate(PROMPTS, params, speculative=speculative), strict=True):
        want = reference_output(ref, prompt, params, speculative)
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


def test_llm_with_backend_onnxruntime_exports_a_slots_bundle_once_and_reuses_it(tiny_pairs, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    target, draft = map(str, tiny_pairs["qwen3"])
    first = LLM(target=target, draft=draft, backend="onnxruntime", block_size=4, max_batch=2, capacity=64)
    (bundle,) = (tmp_path / "dflash-trt" / "bundles").iterdir()
    stamp = (bundle / "bundle.json").stat().st_mtime_ns
    second = LLM(target=target, draft=draft, backend="onnxruntime", block_size=4, max_batch=2, capacity=64)
    assert (bundle / "bundle.json").stat().st_mtime_ns == stamp  # reused, not re-exported
    assert first._bundle.manifest["flavour"] == "slots"
    params = SamplingParams(max_tokens=12, ignore_eos=True)
    want = reference_output(LLM(target, draft, block_size=4, backend="torch"), "yo", params, speculative=True)
    assert first.generate("yo", params)[0].token_ids == second.generate("yo", params)[0].token_ids == want.token_ids


def test_a_new_graphs_revision_exports_afresh_and_forgets_the_pairs_old_export(tiny_pairs, tmp_path, monkeypatch):
    """The user cache keeps one export per pair: a release whose exporter writes other graphs (a new
    GRAPHS_REVISION) exports afresh and removes that pair's old export, never another pair's."""
    from dflash_trt.runtime import bundles

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    target, draft = map(str, tiny_pairs["qwen3"])
    other_target, other_draft = map(str, tiny_pairs["llama"])
    old, other = bundles.cached_bundle(target, draft), bundles.cached_bundle(other_target, other_draft)
    engines = tmp_path / "dflash-trt" / "engines"
    old_engines = engines / f"{old.name}-b8-sm90"  # what cached_engines names a build of that bundle
    old_engines.mkdir(parents=True)
    monkeypatch.setattr(bundles, "GRAPHS_REVISION", bundles.GRAPHS_REVISION + 1)
    new = bundles.cached_bundle(target, draft)
    assert new.name == old.name.rsplit("-g", 1)[0] + f"-g{bundles.GRAPHS_REVISION}"
    assert (new / "bundle.json").is_file() and not old.exists()
    assert (other / "bundle.json").is_file()  # another pair's export (of the old revision) stays
    bundles.forget_other_revisions(engines, new.name)  # as cached_engines does after a build
    assert not old_engines.exists()


def test_a_portable_bundle_is_refused_in_one_line(bundles):
    with pytest.raises(DFlashError, match="graph contract 1 bundle; the C\\+\\+ executors need contract 2") as err:
        LLM.from_bundle(bundles["llama"][0])
    assert "\n" not in str(err.value)


def test_from_bundle_runs_without_loading_pytorch_model_code(pair):
    """A fresh interpreter loads a bundle and generates; no model-definition module is imported."""
    import json
    import subprocess
    import sys

    script = (
        "import json, sys\n"
        "from dflash_trt import LLM, SamplingParams\n"
        f"llm = LLM.from_bundle({str(pair[0])!r}, block_size=4, max_batch=2, capacity=64)\n"
        "out = llm.generate([[5, 6, 7]], SamplingParams(max_tokens=6, ignore_eos=True))[0]\n"
        "print(json.dumps({'tokens': len(out.token_ids), 'modules': sorted(sys.modules)}))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["tokens"] == 6
    loaded = set(report["modules"])
    ours = {"dflash_trt.models.drafter", "dflash_trt.models.target", "dflash_trt.models.checkpoints",
            "dflash_trt.runtime.torch_backend", "dflash_trt.export.graphs"}
    assert not ours & loaded, ours & loaded
    assert not [m for m in loaded if m.startswith("transformers.models.") and ".modeling_" in m
                and not m.endswith("modeling_auto")]


def test_a_seeded_sampled_request_gets_the_torch_backends_tokens(pair):
    """Both backends run the core's sampling (Philox keys, sample-then-compare) on their own logits,
    which agree to float precision: a seeded T>0 request gets the same tokens from either."""
    bundle, ref = pair
    llm = LLM.from_bundle(bundle, block_size=4, max_batch=3)
    for seed in range(4):
        params = SamplingParams(max_tokens=16, temperature=0.8, top_p=0.9, top_k=50, seed=seed, ignore_eos=True)
        assert llm.generate(PROMPTS[:3], params)[1].token_ids == ref.generate(PROMPTS[1], params)[0].token_ids

"""backend="onnxruntime": the same verify loop over an exported bundle, token-identical to torch and AR."""

import pytest
import torch

from dflash_trt import LLM, SamplingParams


@pytest.fixture(scope="module")
def llms(bundles, tiny_pairs):
    return {family: (LLM.from_bundle(bundles[family][0]), LLM(*map(str, tiny_pairs[family])))
            for family in ("llama", "qwen3")}


@pytest.mark.parametrize("family", ["llama", "qwen3"])
@pytest.mark.parametrize("block", [2, 4, 8, 16])
def test_greedy_onnxruntime_equals_torch_and_autoregressive(llms, family, block):
    ort_llm, torch_llm = llms[family]
    ort_llm.block_size = torch_llm.block_size = block
    params = SamplingParams(max_tokens=24, ignore_eos=True)
    for prompt in ["hello there", "The quick brown fox", [5, 6, 7]]:
        ours = ort_llm.generate(prompt, params)[0]
        ar = ort_llm.generate(prompt, params, speculative=False)[0]
        ref = torch_llm.generate(prompt, params)[0]
        assert ours.token_ids == ar.token_ids == ref.token_ids
        # identical drafts: the same acceptance at every step as the torch backend
        assert ours.metrics.acceptance_lengths == ref.metrics.acceptance_lengths


def test_stop_strings_and_eos_behave_as_on_torch(llms):
    ort_llm, torch_llm = llms["qwen3"]
    params = SamplingParams(max_tokens=40, stop=["e"])
    for prompt in ["hello there", "abc"]:
        ours, ref = ort_llm.generate(prompt, params)[0], torch_llm.generate(prompt, params)[0]
        assert (ours.text, ours.finish_reason) == (ref.text, ref.finish_reason)
    assert ort_llm.eos_token_ids == torch_llm.eos_token_ids and ort_llm.vocab_size == torch_llm.vocab_size


def test_sampled_onnxruntime_matches_torch_with_the_same_seed(llms):
    ort_llm, torch_llm = llms["llama"]
    params = SamplingParams(max_tokens=20, temperature=0.8, top_p=0.9, seed=7, ignore_eos=True)
    assert ort_llm.generate("hi", params)[0].token_ids == torch_llm.generate("hi", params)[0].token_ids


def test_llm_with_backend_onnxruntime_exports_once_and_reuses(tiny_pairs, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    target, draft = map(str, tiny_pairs["qwen3"])
    first = LLM(target=target, draft=draft, backend="onnxruntime")
    (bundle,) = (tmp_path / "dflash-trt" / "bundles").iterdir()
    stamp = (bundle / "bundle.json").stat().st_mtime_ns
    second = LLM(target=target, draft=draft, backend="onnxruntime")
    assert (bundle / "bundle.json").stat().st_mtime_ns == stamp  # reused, not re-exported
    params = SamplingParams(max_tokens=12)
    assert first.generate("yo", params)[0].token_ids == second.generate("yo", params)[0].token_ids


@pytest.mark.parametrize("block", [4, 16])
def test_greedy_plugin_flavour_equals_torch(plugin_bundle, tiny_pairs, block):
    ours = LLM.from_bundle(plugin_bundle[0], block_size=block)
    ref = LLM(*map(str, tiny_pairs["qwen3"]), block_size=block)
    params = SamplingParams(max_tokens=24, ignore_eos=True)
    for prompt in ["hello there", [9, 8, 7, 6]]:
        a, b = ours.generate(prompt, params)[0], ref.generate(prompt, params)[0]
        assert a.token_ids == b.token_ids and a.metrics.acceptance_lengths == b.metrics.acceptance_lengths


def test_plugin_flavour_with_a_draft_vocabulary_equals_torch(tiny_pairs, tmp_path):
    """The llama drafter drafts from 89 of 264 ids: its plugin-flavour bundle passes the polygraphy
    check and decodes what the torch backend does, step for step."""
    from dflash_trt.export import op_library
    from dflash_trt.export.bundle import export_bundle
    from dflash_trt.models.checkpoints import load_drafter, load_target

    if not op_library.LIBRARY.is_file():
        pytest.skip("dflash op library not built (bash scripts/build_plugins.sh)")
    target_dir, draft_dir = tiny_pairs["llama"]
    target, tokenizer = load_target(str(target_dir))
    drafter = load_drafter(draft_dir)
    assert drafter.draft_vocab is not None
    path = export_bundle(target, drafter, tokenizer, tmp_path / "b", flavour="plugin", check=True)
    ours, ref = LLM.from_bundle(path, block_size=4), LLM(str(target_dir), str(draft_dir), block_size=4)
    params = SamplingParams(max_tokens=24, ignore_eos=True)
    for prompt in ["hello there", [9, 8, 7, 6]]:
        a, b = ours.generate(prompt, params)[0], ref.generate(prompt, params)[0]
        assert a.token_ids == b.token_ids and a.metrics.acceptance_lengths == b.metrics.acceptance_lengths


def test_from_bundle_runs_without_loading_pytorch_model_code(bundles):
    """A fresh interpreter loads a bundle and generates; no model-definition module is imported."""
    import json
    import subprocess
    import sys

    script = (
        "import json, sys\n"
        "from dflash_trt import LLM, SamplingParams\n"
        f"llm = LLM.from_bundle({str(bundles['llama'][0])!r})\n"
        "out = llm.generate([[5, 6, 7]], SamplingParams(max_tokens=6))[0]\n"
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


def test_steps_run_torch_on_one_thread_and_the_caller_keeps_its_own():
    from dflash_trt.runtime.ort_backend import lean_steps

    inside = []

    def steps():
        for index in range(3):
            inside.append(torch.get_num_threads())
            yield index

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        outside = [(step, torch.get_num_threads()) for step in lean_steps(steps())]
        assert inside == [1, 1, 1] and outside == [(0, 2), (1, 2), (2, 2)]
    finally:
        torch.set_num_threads(before)


def test_bundle_sessions_stop_spinning_after_each_run():
    from dflash_trt.export.op_library import session_options

    assert session_options(False).get_session_config_entry("session.force_spinning_stop") == "1"


def test_a_drafter_tapping_the_last_layer_decodes_as_on_torch(tiny_pairs, tmp_path):
    """HF reports the last layer's output after the final norm, and that is what the torch backend
    taps. The exported target graph must hand the drafter the same features, or a drafter trained
    on that tap drafts from other inputs on onnxruntime (and TensorRT)."""
    import numpy as np
    from factories import make_drafter

    from dflash_trt.export.bundle import export_bundle
    from dflash_trt.models.checkpoints import load_drafter, load_target
    from dflash_trt.runtime.ort_backend import OrtBundle, OrtTargetSession

    target_dir, _ = tiny_pairs["qwen3"]
    target, tokenizer = load_target(str(target_dir))
    last = target.num_layers - 1
    draft_dir = make_drafter(tmp_path / "draft", seed=3, block_size=4, target_layer_ids=[1, last])
    path = export_bundle(target, load_drafter(draft_dir), tokenizer, tmp_path / "bundle", check=False)

    prompt = [5, 9, 17, 33, 2, 71]
    _, ours = OrtTargetSession(OrtBundle(path)).prefill(prompt)
    _, ref = target.forward(prompt, target.new_cache(), (1, last))
    np.testing.assert_allclose(ours.numpy(), ref.numpy(), atol=1e-4, rtol=0)

    params = SamplingParams(max_tokens=24, ignore_eos=True)
    a = LLM.from_bundle(path, block_size=4).generate([9, 8, 7, 6], params)[0]
    b = LLM(str(target_dir), str(draft_dir), block_size=4).generate([9, 8, 7, 6], params)[0]
    assert a.token_ids == b.token_ids and a.metrics.acceptance_lengths == b.metrics.acceptance_lengths


@pytest.mark.parametrize("pair", ["llama", "qwen3", "small-vocab"])
def test_greedy_dflash_on_a_float16_bundle_equals_autoregressive_decoding_on_it(half_bundles, small_vocab_pair,
                                                                                 tmp_path, pair):
    """Caches, features and context K/V stay float16 from step to step, through every rollback. The
    6-token pair gets drafts accepted (the random tiny drafters of the others rarely do), so the
    accepted-prefix path runs on float16 caches too."""
    import numpy as np

    from dflash_trt.export.bundle import export_bundle
    from dflash_trt.models.checkpoints import load_drafter, load_target
    from dflash_trt.runtime.ort_backend import OrtBundle, OrtTargetSession

    if pair == "small-vocab":
        target_dir, draft_dir = small_vocab_pair
        target, _ = load_target(str(target_dir))
        path = export_bundle(target, load_drafter(draft_dir), None, tmp_path / "b", dtype="float16", check=False)
        prompts = [[1, 2, 3], [0, 4, 1, 1], [2]]
    else:
        path = half_bundles[pair, "float16"][0]
        prompts = ["hello there", [5, 6, 7]]
    target = OrtTargetSession(OrtBundle(path))
    logits, features = target.prefill([1, 2, 3])
    assert logits.dtype == torch.float32 and features.dtype == torch.float16 and target.past[0].dtype == np.float16
    llm = LLM.from_bundle(path)
    params = SamplingParams(max_tokens=40, ignore_eos=True)
    accepted = []
    for block in (2, 4):
        llm.block_size = block
        for prompt in prompts:
            ours = llm.generate(prompt, params)[0]
            assert ours.token_ids == llm.generate(prompt, params, speculative=False)[0].token_ids
            accepted += ours.metrics.acceptance_lengths
    if pair == "small-vocab":
        assert max(accepted) == 4  # a whole B=4 block accepted, at least once

"""`build`: engine bundles from ONNX bundles. onnxruntime engines decode exactly like AR; builds are
atomic; a tampered or mismatched bundle is refused in one line before anything loads."""

import json
import shutil

import pytest
from contract1_runner import generate

from dflash_trt import LLM, SamplingParams
from dflash_trt.engines import machine, ort_engine
from dflash_trt.engines.build import build_engines
from dflash_trt.engines.config import BuildConfig
from dflash_trt.engines.manifest import ENGINE_MANIFEST, read_engine_bundle
from dflash_trt.errors import DFlashError

ORT = BuildConfig(engine="onnxruntime", max_seq_len=256)


@pytest.fixture(scope="module")
def ort_engines(slots_bundles, tmp_path_factory):
    root = tmp_path_factory.mktemp("engines")
    return {family: build_engines(slots_bundles[family], root / family, ORT) and root / family
            for family in ("llama", "qwen3")}


def test_an_onnxruntime_engine_bundle_holds_optimized_graphs_and_a_manifest(ort_engines, slots_bundles):
    manifest = read_engine_bundle(ort_engines["qwen3"])
    assert manifest["engine"] == {"kind": "onnxruntime", "version": machine.installed_version("onnxruntime"),
                                  "session_options": ort_engine.SESSION_OPTIONS}
    assert set(manifest["engines"]) == {"target", "draft_context", "draft_block"}
    assert {"target.onnx", "target.onnx.data", "tokenizer.json"} <= set(manifest["files"])
    assert manifest["source"]["graphs"] == json.loads((slots_bundles["qwen3"] / "bundle.json").read_text())["graphs"]
    assert manifest["max_seq_len"] == 256 and manifest["block_size"] == 4 and manifest["dtype"] == "float32"
    import onnx

    ops = {node.op_type for node in onnx.load(str(ort_engines["qwen3"] / "target.onnx"), load_external_data=False).graph.node}
    assert "SimplifiedLayerNormalization" in ops  # ORT's fusions were applied and saved, not just a copy


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_greedy_on_the_onnxruntime_engine_equals_autoregressive_and_the_source_bundle(ort_engines, slots_bundles,
                                                                                     family):
    # pinned: adaptive blocks follow measured timings, so two runs could verify different blocks
    engine = LLM.from_bundle(ort_engines[family], block_size=4)
    source = LLM.from_bundle(slots_bundles[family], block_size=4)
    assert engine.backend == "onnxruntime"
    params = SamplingParams(max_tokens=24, ignore_eos=True)
    for prompt in ["hello there", [5, 6, 7]]:
        ours = engine.generate(prompt, params)[0]
        assert ours.token_ids == engine.generate(prompt, params, speculative=False)[0].token_ids
        assert ours.token_ids == source.generate(prompt, params)[0].token_ids
        assert ours.metrics.acceptance_lengths == source.generate(prompt, params)[0].metrics.acceptance_lengths


def test_a_failed_build_leaves_nothing_that_looks_complete(bundles, tmp_path, monkeypatch):
    out = tmp_path / "engines"
    real = ort_engine.build_ort_graph

    def fail_on_the_last_graph(source, dest, plugin):
        if source.name == "draft_block.onnx":
            raise RuntimeError("disk full")
        return real(source, dest, plugin)

    monkeypatch.setattr(ort_engine, "build_ort_graph", fail_on_the_last_graph)
    with pytest.raises(RuntimeError, match="disk full"):
        build_engines(bundles["qwen3"][0], out, ORT)
    assert list(tmp_path.iterdir()) == []  # neither OUT nor its hidden work directory


def test_a_rebuild_replaces_an_existing_bundle_only_with_force(ort_engines, bundles, tmp_path):
    out = tmp_path / "e"
    shutil.copytree(ort_engines["qwen3"], out)
    with pytest.raises(DFlashError, match="already exists; pass --force"):
        build_engines(bundles["qwen3"][0], out, ORT)
    build_engines(bundles["qwen3"][0], out, BuildConfig(engine="onnxruntime", max_seq_len=512, force=True))
    assert read_engine_bundle(out)["max_seq_len"] == 512


def _copy(ort_engines, tmp_path):
    out = tmp_path / "copy"
    shutil.copytree(ort_engines["qwen3"], out)
    return out


def test_a_tampered_engine_bundle_is_refused_before_loading(ort_engines, tmp_path):
    out = _copy(ort_engines, tmp_path)
    with (out / "draft_block.onnx").open("ab") as f:
        f.write(b"\0")
    with pytest.raises(DFlashError, match="draft_block.onnx does not match its hash"):
        LLM.from_bundle(out)
    (out / "draft_block.onnx").unlink()
    with pytest.raises(DFlashError, match="draft_block.onnx is missing from the engine bundle"):
        LLM.from_bundle(out)
    (out / ENGINE_MANIFEST).unlink()
    with pytest.raises(DFlashError, match="no bundle.json"):  # nothing marks it complete any more
        LLM.from_bundle(out)


def test_an_engine_bundle_from_a_newer_onnxruntime_is_refused(ort_engines, tmp_path):
    out = _copy(ort_engines, tmp_path)
    manifest = json.loads((out / ENGINE_MANIFEST).read_text())
    manifest["engine"]["version"] = "99.0.0"
    (out / ENGINE_MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(DFlashError, match="optimized by ONNX Runtime 99.0.0; this machine has"):
        LLM.from_bundle(out)


def test_a_block_larger_than_the_engines_were_built_for_is_refused(ort_engines):
    with pytest.raises(DFlashError, match="larger than the engines were built for"):
        LLM.from_bundle(ort_engines["qwen3"], block_size=8)


@pytest.mark.parametrize(("fields", "message"), [
    ({"engine": "onnxruntime", "dtype": "float16"}, "holds float32 graphs but --dtype asks for float16"),
    ({"engine": "onnxruntime", "block_size": 8}, "--block-size 8 is larger than the drafter's block size 4"),
])
def test_source_mismatches_are_refused_before_any_engine_is_built(bundles, tmp_path, fields, message):
    with pytest.raises(DFlashError, match=message):
        build_engines(bundles["qwen3"][0], tmp_path / "e", BuildConfig(**fields))
    assert not (tmp_path / "e").exists()


def test_a_plugin_bundle_is_not_offered_to_tensorrt_rtx(plugin_bundle, tmp_path):
    with pytest.raises(DFlashError, match="TensorRT-RTX cannot parse dflash:: custom ops"):
        build_engines(plugin_bundle[0], tmp_path / "e", BuildConfig(engine="tensorrt-rtx", compute_capabilities=("12.0",)))


def test_full_tensorrt_without_its_library_or_a_gpu_is_refused_in_one_line(bundles, tmp_path, monkeypatch):
    monkeypatch.setattr(machine, "installed_version", lambda kind: None)
    with pytest.raises(DFlashError, match="--engine tensorrt needs TensorRT, which does not import here"):
        build_engines(bundles["qwen3"][0], tmp_path / "e", BuildConfig(engine="tensorrt"))
    monkeypatch.setattr(machine, "installed_version", lambda kind: "10.14.1")
    import torch

    if not torch.cuda.is_available():
        with pytest.raises(DFlashError, match="no CUDA GPU is visible here"):
            build_engines(bundles["qwen3"][0], tmp_path / "e", BuildConfig(engine="tensorrt"))
    assert not (tmp_path / "e").exists()


def test_onnxruntime_engines_of_graphs_it_cannot_run_are_refused_before_building(half_bundles, tmp_path):
    with pytest.raises(DFlashError, match="--engine onnxruntime cannot run bfloat16 portable-flavour graphs"):
        build_engines(half_bundles["qwen3", "bfloat16"][0], tmp_path / "e", ORT)
    assert not (tmp_path / "e").exists()


def test_a_float16_onnxruntime_engine_decodes_like_autoregressive_on_it(half_bundles, tmp_path):
    out = tmp_path / "e"
    build_engines(half_bundles["llama", "float16"][0], out, ORT)  # portable (contract 1): for engine builds
    params = SamplingParams(max_tokens=20, ignore_eos=True)
    assert generate(out, [7, 8, 9], params, 4)[0] == generate(out, [7, 8, 9], params)[0]

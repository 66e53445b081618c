"""`dflash-trt build` and `inspect` on engine bundles, end to end through the command line."""

import json

import pytest
from click.testing import CliRunner

from dflash_trt import LLM, SamplingParams
from dflash_trt.cli import main
from dflash_trt.engines.manifest import read_engine_bundle


def test_build_from_a_pair_exports_then_builds_and_the_bundle_decodes_like_the_pair(tiny_pairs, tmp_path):
    target, draft = map(str, tiny_pairs["qwen3"])
    out = tmp_path / "engines" / "tiny"
    result = CliRunner().invoke(main, ["build", "--target", target, "--draft", draft, "-o", str(out), "--engine", "onnxruntime",
                                       "--max-seq-len", "128"])
    assert result.exit_code == 0, result.output
    assert "target.onnx" in result.stdout and "engine bundle written to" in result.stdout
    assert [p.name for p in out.parent.iterdir()] == ["tiny"]  # the intermediate ONNX export is gone
    manifest = read_engine_bundle(out)
    assert manifest["command"].startswith("dflash-trt build --target") and manifest["max_seq_len"] == 128
    params = SamplingParams(max_tokens=16, ignore_eos=True)
    result = CliRunner().invoke(main, ["generate", "--bundle", str(out), "--max-tokens", "16", "--json", "hi"])
    assert result.exit_code == 0, result.output
    expected = LLM(target, draft, backend="torch").generate("hi", SamplingParams(max_tokens=16))[0]
    assert json.loads(result.stdout)["token_ids"] == expected.token_ids
    torch_llm = LLM(target, draft, backend="torch")
    assert LLM.from_bundle(out).generate([3, 4], params)[0].token_ids == torch_llm.generate([3, 4], params)[0].token_ids


def test_build_exports_slots_trt_with_its_capacity_and_the_bundle_runs_batched(tiny_pairs, tmp_path):
    """build --flavour slots-trt --capacity: the export inside build fixes the capacity, the engine
    bundle records it, and LLM.from_bundle takes it (the C++ executor; onnxruntime engines here)."""
    target, draft = map(str, tiny_pairs["qwen3"])
    out = tmp_path / "e"
    args = ["build", "--target", target, "--draft", draft, "-o", str(out), "--engine", "onnxruntime",
            "--flavour", "slots-trt", "--max-seq-len", "64"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2 and "--flavour slots-trt needs --capacity N" in result.output
    result = CliRunner().invoke(main, [*args, "--capacity", "64"])
    assert result.exit_code == 0, result.output
    manifest = read_engine_bundle(out)
    assert (manifest["source"]["capacity"], manifest["max_batch"]) == (64, 8)  # batched graphs: 8 rows by default
    result = CliRunner().invoke(main, ["inspect", str(out)])
    assert "source bundle: slots-trt flavour, graph contract 2, KV capacity 64 (static)" in result.stdout
    assert "draft dflash, " in result.stdout and "draft rules point-mass\n" in result.stdout  # slots-trt's default
    llm = LLM.from_bundle(out)
    assert llm.capacity == 64
    params = SamplingParams(max_tokens=8, ignore_eos=True)
    torch_llm = LLM(target, draft, backend="torch")
    assert llm.generate([3, 4], params)[0].token_ids == torch_llm.generate([3, 4], params)[0].token_ids


def test_inspect_describes_an_engine_bundle(bundles, tmp_path):
    out = tmp_path / "e"
    result = CliRunner().invoke(main, ["build", "--bundle", str(bundles["llama"][0]), "-o", str(out), "--engine", "onnxruntime"])
    assert result.exit_code == 0, result.output
    result = CliRunner().invoke(main, ["inspect", str(out)])
    assert result.exit_code == 0, result.output
    assert "engine bundle, format 1, all file hashes match" in result.stdout
    assert "profiles target: prefill batch 1..1 (opt 1), new 1..2048 (opt 256)" in result.stdout
    assert "plugin library: none" in result.stdout and "source bundle: portable flavour" in result.stdout


@pytest.mark.parametrize(("args", "message"), [
    (["--engine", "tensorrt-rtx"], "name the GPUs with --compute-capability"),
    (["--compute-capability", "9.0"], "TensorRT-RTX has no Hopper target"),
    (["--engine", "onnxruntime", "--target", "x"], "pass either --bundle or --target/--draft, not both"),
    (["--engine", "onnxruntime", "--dtype", "fp16"], "holds float32 graphs but --dtype asks for float16"),
    (["--engine", "onnxruntime", "--capacity", "64"], "a --bundle keeps the capacity it was exported with"),
])
def test_bad_build_requests_are_one_line_and_write_nothing(bundles, tmp_path, args, message):
    out = tmp_path / "e"
    result = CliRunner().invoke(main, ["build", "--bundle", str(bundles["llama"][0]), "-o", str(out), *args])
    assert result.exit_code == 2, result.output
    assert message in result.output and result.output.count("Error:") == 1
    assert not out.exists()

"""TensorRT-RTX really builds our graphs here, on a CPU, ahead of time for consumer GPUs (SM120)."""

import pytest

from dflash_trt import LLM
from dflash_trt.engines.build import build_engines
from dflash_trt.engines.config import BuildConfig
from dflash_trt.engines.manifest import read_engine_bundle
from dflash_trt.errors import DFlashError

trt = pytest.importorskip("tensorrt_rtx", reason="TensorRT-RTX is not installed (pip install tensorrt-rtx-cu13)")


@pytest.fixture(scope="module")
def rtx_bundle(bundles, tmp_path_factory):
    out = tmp_path_factory.mktemp("rtx") / "qwen3"
    build_engines(bundles["qwen3"][0], out, BuildConfig(engine="tensorrt-rtx", compute_capabilities=("12.0", "8.9"),
                                                        max_seq_len=128))
    return out


def test_an_sm120_build_writes_one_engine_per_graph_with_its_profiles(rtx_bundle):
    manifest = read_engine_bundle(rtx_bundle)
    assert manifest["engine"] == {"kind": "tensorrt-rtx", "version": trt.__version__}
    assert manifest["compute_capabilities"] == ["12.0", "8.9"]
    assert {name: info["file"] for name, info in manifest["engines"].items()} == {
        "target": "target.engine", "draft_context": "draft_context.engine", "draft_block": "draft_block.engine"}
    assert list(manifest["profiles"]["target"]) == ["prefill", "verify"]
    for info in manifest["engines"].values():
        data = (rtx_bundle / info["file"]).read_bytes()
        assert len(data) == info["bytes"] > 100_000


def test_the_engines_refuse_to_load_without_a_gpu_in_one_line(rtx_bundle):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is visible: the engines would load")
    with pytest.raises(DFlashError, match="holds TensorRT engines for SM 12.0, 8.9 and no CUDA GPU is visible here"):
        LLM.from_bundle(rtx_bundle)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_precision_bundles_build_for_sm120_as_strongly_typed_engines(half_bundles, tmp_path, dtype):
    out = tmp_path / dtype
    build_engines(half_bundles["qwen3", dtype][0], out, BuildConfig(engine="tensorrt-rtx", compute_capabilities=("12.0",),
                                                                    max_seq_len=128))
    manifest = read_engine_bundle(out)
    assert manifest["dtype"] == dtype and manifest["source"]["graphs"]["target"]["inputs"][3]["dtype"] == dtype
    # what TensorRT itself typed the bindings as (strongly typed: the graph's own dtypes)
    expected = {"float16": "HALF", "bfloat16": "BF16"}[dtype]
    target = manifest["engines"]["target"]["io"]
    assert target["past_key_0"] == target["present_key_0"] == target["features"] == expected
    assert target["logits"] == "FLOAT" and target["input_ids"] == "INT64"
    assert manifest["engines"]["draft_block"]["io"]["context_key_0"] == expected

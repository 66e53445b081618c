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


@pytest.mark.parametrize("family", ["qwen3_next", "qwen3_5_text", "qwen3_5_moe_text"])
def test_hybrid_targets_build_for_sm120_with_their_states_as_engine_io(hybrid_bundles, tmp_path, family):
    """Gated DeltaNet layers as standard-op Loops (no sequence ops): TensorRT-RTX parses and builds them;
    the recurrent states stay float32 bindings, the conv states take the bundle's dtype."""
    out = tmp_path / family
    build_engines(hybrid_bundles[family][2], out, BuildConfig(engine="tensorrt-rtx", compute_capabilities=("12.0",),
                                                              max_seq_len=128))
    manifest = read_engine_bundle(out)
    target = manifest["engines"]["target"]["io"]
    for layer in (0, 2):  # the linear-attention layers
        assert target[f"conv_state_{layer}"] == target[f"conv_window_{layer}"] == "FLOAT"
        assert target[f"recurrent_state_{layer}"] == target[f"recurrent_states_{layer}"] == "FLOAT"
    assert "past_key_1" in target and "past_key_0" not in target  # K/V for the full-attention layers only
    assert manifest["source"]["target"]["linear_attention"]["conv_kernel"] == 4
    assert (out / "target.engine").stat().st_size == manifest["engines"]["target"]["bytes"] > 100_000


def test_a_bfloat16_hybrid_bundle_builds_as_a_strongly_typed_engine(hybrid_bundles, tmp_path):
    from dflash_trt.export.bundle import export_bundle
    from dflash_trt.models.checkpoints import load_drafter

    target_dir, draft_dir, _, target = hybrid_bundles["qwen3_5_moe_text"]
    source = export_bundle(target, load_drafter(draft_dir), None, tmp_path / "bf16", dtype="bfloat16", check=False)
    build_engines(source, tmp_path / "e", BuildConfig(engine="tensorrt-rtx", compute_capabilities=("12.0",), max_seq_len=128))
    target_io = read_engine_bundle(tmp_path / "e")["engines"]["target"]["io"]
    assert target_io["conv_state_0"] == target_io["features"] == "BF16" and target_io["recurrent_state_0"] == "FLOAT"


@pytest.fixture(scope="module")
def wide_pair(tmp_path_factory):
    """A tiny pair wide enough that the target engine's size is mostly its weights, and its float32
    slots-trt target engine's size."""
    from factories import make_drafter, make_target

    from dflash_trt.export.bundle import export_bundle
    from dflash_trt.models.checkpoints import load_drafter, load_target

    root = tmp_path_factory.mktemp("wide")
    wide = dict(hidden_size=512, intermediate_size=1024, num_attention_heads=8, num_key_value_heads=4, head_dim=64)
    target, tokenizer = load_target(str(make_target(root / "t", "qwen3", **wide)))
    drafter = load_drafter(make_drafter(root / "d", block_size=4, target_layer_ids=[1, 2], hidden_size=512))

    def build(quant, capabilities, draft_quant=None):
        bundle = export_bundle(target, drafter, tokenizer, root / f"b-{quant}-{draft_quant}", flavour="slots-trt",
                               capacity=64, check=False, quant=quant, draft_quant=draft_quant, force=True)
        out = root / f"rtx-{quant}-{draft_quant}-{'-'.join(capabilities)}"
        build_engines(bundle, out, BuildConfig(engine="tensorrt-rtx", compute_capabilities=capabilities,
                                               max_seq_len=64, force=True))
        return bundle, read_engine_bundle(out)

    float_bundle, float_manifest = build(None, ("12.0",))
    return build, (float_bundle / "target.onnx.data").stat().st_size, float_manifest["engines"]


@pytest.mark.parametrize("quant, capabilities, saved", [
    ("int4", ("12.0",), 0.6),  # 4 bits and a float32 scale per 32: 1/6.4 of float32
    ("int4-awq", ("12.0",), 0.6),  # the same writer after ModelOpt's AWQ rescaled the weights
    ("fp8", ("12.0", "8.9"), 0.6),  # 8 bits: 1/4
    ("nvfp4", ("12.0",), 0.7),  # 4 bits and an 8-bit scale per 16: 1/7.1
])
def test_a_quantized_slots_trt_target_builds_with_its_weights_kept_quantized(wide_pair, quant, capabilities, saved):
    """TensorRT-RTX parses each format's DequantizeLinear as weight-only quantization for the named
    GPUs: the target engine is smaller than the float32 one by most of the float weights."""
    build, float_weights, float_engines = wide_pair
    bundle, manifest = build(quant, capabilities)
    assert manifest["source"]["quant"]["weights"] == quant and manifest["compute_capabilities"] == list(capabilities)
    saving = float_engines["target"]["bytes"] - manifest["engines"]["target"]["bytes"]
    assert saving > saved * float_weights, (manifest["engines"], float_weights)


@pytest.mark.parametrize("draft_quant, capabilities", [("fp8", ("8.9",)), ("nvfp4", ("12.0",))])
def test_a_drafter_in_a_float_format_builds_smaller_draft_engines(wide_pair, draft_quant, capabilities):
    """--draft-quant fp8 / nvfp4: the draft graphs (converted to the format's opset) parse and build,
    and the draft block engine is smaller than the float one's for the same GPU. Its small matrices
    (64-512 wide) save less than their bytes say (42 % / 22 % of the float weights, against the
    target's 70 %+): an engine's per-matmul overhead dominates there (measured with single matmuls for
    SM 12.0: nvfp4 saves -15 % of the float bytes at 512x64, 35 % at 512x128, 73 % at 512x512, 83 %
    at 1024x1024)."""
    build, _, _ = wide_pair
    float_bundle, float_manifest = build(None, capabilities)
    _, manifest = build(None, capabilities, draft_quant)
    assert manifest["source"]["draft_quant"]["weights"] == draft_quant
    weights = (float_bundle / "draft_block.onnx.data").stat().st_size
    saving = float_manifest["engines"]["draft_block"]["bytes"] - manifest["engines"]["draft_block"]["bytes"]
    assert saving > 0.15 * weights, (saving, weights)


@pytest.mark.parametrize("kind, dtype", [("draft-vocabulary", "bfloat16"), ("dflash2", "float16")])
def test_a_slots_trt_draft_block_with_its_draft_distribution_builds_for_sm120(tiny_pairs, tmp_path, kind, dtype):
    """export --flavour slots-trt --draft-distribution: the block pass's extra outputs (a drafter's
    float32 logits over its draft vocabulary; a DFlash2 selector's tables) are engine outputs TensorRT
    types as the export declared them, for the TensorRT executor's drafter rule. The half-precision
    target builds at one row (a static batch dimension: TensorRT-RTX 1.7 failed to compile half
    Attentions sharing a bool mask there; the export's mask is additive)."""
    from factories import make_dflash2_drafter, make_target

    from dflash_trt.export.bundle import export_bundle
    from dflash_trt.models.checkpoints import load_drafter, load_target

    if kind == "dflash2":
        target_dir = make_target(tmp_path / "t", "qwen3", vocab_size=8, tokenizer=False, seed=3)
        draft_dir = make_dflash2_drafter(tmp_path / "d", seed=4, vocab_size=8, mask_token_id=7)
    else:
        target_dir, draft_dir = tiny_pairs["llama"]
    target, drafter = load_target(str(target_dir), dtype=getattr(__import__("torch"), dtype))[0], load_drafter(draft_dir)
    bundle = export_bundle(target, drafter, None, tmp_path / "b", flavour="slots-trt", capacity=64, dtype=dtype,
                           check=False, draft_distribution=True)
    build_engines(bundle, tmp_path / "e", BuildConfig(engine="tensorrt-rtx", compute_capabilities=("12.0",),
                                                      max_seq_len=64))
    io = read_engine_bundle(tmp_path / "e")["engines"]["draft_block"]["io"]
    expected = ({"selector_scores": "FLOAT", "selector_columns": "INT64"} if kind == "dflash2"
                else {"draft_logits": "FLOAT"})
    assert {name: io[name] for name in expected} == expected and io["draft_tokens"] == "INT64"
    assert (tmp_path / "e" / "draft_vocab.json").is_file() == (kind == "draft-vocabulary")

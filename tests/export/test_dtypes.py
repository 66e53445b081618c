"""Half-precision bundles (float16, bfloat16): graphs, manifest, the check at export, refusals."""

import json
import shutil

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from click.testing import CliRunner

from dflash_trt import LLM
from dflash_trt.cli import main
from dflash_trt.errors import DFlashError
from dflash_trt.export import op_library
from dflash_trt.export.bundle import export_bundle
from dflash_trt.export.graphs import kv_names
from dflash_trt.export.manifest import MANIFEST, read_bundle
from dflash_trt.models.checkpoints import load_drafter, load_target
from block_logits import run_with_logits

# float16 graphs against the float32 bundle's, both on onnxruntime. float16 keeps 11 significant
# bits (~5e-4 relative per rounding) and the error compounds over the tiny models' 4 target and 2
# draft layers: measured at most 0.005 on outputs of magnitude 2-3 (numpy allows atol + rtol*|want|).
ATOL = 1e-2
RTOL = 1e-2
GRAPHS = ("target", "draft_context", "draft_block")
NO_BF16 = "skipped: onnxruntime's CPU provider has no bfloat16 kernels (MatMul, Mul)"


def run(bundle, name, feed):
    return ort.InferenceSession(str(bundle / f"{name}.onnx"), providers=["CPUExecutionProvider"]).run(None, feed)


def halved(feed: dict) -> dict:
    return {k: v.astype(np.float16) if v.dtype == np.float32 else v for k, v in feed.items()}


def assert_close(half: list, full: list, names: list[str]) -> None:
    for name, got, want in zip(names, half, full, strict=True):
        expected = np.int64 if want.dtype == np.int64 else np.float32 if name.endswith("logits") else np.float16
        assert got.dtype == expected, name
        np.testing.assert_allclose(got.astype(np.float32), want, atol=ATOL, rtol=RTOL, err_msg=name)


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_float16_graphs_compute_what_the_float32_graphs_do(bundles, half_bundles, family):
    full = bundles[family][0]
    half, target, drafter = half_bundles[family, "float16"]
    g = torch.Generator().manual_seed(3)
    cfg = target.config
    # target: a 6-token prefill on two rows, then 4 tokens over each bundle's own cache, row 1 rolled back to 3
    empty = np.zeros((2, cfg.num_key_value_heads, 0, cfg.head_dim), np.float32)
    feed = {"input_ids": torch.randint(0, target.vocab_size, (2, 6), generator=g).numpy(),
            "past_lengths": np.zeros(2, np.int64), "logits_from": np.array(0)}
    feed |= {n: empty for n in kv_names("past", target.num_layers)}
    names = ["logits", "features"] + kv_names("present", target.num_layers)
    first_full, first_half = run(full, "target", feed), run(half, "target", halved(feed))
    assert_close(first_half, first_full, names)
    feed = {"input_ids": torch.randint(0, target.vocab_size, (2, 4), generator=g).numpy(),
            "past_lengths": np.array([6, 3]), "logits_from": np.array(0)}
    past = kv_names("past", target.num_layers)
    second_full = run(full, "target", feed | dict(zip(past, first_full[2:], strict=True)))
    second_half = run(half, "target", feed | dict(zip(past, first_half[2:], strict=True)))
    assert_close(second_half, second_full, names)

    feed = {"features": torch.randn(2, 5, drafter.fc.in_features, generator=g).numpy(),
            "positions": np.stack([np.arange(3, 8), np.arange(0, 5)])}
    assert_close(run(half, "draft_context", halved(feed)), run(full, "draft_context", feed),
                 kv_names("context", drafter.config.num_layers))

    arch = drafter.config.arch
    feed = {"block_ids": torch.randint(0, target.vocab_size, (2, 4), generator=g).numpy(),
            "context_lengths": np.array([7, 2])}
    feed |= {n: torch.randn(2, arch.num_key_value_heads, 7, arch.head_dim, generator=g).numpy()
             for n in kv_names("context", drafter.config.num_layers)}
    assert_close(run_with_logits(half / "draft_block.onnx", halved(feed)),
                 run_with_logits(full / "draft_block.onnx", feed), ["block logits (bundle dtype)", "draft_tokens"])


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_rms_norms_square_in_float32(half_bundles, dtype):
    """Activations past 256 square beyond float16's 65504. HF's RMSNorm computes the variance in
    float32 and the graphs must keep that cast. Read from the graphs, not their outputs: onnxruntime
    runs float16 Pow and ReduceMean in float32 anyway, so only a GPU engine would show the overflow."""
    path = half_bundles["qwen3", dtype][0]
    for graph in GRAPHS:
        model = onnx.shape_inference.infer_shapes(onnx.load(str(path / f"{graph}.onnx"), load_external_data=False))
        types = {v.name: v.type.tensor_type.elem_type for v in [*model.graph.value_info, *model.graph.input]}
        variances = [n.input[0] for n in model.graph.node if n.op_type == "ReduceMean"]
        assert variances and {types[name] for name in variances} == {onnx.TensorProto.FLOAT}, graph


def test_the_manifest_records_the_dtype_and_each_graph_io_in_it(half_bundles):
    for (_, dtype), (path, _, _) in half_bundles.items():
        manifest = read_bundle(path)
        assert manifest["dtype"] == dtype
        io = {x["name"]: x["dtype"] for g in manifest["graphs"].values() for x in g["inputs"] + g["outputs"]}
        assert io["logits"] == "float32" and "draft_logits" not in io  # the block pass returns ids only
        assert {io[n] for n in ("input_ids", "past_lengths", "block_ids", "positions", "draft_tokens")} == {"int64"}
        assert {t for n, t in io.items() if "_key_" in n or "_value_" in n or n == "features"} == {dtype}
        # the graph files agree (polygraphy inspect checked their I/O at export), weights included
        model = onnx.load(str(path / "draft_block.onnx"), load_external_data=False)
        matrices = {t.data_type for t in model.graph.initializer if len(t.dims) == 2}
        assert matrices == {{"float16": onnx.TensorProto.FLOAT16, "bfloat16": onnx.TensorProto.BFLOAT16}[dtype]}


def test_export_checks_float16_on_onnxruntime_and_records_why_bfloat16_was_not(half_bundles):
    checks = read_bundle(half_bundles["qwen3", "float16"][0])["checks"]["polygraphy_vs_pytorch"]
    assert checks == {"atol_rms": 5e-2, "rtol": 1e-2, **dict.fromkeys(GRAPHS, "passed")}
    checks = read_bundle(half_bundles["qwen3", "bfloat16"][0])["checks"]["polygraphy_vs_pytorch"]
    assert checks == dict.fromkeys(GRAPHS, NO_BF16)


def test_onnxruntime_cannot_load_bfloat16_graphs(half_bundles):
    """The measurement behind the bfloat16 refusal: when an onnxruntime loads these, lift it."""
    path = half_bundles["qwen3", "bfloat16"][0]
    for graph in GRAPHS:
        with pytest.raises(Exception, match="NOT_IMPLEMENTED : Could not find an implementation for"):
            ort.InferenceSession(str(path / f"{graph}.onnx"), providers=["CPUExecutionProvider"])


def test_a_half_export_leaves_the_source_models_as_they_were(tiny_pairs, tmp_path):
    target_dir, draft_dir = tiny_pairs["llama"]  # tied embeddings and a draft vocabulary: shared weights
    target, tokenizer = load_target(str(target_dir))
    drafter = load_drafter(draft_dir)

    def tensors():
        return {f"{who}.{name}": t.detach().clone() for who, m in (("target", target.model), ("draft", drafter))
                for name, t in [*m.named_parameters(), *m.named_buffers()]}

    before = tensors()
    export_bundle(target, drafter, tokenizer, tmp_path / "b", dtype="bfloat16", check=False)
    after = tensors()
    assert before.keys() == after.keys()
    for name, t in before.items():
        assert after[name].dtype == t.dtype and torch.equal(after[name], t), name
    assert {t.dtype for t in after.values() if t.is_floating_point()} == {torch.float32}


def test_a_float16_plugin_bundle_checks_its_target_graph_and_refuses_onnxruntime(tiny_pairs, tmp_path, monkeypatch):
    """The op library runs float32 only: the export checks the standard target graph, records why
    the dflash graphs were not checked (without needing the library), and onnxruntime refuses it."""
    target_dir, draft_dir = tiny_pairs["qwen3"]
    target, tokenizer = load_target(str(target_dir))
    monkeypatch.setattr(op_library, "LIBRARY", tmp_path / "missing.so")
    path = export_bundle(target, load_drafter(draft_dir), tokenizer, tmp_path / "b", flavour="plugin",
                         dtype="float16", check=True)
    checks = read_bundle(path)["checks"]["polygraphy_vs_pytorch"]
    skipped = "skipped: the dflash onnxruntime op library runs float32 only"
    assert (checks["target"], checks["draft_context"], checks["draft_block"]) == ("passed", skipped, skipped)
    with pytest.raises(DFlashError, match="a graph contract 1 bundle; the C\\+\\+ executors need contract 2") as err:
        LLM.from_bundle(path)  # for TensorRT builds only
    assert "\n" not in str(err.value)


def test_bfloat16_portable_bundles_are_refused_by_the_runtime_in_one_line(half_bundles):
    with pytest.raises(DFlashError, match="a graph contract 1 bundle; the C\\+\\+ executors need contract 2") as err:
        LLM.from_bundle(half_bundles["qwen3", "bfloat16"][0])
    assert "\n" not in str(err.value)


def test_unknown_dtypes_are_refused_and_bundles_without_one_are_float32(bundles, slots_bundles, tmp_path):
    _, target, drafter = bundles["qwen3"]
    path = slots_bundles["qwen3"]
    with pytest.raises(DFlashError, match="unknown dtype 'float64'; choose one of float32, float16, bfloat16"):
        export_bundle(target, drafter, None, tmp_path / "b", dtype="float64", check=False)
    assert not (tmp_path / "b").exists()
    for dtype in (None, "int8"):  # None: written before bundles recorded a dtype
        copy = tmp_path / f"copy-{dtype}"
        shutil.copytree(path, copy)
        manifest = json.loads((copy / MANIFEST).read_text())
        manifest.pop("dtype")
        if dtype:
            manifest["dtype"] = dtype
        (copy / MANIFEST).write_text(json.dumps(manifest))
        if dtype:
            with pytest.raises(DFlashError, match="unknown dtype 'int8'"):
                read_bundle(copy)
        else:
            assert read_bundle(copy)["dtype"] == "float32"
            assert LLM.from_bundle(copy, max_batch=1, capacity=512).generate([5, 6, 7])[0].token_ids


def test_cli_inspect_shows_the_dtype(half_bundles):
    result = CliRunner().invoke(main, ["inspect", str(half_bundles["qwen3", "float16"][0])])
    assert result.exit_code == 0, result.output
    assert "portable flavour, float16, opset" in result.stdout
    assert "output logits float32[batch, new-logits_from, 264]" in result.stdout
    assert "output features float16[batch, new, 128]" in result.stdout


def test_cli_export_says_which_checks_onnxruntime_could_not_run(small_vocab_pair, tmp_path):
    target_dir, draft_dir = small_vocab_pair
    result = CliRunner().invoke(main, ["export", "--target", str(target_dir), "--draft", str(draft_dir),
                                       "-o", str(tmp_path / "b"), "--dtype", "bf16"])
    assert result.exit_code == 0, result.output
    assert read_bundle(tmp_path / "b")["dtype"] == "bfloat16"
    for graph in GRAPHS:
        assert f"{graph}.onnx: onnxruntime check {NO_BF16}" in result.output

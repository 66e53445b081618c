"""The bundle on disk: contents, manifest, the polygraphy check, refusals, and no half-written bundles."""

import json
import shutil

import pytest
from contract1_runner import OrtBundle
from click.testing import CliRunner

from dflash_trt import LLM
from dflash_trt.cli import main
from dflash_trt.errors import DFlashError
from dflash_trt.export import bundle as bundle_module
from dflash_trt.export import op_library
from dflash_trt.export.bundle import export_bundle
from dflash_trt.export.manifest import MANIFEST, read_bundle, sha256
from dflash_trt.models.checkpoints import load_drafter, load_target


def test_bundle_holds_graphs_weights_tokenizer_and_a_manifest(bundles):
    path, target, drafter = bundles["qwen3"]
    manifest = read_bundle(path)
    for graph in ("target", "draft_context", "draft_block"):
        assert (path / f"{graph}.onnx").is_file() and (path / f"{graph}.onnx.data").is_file()
        assert manifest["graphs"][graph]["file"] == f"{graph}.onnx"
    # weights live in external data: the graph files themselves stay small
    assert (path / "target.onnx").stat().st_size < (path / "target.onnx.data").stat().st_size
    assert (path / "tokenizer.json").is_file()
    assert manifest["draft"]["block_size"] == drafter.config.block_size
    assert manifest["draft"]["target_layer_ids"] == list(drafter.config.target_layer_ids)
    assert manifest["target"]["num_layers"] == target.num_layers and manifest["flavour"] == "portable"
    assert manifest["files"]["target.onnx.data"] == sha256(path / "target.onnx.data")
    names = [io["name"] for io in manifest["graphs"]["target"]["inputs"]]
    assert names[:4] == ["input_ids", "past_lengths", "logits_from", "past_key_0"]


def test_export_runs_polygraphy_against_pytorch(tiny_pairs, tmp_path):
    target_dir, draft_dir = tiny_pairs["llama"]
    target, tokenizer = load_target(str(target_dir))
    out = export_bundle(target, load_drafter(draft_dir), tokenizer, tmp_path / "b", check=True)
    checks = read_bundle(out)["checks"]["polygraphy_vs_pytorch"]
    assert {checks[g] for g in ("target", "draft_context", "draft_block")} == {"passed"}


@pytest.mark.parametrize("dtype, skew", [("float32", 1.01), ("float16", 1.1)])
def test_polygraphy_check_catches_a_wrong_graph(tiny_pairs, tmp_path, monkeypatch, dtype, skew):
    """Swap in a graph that computes something else: the check must refuse the bundle (float16 is
    checked within 5% of each output's RMS, so its wrong graph is off by more)."""
    target_dir, draft_dir = tiny_pairs["llama"]
    target, tokenizer = load_target(str(target_dir))
    drafter = load_drafter(draft_dir)
    real = bundle_module.DraftContextGraph

    class Skewed(real):
        def forward(self, features, positions):
            return tuple(t * skew for t in super().forward(features, positions))

    exported = []
    monkeypatch.setattr(bundle_module, "DraftContextGraph", Skewed)
    original_check = bundle_module.check_graph

    def check_against_the_true_module(graph, module, *args, **kwargs):
        exported.append(graph.name)
        return original_check(graph, real(drafter) if isinstance(module, Skewed) else module, *args, **kwargs)

    monkeypatch.setattr(bundle_module, "check_graph", check_against_the_true_module)
    with pytest.raises(DFlashError, match="polygraphy: draft_context.onnx on onnxruntime differs from PyTorch"):
        export_bundle(target, drafter, tokenizer, tmp_path / "b", check=True, dtype=dtype)
    assert "draft_context.onnx" in exported and not (tmp_path / "b").exists()


def test_a_failed_export_leaves_nothing_that_looks_complete(tiny_pairs, tmp_path, monkeypatch):
    target_dir, draft_dir = tiny_pairs["qwen3"]
    target, tokenizer = load_target(str(target_dir))
    real = bundle_module._export_graph

    def fail_on_the_last_graph(module, spec, path, *args):
        if path.name == "draft_block.onnx":
            raise RuntimeError("disk full")
        return real(module, spec, path, *args)

    monkeypatch.setattr(bundle_module, "_export_graph", fail_on_the_last_graph)
    with pytest.raises(RuntimeError, match="disk full"):
        export_bundle(target, load_drafter(draft_dir), tokenizer, tmp_path / "b", check=False)
    assert list(tmp_path.iterdir()) == []  # neither the bundle nor its temporary sibling


def test_export_refusals_are_one_line(tiny_pairs, hybrid_target, bundles, tmp_path, monkeypatch):
    import dflash_trt.export.graphs as graphs

    target, tokenizer = load_target(str(hybrid_target))
    monkeypatch.setattr(graphs, "EXPORTABLE_TARGETS", frozenset({"llama", "qwen3"}))  # a family without graphs
    with pytest.raises(DFlashError, match="model_type 'qwen3_next' has no ONNX graph yet"):
        export_bundle(target, load_drafter(tiny_pairs["qwen3"][1]), tokenizer, tmp_path / "hybrid", check=False)
    assert not (tmp_path / "hybrid").exists()
    monkeypatch.undo()
    path, target, drafter = bundles["qwen3"]
    with pytest.raises(DFlashError, match="already exists; pass --force"):
        export_bundle(target, drafter, None, path, check=False)
    with pytest.raises(DFlashError, match="unknown flavour 'fast'"):
        export_bundle(target, drafter, None, tmp_path / "p", flavour="fast", check=False)
    with pytest.raises(DFlashError, match="--draft-distribution is for --flavour slots or slots-trt"):
        export_bundle(target, drafter, None, tmp_path / "p", flavour="portable", check=False, draft_distribution=True)
    assert not (tmp_path / "p").exists()


def test_the_cli_asks_for_a_draft_distribution_when_exporting_and_refuses_it_elsewhere(tiny_pairs, bundles, tmp_path):
    """slots-trt exports the drafter rule's outputs only with --draft-distribution (a TensorRT engine
    writes every output at every draft step); slots does unless told not to; a flavour without the C++
    executors, and a build from an exported bundle, refuse the flag in one line before any work."""
    target, draft = map(str, tiny_pairs["llama"])

    def draft_outputs(*args) -> list[str]:
        out = tmp_path / "-".join(a.strip("-") for a in args)
        result = CliRunner().invoke(main, ["export", "--target", target, "--draft", draft, "-o", str(out),
                                           "--no-check", *args])
        assert result.exit_code == 0, result.output
        return [o["name"] for o in read_bundle(out)["graphs"]["draft_block"]["outputs"]]

    assert draft_outputs("--flavour", "slots-trt", "--capacity", "64") == ["draft_tokens"]
    assert draft_outputs("--flavour", "slots-trt", "--capacity", "64", "--draft-distribution") == ["draft_tokens",
                                                                                                   "draft_logits"]
    distributed = tmp_path / "flavour-slots-trt-capacity-64-draft-distribution"
    assert (distributed / "draft_vocab.json").is_file()
    assert "draft rules point-mass, drafter" in CliRunner().invoke(main, ["inspect", str(distributed)]).stdout
    assert draft_outputs("--flavour", "slots", "--no-draft-distribution") == ["draft_tokens"]
    result = CliRunner().invoke(main, ["export", "--target", target, "--draft", draft, "-o", str(tmp_path / "x"),
                                       "--flavour", "portable", "--draft-distribution"])
    assert result.exit_code == 2 and "--draft-distribution is for --flavour slots or slots-trt" in result.output
    assert not (tmp_path / "x").exists()
    result = CliRunner().invoke(main, ["build", "--bundle", str(bundles["llama"][0]), "-o", str(tmp_path / "e"),
                                       "--engine", "onnxruntime", "--draft-distribution"])
    assert result.exit_code == 2 and "a --bundle keeps the draft outputs it was exported with" in result.output


def test_plugin_flavour_without_the_op_library_is_refused_in_one_line(bundles, plugin_bundle, tmp_path, monkeypatch):
    path, target, drafter = plugin_bundle
    monkeypatch.setattr(op_library, "LIBRARY", tmp_path / "missing.so")
    with pytest.raises(DFlashError, match="needs the dflash onnxruntime op library: build it with"):
        OrtBundle(path)  # the tests' contract-1 runner: the runtime refuses contract 1 before any library
    with pytest.raises(DFlashError, match="needs the dflash onnxruntime op library"):
        export_bundle(target, drafter, None, tmp_path / "p", flavour="plugin", check=True)
    assert not (tmp_path / "p").exists()


def test_plugin_bundle_declares_its_custom_ops(plugin_bundle):
    import onnx

    path = plugin_bundle[0]
    manifest = read_bundle(path)
    assert manifest["flavour"] == "plugin" and manifest["custom_ops"]["domain"] == "dflash"
    for graph, ops in {"draft_context": {"InjectKV"}, "draft_block": {"InjectKV", "BlockAttention"}, "target": set()}.items():
        model = onnx.load(str(path / f"{graph}.onnx"), load_external_data=False)
        assert {n.op_type for n in model.graph.node if n.domain == "dflash"} == ops


def test_plugin_export_passes_the_polygraphy_check(plugin_bundle, tiny_pairs, tmp_path):
    path, target, drafter = plugin_bundle
    out = export_bundle(target, drafter, None, tmp_path / "b", flavour="plugin", check=True)
    checks = read_bundle(out)["checks"]["polygraphy_vs_pytorch"]
    assert {checks[g] for g in ("target", "draft_context", "draft_block")} == {"passed"}


def _broken_copy(bundles, tmp_path, edit):
    source = bundles["qwen3"][0]
    copy = tmp_path / "copy"
    shutil.copytree(source, copy)
    edit(copy)
    return copy


def _edit_manifest(**changes):
    def edit(path):
        manifest = json.loads((path / MANIFEST).read_text())
        manifest.update(changes)
        (path / MANIFEST).write_text(json.dumps(manifest))
    return edit


def _corrupt(path):
    with (path / "draft_block.onnx.data").open("r+b") as f:
        f.seek(100)
        f.write(b"\x00\x01\x02\x03")


@pytest.mark.parametrize("edit, message", [
    (lambda p: (p / "target.onnx.data").unlink(), "target.onnx.data is missing from the bundle"),
    (_corrupt, "draft_block.onnx.data does not match its hash"),
    (lambda p: (p / MANIFEST).unlink(), "no bundle.json, so this is not a complete bundle"),
    (_edit_manifest(format_version=99), "bundle format 99 .* reads format 1: re-export"),
    (_edit_manifest(flavour="tensorrt"), "unknown flavour 'tensorrt'"),
    (lambda p: _drop_key(p, "graphs"), "the manifest has no .graphs. section"),
    (_edit_manifest(flavour="plugin", custom_ops=None), "must record its custom_ops version"),
])
def test_bad_bundles_refuse_to_load_in_one_line(bundles, tmp_path, edit, message):
    with pytest.raises(DFlashError, match=message) as err:
        LLM.from_bundle(_broken_copy(bundles, tmp_path, edit))
    assert "\n" not in str(err.value)


def _drop_key(path, key):
    manifest = json.loads((path / MANIFEST).read_text())
    del manifest[key]
    (path / MANIFEST).write_text(json.dumps(manifest))


def test_a_plugin_bundle_for_another_op_version_is_refused(plugin_bundle, tmp_path):
    from dflash_trt.export.op_library import library_version
    from dflash_trt.export.plugin_ops import OP_VERSION

    assert library_version() == OP_VERSION  # the built library implements the contract Python exports
    copy = tmp_path / "copy"
    shutil.copytree(plugin_bundle[0], copy)
    manifest = json.loads((copy / MANIFEST).read_text())
    manifest["custom_ops"]["version"] = OP_VERSION + 1
    (copy / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(DFlashError, match=f"exported for dflash ops version {OP_VERSION + 1}, but the op library "
                                          f"implements version {OP_VERSION}: rebuild it"):
        OrtBundle(copy)


def test_cli_export_writes_a_bundle_and_refuses_an_existing_directory(tiny_pairs, tmp_path):
    target_dir, draft_dir = tiny_pairs["llama"]
    args = ["export", "--target", str(target_dir), "--draft", str(draft_dir), "-o", str(tmp_path / "b")]
    result = CliRunner().invoke(main, [*args, "--no-check"])
    assert result.exit_code == 0, result.output
    assert read_bundle(tmp_path / "b")["flavour"] == "slots"  # what generate/serve --bundle run
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2 and "already exists; pass --force" in result.output


@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
def test_cli_exports_a_pair_whose_vocabulary_is_smaller_than_the_example_ids(small_vocab_pair, tmp_path, dtype):
    """Six token ids: the ids export traces and checks with must be drawn from them."""
    target_dir, draft_dir = small_vocab_pair
    result = CliRunner().invoke(main, ["export", "--target", str(target_dir), "--draft", str(draft_dir),
                                       "-o", str(tmp_path / "b"), "--dtype", dtype])
    assert result.exit_code == 0, result.output
    manifest = read_bundle(tmp_path / "b")
    assert manifest["target"]["vocab_size"] == 6 and manifest["dtype"] == {"fp32": "float32", "fp16": "float16"}[dtype]
    assert {manifest["checks"]["polygraphy_vs_pytorch"][g] for g in ("target", "draft_context", "draft_block")} == {"passed"}


def test_cli_generate_and_bench_run_a_bundle(slots_bundles, tiny_pairs):
    from dflash_trt import SamplingParams

    path = slots_bundles["llama"]
    result = CliRunner().invoke(main, ["generate", "--bundle", str(path), "--max-tokens", "8", "--json", "hey"])
    assert result.exit_code == 0, result.output
    expected = LLM(*map(str, tiny_pairs["llama"]), backend="torch").generate("hey", SamplingParams(max_tokens=8))[0]
    assert json.loads(result.stdout)["token_ids"] == expected.token_ids
    result = CliRunner().invoke(main, ["bench", str(path), "--dataset", "mt-bench", "--num-prompts", "1", "--max-tokens", "6",
                                       "--block-size", "4"])
    assert result.exit_code == 0, result.output
    assert "identical" in result.stdout


def test_cli_inspect_describes_the_bundle_and_its_checks(bundles, tmp_path):
    path = bundles["qwen3"][0]
    result = CliRunner().invoke(main, ["inspect", str(path)])
    assert result.exit_code == 0, result.output
    assert "portable flavour" in result.stdout and "all file hashes match" in result.stdout
    assert "input  block_ids int64[batch, block]" in result.stdout
    assert "drafts from 264 token ids" in result.stdout  # the whole vocabulary
    assert "draft: dflash, " in result.stdout and "draft rules point-mass\n" in result.stdout  # no distribution
    result = CliRunner().invoke(main, ["inspect", str(bundles["llama"][0])])  # a drafter with a draft vocabulary
    assert "drafts from 89 token ids" in result.stdout and "output draft_tokens int64[batch, block-1]" in result.stdout
    assert "draft_logits" not in result.stdout  # the portable flavour's block pass returns its tokens only
    broken = _broken_copy(bundles, tmp_path, _corrupt)
    result = CliRunner().invoke(main, ["inspect", str(broken)])
    assert result.exit_code == 2 and "does not match its hash" in result.output


def test_polygraphy_inspection_holds_each_graph_to_its_manifest(bundles, plugin_bundle):
    import copy

    from dflash_trt.export.verify import inspect_graph

    manifest = read_bundle(bundles["qwen3"][0])
    inspected = manifest["checks"]["polygraphy_inspect"]
    assert set(inspected) == {"target", "draft_context", "draft_block"}
    assert all(v["nodes"] > 0 and v["custom_ops"] == [] for v in inspected.values())
    plugin = read_bundle(plugin_bundle[0])["checks"]["polygraphy_inspect"]
    assert plugin["draft_block"]["custom_ops"] == ["dflash::BlockAttention", "dflash::InjectKV"]
    spec = manifest["graphs"]["draft_block"]
    path = bundles["qwen3"][0] / spec["file"]
    assert inspect_graph(path, spec) == inspected["draft_block"]
    for field, value in (("dtype", "float16"), ("shape", ["batch", "block", 7]), ("name", "renamed")):
        wrong = copy.deepcopy(spec)
        wrong["outputs"][0][field] = value
        with pytest.raises(DFlashError, match="draft_block.onnx outputs differ from the manifest"):
            inspect_graph(path, wrong)


def test_the_slots_block_pass_also_returns_its_logits_and_their_ids(slots_bundles, tiny_pairs):
    """For draft_rule="drafter": the slots draft block graph's draft_logits [batch, block-1, draft vocab],
    and draft_vocab.json naming each column's target id (the llama drafter proposes 89 of 264 ids)."""
    import onnx

    from dflash_trt.models.draft_vocab import read_draft_vocab

    path = slots_bundles["llama"]
    result = CliRunner().invoke(main, ["inspect", str(path)])
    assert "output draft_logits float32[batch, block-1, 89]" in result.stdout
    graph = onnx.load(str(path / "draft_block.onnx"), load_external_data=False).graph
    assert [o.name for o in graph.output] == ["draft_tokens", "draft_logits"]
    assert read_draft_vocab(path).tolist() == read_draft_vocab(tiny_pairs["llama"][1]).tolist()
    assert not (slots_bundles["qwen3"] / "draft_vocab.json").exists()  # a drafter over the whole vocabulary

"""qwen3_moe through export: the routed MoE (export/moe.py) against HF's sparse blocks and the dense
oracle, and tiny random Qwen3-MoE targets exported in both target flavours against the HF model on
onnxruntime.

Three targets: the shared tiny pair's (4 experts, top 2, no renormalisation), one with
renormalised top-k, a dense-MLP layer (mlp_only_layers) and a 3-token sliding window on every
layer (Qwen3-MoE has no layer_types: one window for all layers, as HF's attention applies it), and
one with 32 experts, top 4, whose steps pick a subset of the experts.
"""

import sys
import types
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from dense_moe import DenseRoutedMoE
from factories import make_drafter, make_target, target_config
from slot_checks import assert_row_equals_reference, prefilled_slots, reference
from transformers import AutoModelForCausalLM

from dflash_trt import LLM, SamplingParams
from dflash_trt.export import op_library
from dflash_trt.export.bundle import export_bundle
from dflash_trt.export.graphs import kv_names
from dflash_trt.export.manifest import read_bundle
from dflash_trt.export.moe import RoutedMoE
from dflash_trt.export.moe_ops import register_moe_symbolic
from dflash_trt.models.checkpoints import load_drafter, load_target

ATOL = 1e-4  # float32 on one CPU: reduction-order round-off (the 4x-scaled tiny weights give logits ~1e2)
MOE_TARGETS = {"moe": {}, "moe-norm-window": {"norm_topk_prob": True, "mlp_only_layers": [1],
                                               "use_sliding_window": True, "sliding_window": 3},
               # a step's tokens pick fewer experts than there are: the graphs read a subset
               "moe-32-top4": {"num_experts": 32, "num_experts_per_tok": 4, "norm_topk_prob": True}}


@pytest.fixture(scope="module")
def moe_bundles(tiny_pairs, tmp_path_factory):
    """name -> (target dir, drafter dir, portable bundle, slots bundle, TargetModel, taps), both
    bundles exported with the polygraphy check (onnxruntime vs PyTorch)."""
    root = tmp_path_factory.mktemp("moe")
    made = {}
    for name, config in MOE_TARGETS.items():
        if config:
            target_dir = make_target(root / name, "qwen3_moe", seed=11, **config)
            draft_dir = make_drafter(root / f"{name}-draft", seed=11, block_size=4, target_layer_ids=[1, 2])
        else:
            target_dir, draft_dir = tiny_pairs["qwen3_moe"]
        target, tokenizer = load_target(str(target_dir))
        drafter = load_drafter(draft_dir)
        portable = export_bundle(target, drafter, tokenizer, root / f"{name}-portable", check=True)
        slots = export_bundle(target, drafter, tokenizer, root / f"{name}-slots", flavour="slots", check=True)
        made[name] = (target_dir, draft_dir, portable, slots, target, tuple(drafter.config.target_layer_ids))
    return made


def sparse_block(family, tie, **config):
    """One HF sparse MoE block with N(0, 1) weights; `tie`: experts 1 and 2 get the same router row,
    so their probabilities are bit-equal and top-2 must break the tie (their weights still differ)."""
    torch.manual_seed(3)
    model = AutoModelForCausalLM.from_config(target_config(family, **config), dtype=torch.float32)
    block = model.model.layers[0].mlp
    with torch.no_grad():
        for p in block.parameters():
            p.normal_()
        if tie:
            block.gate.weight[2] = block.gate.weight[1]
    return block


def lowest_index_topk(values, k, dim=-1):
    """torch.topk with ONNX TopK's tie rule (the lowest index first); torch.topk on CPU has none."""
    top, index = torch.sort(values, dim=dim, descending=True, stable=True)
    return top.narrow(dim, 0, k), index.narrow(dim, 0, k)


def highest_index_topk(values, k, dim=-1):
    """torch.topk with onnxruntime's MoE kernel's tie rule, measured: the highest index first."""
    top, index = lowest_index_topk(values.flip(dim), k, dim)
    return top, values.shape[dim] - 1 - index


def expert_weight_readers(model: onnx.ModelProto, experts: int) -> set[str]:
    """The op types that read an expert weight tensor ([E, ...] with E = `experts`), looking through
    the layout-only ops (Reshape, Transpose) that onnxruntime folds into the weight at load."""
    names = {t.name for t in model.graph.initializer if len(t.dims) == 3 and t.dims[0] == experts}
    assert names, "no expert weights found"
    readers = set()
    while names:
        consumers = [n for n in model.graph.node if names & set(n.input)]
        readers |= {n.op_type for n in consumers if n.op_type not in ("Reshape", "Transpose")}
        names = {n.output[0] for n in consumers if n.op_type in ("Reshape", "Transpose")}
    return readers


@pytest.mark.parametrize("family, config", [("qwen3_moe", {}), ("qwen3_moe", {"norm_topk_prob": True}),
                                            ("qwen3_next", {})])  # qwen3_next: a gated shared expert too
@pytest.mark.parametrize("tie", [False, True])
@pytest.mark.parametrize("form", ["standard", "onnxruntime", "dflash"])
def test_the_routed_moe_equals_hf_sparse_block_in_torch_and_onnxruntime(family, config, tie, form, tmp_path,
                                                                        monkeypatch):
    """PyTorch: equal to HF's block (and the dense oracle), ties included (all take torch.topk's pick).
    onnxruntime: equal to HF's block with ties broken as ONNX TopK specifies (the lowest index; the
    MoE kernel takes the highest; our dflash::MoE the lowest); without ties, simply equal to HF's. In
    the graph only Gather (or a MoE kernel) reads the expert weights: a step reads the experts its
    tokens picked."""
    if form == "dflash" and not op_library.LIBRARY.is_file():
        pytest.skip("dflash op library not built (bash scripts/build_plugins.sh)")
    block = sparse_block(family, tie, **config)
    routed = RoutedMoE(block).eval()
    routed.op = form
    register_moe_symbolic(17)
    x = torch.randn(3, 40, 64, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want, got, dense = block(x), routed(x), DenseRoutedMoE(block).eval()(x)
        probs = torch.softmax(block.gate(x.view(-1, 64))[0], dim=-1)
    if tie:  # the tie decides the second expert for some tokens: exactly one of experts 0, 3 beats it
        boundary = ((probs[:, [0, 3]] > probs[:, 1:2]).sum(-1) == 1) & (probs[:, 1] == probs[:, 2])
        assert boundary.sum() > 5
    scale = want.abs().max()
    torch.testing.assert_close(got, want, atol=1e-6 * scale, rtol=0)
    torch.testing.assert_close(dense, want, atol=1e-6 * scale, rtol=0)
    path = tmp_path / "moe.onnx"
    with torch.no_grad():
        torch.onnx.export(routed, (x[:1, :5],), str(path), input_names=["x"], output_names=["y"],
                          dynamic_axes={"x": {0: "b", 1: "s"}, "y": {0: "b", 1: "s"}}, opset_version=17, dynamo=False,
                          custom_opsets={"standard": None, "onnxruntime": {"com.microsoft": 1},
                                         "dflash": {"dflash": 1}}[form])
    model = onnx.load(str(path))
    assert expert_weight_readers(model, block.experts.gate_up_proj.shape[0]) == \
        ({"Gather"} if form == "standard" else {"MoE"})
    session = ort.InferenceSession(str(path), op_library.session_options(form == "dflash"),
                                   providers=["CPUExecutionProvider"])
    # HF's router calls torch.topk
    monkeypatch.setattr(torch, "topk", highest_index_topk if form == "onnxruntime" else lowest_index_topk)
    with torch.no_grad():
        want_onnx = block(x)
    assert tie or torch.equal(want_onnx, want)
    (out,) = session.run(None, {"x": x.numpy()})
    np.testing.assert_allclose(out, want_onnx.numpy(), atol=1e-6 * float(scale), rtol=0)
    # one token routes to top-k experts: the graph runs those (a decode step), and equals HF's block
    for t in range(3):
        (one,) = session.run(None, {"x": x[:1, t : t + 1].numpy()})
        np.testing.assert_allclose(one, want_onnx[:1, t : t + 1].numpy(), atol=1e-6 * float(scale), rtol=0)


def test_the_swap_leaves_the_users_model_alone(moe_bundles):
    *_, target, _ = moe_bundles["moe-norm-window"]
    kinds = [type(layer.mlp).__name__ for layer in target.model.model.layers]
    assert kinds == ["Qwen3MoeSparseMoeBlock", "Qwen3MoeMLP", "Qwen3MoeSparseMoeBlock", "Qwen3MoeSparseMoeBlock"]


@pytest.fixture(scope="module")
def moe_plugin_bundles(moe_bundles, tmp_path_factory):
    """name -> the plugin-flavour bundle of moe_bundles' pair (dflash::MoE in its target graph)."""
    if not op_library.LIBRARY.is_file():
        pytest.skip("dflash op library not built (bash scripts/build_plugins.sh)")
    root = tmp_path_factory.mktemp("moe-plugin")
    made = {}
    for name, (target_dir, draft_dir, _, _, target, _) in moe_bundles.items():
        made[name] = export_bundle(target, load_drafter(draft_dir), None, root / name, flavour="plugin", check=True)
    return made


@pytest.mark.parametrize("name", list(MOE_TARGETS))
@pytest.mark.parametrize("first, kept, new", [(5, (5, 3), 4), (7, (2, 7), 6), (4, (4, 1, 2), 5)])
@pytest.mark.parametrize("flavour", ["portable", "plugin"])
def test_contract1_target_graphs_match_hf_on_ragged_rows(request, moe_bundles, name, first, kept, new, flavour):
    """A prefill of `first` tokens, then a verify of `new` where row r keeps `kept[r]` of them: the
    portable graph (standard-op routing) and the plugin one (our dflash::MoE on its onnxruntime kernel)."""
    *_, bundle, _, target, taps = moe_bundles[name]
    if flavour == "plugin":
        bundle = request.getfixturevalue("moe_plugin_bundles")[name]
    rows = len(kept)
    g = torch.Generator().manual_seed(first * 10 + new)
    prefix = torch.randint(0, target.vocab_size, (rows, first), generator=g)
    suffix = torch.randint(0, target.vocab_size, (rows, new), generator=g)
    session = ort.InferenceSession(str(bundle / "target.onnx"), op_library.session_options(flavour == "plugin"),
                                   providers=["CPUExecutionProvider"])
    cfg = target.config
    empty = np.zeros((rows, cfg.num_key_value_heads, 0, cfg.head_dim), np.float32)
    feed = {"input_ids": prefix.numpy(), "past_lengths": np.zeros(rows, np.int64), "logits_from": np.array(0)}
    first_out = session.run(None, feed | {n: empty for n in kv_names("past", target.num_layers)})
    feed = {"input_ids": suffix.numpy(), "past_lengths": np.array(kept, np.int64), "logits_from": np.array(0)}
    feed |= dict(zip(kv_names("past", target.num_layers), first_out[2:], strict=True))
    logits, features, *_ = session.run(None, feed)
    for row in range(rows):
        ref_first, _ = reference(target, taps, prefix[row].tolist())
        np.testing.assert_allclose(first_out[0][row], ref_first, atol=ATOL, rtol=0)
        ref_logits, ref_features = reference(target, taps, prefix[row, : kept[row]].tolist() + suffix[row].tolist())
        np.testing.assert_allclose(logits[row], ref_logits[-new:], atol=ATOL, rtol=0)
        np.testing.assert_allclose(features[row], ref_features[-new:], atol=ATOL, rtol=0)


@pytest.mark.parametrize("name", list(MOE_TARGETS))
@pytest.mark.parametrize("block", [4, 8])
def test_greedy_dflash_on_onnxruntime_equals_autoregressive_torch(moe_bundles, name, block):
    target_dir, draft_dir, _, slots, *_ = moe_bundles[name]
    ours = LLM.from_bundle(slots, block_size=block, max_batch=2, capacity=64)
    torch_llm = LLM(str(target_dir), str(draft_dir), block_size=block, backend="torch")
    params = SamplingParams(max_tokens=20, ignore_eos=True)
    for prompt in ["hello there", [5, 6, 7]]:
        got = ours.generate(prompt, params)[0]
        assert got.token_ids == torch_llm.generate(prompt, params, speculative=False)[0].token_ids
        # the same drafts as the torch backend's DFlash: the same acceptance at every step (its HF
        # sliding-window cache cannot roll back once the window is full, so the plain target only)
        if name == "moe":
            assert got.metrics.acceptance_lengths == torch_llm.generate(prompt, params)[0].metrics.acceptance_lengths


@pytest.mark.parametrize("name", list(MOE_TARGETS))
@pytest.mark.parametrize("garbage", [1e4, np.nan])
def test_slots_target_graph_writes_its_rows_in_place_and_matches_hf(moe_bundles, name, garbage):
    """Four rows: committed 5, 0, 11, 7; 4, 2, 1 and 0 (idle) of 4 new tokens valid; cache rows past
    each length hold garbage (NaN too) that only a wrong graph would read."""
    *_, bundle, target, taps = moe_bundles[name]
    committed, valid, new = [5, 0, 11, 7], [4, 2, 1, 0], 4
    slots, prefixes, ids = prefilled_slots(bundle, target, taps, committed, new, garbage, seed=len(name))
    logits, features = slots.step(ids, committed, valid, np.tile(np.arange(new), (len(committed), 1)))
    assert np.isfinite(features).all()
    for row, (p, q) in enumerate(zip(committed, valid, strict=True)):
        assert not features[row, q:].any()
        if q == 0:
            continue
        sequence = prefixes[row] + ids[row, :q].tolist()
        assert_row_equals_reference(target, taps, slots, logits, features, row, sequence, p, ATOL)


@pytest.mark.parametrize("flavour", ["portable", "slots"])
def test_moe_bundles_record_the_family_pass_their_checks_and_read_routed_experts_only(moe_bundles, flavour):
    _, _, portable, slots, target, _ = moe_bundles["moe"]
    bundle = portable if flavour == "portable" else slots
    manifest = read_bundle(bundle)
    assert manifest["target"]["model_type"] == "qwen3_moe"
    assert set(manifest["checks"]["polygraphy_vs_pytorch"][g] for g in ("target", "draft_context", "draft_block")) \
        == {"passed"}
    model = onnx.load(str(bundle / "target.onnx"))
    assert "NonZero" not in {n.op_type for n in model.graph.node}  # TensorRT-RTX cannot parse it
    # only the routed experts' weights are read: gathered (standard ops), or by onnxruntime's MoE kernel
    assert expert_weight_readers(model, target.config.num_experts) == {"Gather" if flavour == "portable" else "MoE"}



def test_float16_moe_bundles_pass_their_checks_and_decode_like_themselves(tiny_pairs, tmp_path):
    """Half precision: the graphs pass the onnxruntime-vs-PyTorch check in both flavours, and greedy
    DFlash on the slots bundle commits what greedy autoregressive decoding on it does."""
    target_dir, draft_dir = tiny_pairs["qwen3_moe"]
    target, tokenizer = load_target(str(target_dir))
    drafter = load_drafter(draft_dir)
    for flavour in ("portable", "slots"):
        bundle = export_bundle(target, drafter, tokenizer, tmp_path / flavour, flavour=flavour, dtype="float16")
        checks = read_bundle(bundle)["checks"]["polygraphy_vs_pytorch"]
        assert [checks[g] for g in ("target", "draft_context", "draft_block")] == ["passed"] * 3
    llm = LLM.from_bundle(tmp_path / "slots", block_size=4, max_batch=2, capacity=64)
    params = SamplingParams(max_tokens=16, ignore_eos=True)
    for prompt in ["hello there", [5, 6, 7]]:
        assert llm.generate(prompt, params)[0].token_ids == llm.generate(prompt, params, speculative=False)[0].token_ids


def test_a_hybrid_moe_target_with_32_experts_top_4_decodes_as_autoregressive_in_both_flavours(tmp_path):
    """Qwen3.5-MoE (Gated DeltaNet layers, always-renormalised router, gated shared expert) whose steps
    read a subset of its experts: each flavour passes its check against PyTorch, and greedy DFlash on
    the slots bundle commits what greedy autoregressive decoding of the HF model does."""
    target_dir = make_target(tmp_path / "target", "qwen3_5_moe_text", seed=4, num_experts=32, num_experts_per_tok=4)
    draft_dir = make_drafter(tmp_path / "draft", seed=4, block_size=4, target_layer_ids=[1, 2])
    target, tokenizer = load_target(str(target_dir))
    drafter = load_drafter(draft_dir)
    for flavour in ("portable", "slots"):
        bundle = export_bundle(target, drafter, tokenizer, tmp_path / flavour, flavour=flavour, check=True)
        checks = read_bundle(bundle)["checks"]["polygraphy_vs_pytorch"]
        assert [checks[g] for g in ("target", "draft_context", "draft_block")] == ["passed"] * 3
    ours = LLM.from_bundle(tmp_path / "slots", block_size=4, max_batch=2, capacity=64)
    torch_llm = LLM(str(target_dir), str(draft_dir), block_size=4, backend="torch")
    params = SamplingParams(max_tokens=16, ignore_eos=True)
    for prompt in ["hello there", [5, 6, 7]]:
        assert ours.generate(prompt, params)[0].token_ids == torch_llm.generate(prompt, params, speculative=False)[0].token_ids


@pytest.mark.parametrize("family", ["qwen3_moe", "qwen3_5_moe_text"])
def test_plugin_bundles_route_through_our_moe_op_and_decode_as_torch(tmp_path, family, monkeypatch):
    """The plugin flavour's target runs each routed layer as our dflash::MoE (the op library on
    onnxruntime; TensorRT's plugin): its graphs pass the onnxruntime-vs-PyTorch check, only that op
    reads the expert weights, and greedy DFlash over the graphs commits, step for step, what the torch
    models do (32 experts top-4; Qwen3.5-MoE with its Gated DeltaNet layers and shared expert)."""
    from contract1_runner import generate
    from reference import reference_output

    if not op_library.LIBRARY.is_file():
        pytest.skip("dflash op library not built (bash scripts/build_plugins.sh)")
    config = {"norm_topk_prob": True} if family == "qwen3_moe" else {}
    target_dir = make_target(tmp_path / "target", family, seed=4, num_experts=32, num_experts_per_tok=4, **config)
    draft_dir = make_drafter(tmp_path / "draft", seed=4, block_size=4, target_layer_ids=[1, 2])
    target, tokenizer = load_target(str(target_dir))
    bundle = export_bundle(target, load_drafter(draft_dir), tokenizer, tmp_path / "plugin", flavour="plugin",
                           check=True)
    checks = read_bundle(bundle)["checks"]["polygraphy_vs_pytorch"]
    assert [checks[g] for g in ("target", "draft_context", "draft_block")] == ["passed"] * 3
    model = onnx.load(str(bundle / "target.onnx"))
    assert expert_weight_readers(model, 32) == {"MoE"}
    assert {n.domain for n in model.graph.node if n.op_type == "MoE"} == {"dflash"}
    assert read_bundle(bundle)["custom_ops"]["ops"][-1] == "MoE"
    torch_llm = LLM(str(target_dir), str(draft_dir), block_size=4, backend="torch")
    params = SamplingParams(max_tokens=16, ignore_eos=True)
    for prompt in ["hello there", [5, 6, 7]]:
        tokens, taus = generate(bundle, torch_llm.encode(prompt), params, 4)
        want = reference_output(torch_llm, prompt, params, speculative=True, block_size=4)
        assert tokens == want.token_ids
        assert taus == want.metrics.acceptance_lengths
    # a TensorRT build loads the plugin library for the target too, which holds dflash::MoE nodes
    from dflash_trt.engines import build as build_module
    from dflash_trt.engines import machine, trt_engine
    from dflash_trt.engines.config import BuildConfig

    if not build_module.PLUGIN_LIBRARY.is_file():
        return  # no nvcc where the plugins were built: the onnxruntime side above is what runs here
    libraries = {}

    def fake_build(kind, source, out, spec, profiles, compute_capabilities, plugin_library=None):
        libraries[Path(source).stem] = plugin_library
        Path(out).write_text("fake engine")
        return {"file": Path(out).name, "build_s": 0.0, "bytes": 11}

    fake = types.ModuleType("tensorrt")
    fake.__version__ = "10.99.0-fake"
    monkeypatch.setitem(sys.modules, "tensorrt", fake)
    monkeypatch.setattr(machine, "gpu_compute_capability", lambda: "9.0")
    monkeypatch.setattr(trt_engine, "build_trt_graph", fake_build)
    build_module.build_engines(bundle, tmp_path / "engines", BuildConfig(engine="tensorrt", max_batch=2,
                                                                          max_seq_len=64))
    assert libraries == dict.fromkeys(("target", "draft_context", "draft_block"), build_module.PLUGIN_LIBRARY)


def test_experts_gated_otherwise_than_by_silu_stay_out_of_the_fused_ops():
    """The fused ops (onnxruntime's MoE, our dflash::MoE) compute silu(gate) * up: experts with another
    gate are refused at export in one line, and the torch backend keeps them in standard ops."""
    from dflash_trt.errors import DFlashError
    from dflash_trt.export.moe import fused_moe_refusal, use_moe_op

    block = sparse_block("qwen3_moe", False)
    graph = torch.nn.ModuleList([RoutedMoE(block)])
    assert fused_moe_refusal(graph) is None
    block.experts.act_fn = torch.nn.GELU()
    assert fused_moe_refusal(graph) == "the fused MoE ops gate with SiLU; these experts use GELU"
    with pytest.raises(DFlashError, match="^export: the fused MoE ops gate with SiLU; these experts use GELU$"):
        use_moe_op(graph, "dflash")
    assert graph[0].op == "standard"

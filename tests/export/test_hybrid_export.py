"""The hybrid families through export: Gated DeltaNet + gated attention (+ MoE) targets as ONNX graphs
whose linear-attention states are graph I/O, against HF's own modules on onnxruntime.

Three tiny random targets (qwen3_next: MoE with a shared expert and Qwen3-Next's interleaved
projections; qwen3_5_text: dense; qwen3_5_moe_text), each with layers [linear, full, linear, full].
"""

import numpy as np
import onnx
import pytest
import torch
from transformers import AutoTokenizer

from dflash_trt import LLM, SamplingParams
from dflash_trt.export.bundle import export_bundle
from dflash_trt.export.manifest import read_bundle
from dflash_trt.models.checkpoints import load_drafter
from contract1_runner import OrtBundle, OrtTargetSession, generate
from reference import reference_output

FAMILIES = ["qwen3_next", "qwen3_5_text", "qwen3_5_moe_text"]  # conftest's hybrid_bundles
TAPS = (1, 2)
ATOL = 1e-4  # float32 on one CPU: reduction-order round-off (the 4x-scaled tiny weights give logits ~1e2)
PROMPT = [3, 17, 99, 4, 250, 31, 8, 77, 140, 5, 60, 12]
BLOCK = [41, 7, 200, 13, 90]


@pytest.fixture(scope="module")
def hybrids(hybrid_bundles):
    return hybrid_bundles


def hf_forward(target, ids):
    """HF's own forward over `ids` from an empty cache -> (logits [n, V], taps [n, F], cache)."""
    cache = target.new_cache().kv
    with torch.no_grad():
        out = target.model(torch.tensor([ids]), past_key_values=cache, use_cache=True, output_hidden_states=True)
    features = torch.cat([out.hidden_states[k + 1][0] for k in TAPS], dim=-1)
    return out.logits[0], features, cache


def assert_states_equal_hf(session, target, cache):
    """The session's committed conv and recurrent states equal HF's cache after the same tokens (HF
    keeps K conv columns where the graph keeps the K - 1 the next token reads)."""
    linear = [i for i, t in enumerate(target.config.layer_types) if t == "linear_attention"]
    states = [p for p, kind in zip(session.past, session.kinds, strict=True) if kind != "kv"]
    assert len(states) == 2 * len(linear)
    for n, layer in enumerate(linear):
        conv, recurrent = states[2 * n], states[2 * n + 1]
        np.testing.assert_allclose(conv, cache.get_conv_state(layer, state_idx=0)[:, :, 1:].numpy(), atol=ATOL, rtol=0)
        np.testing.assert_allclose(recurrent, cache.get_recurrent_state(layer, state_idx=0).numpy(), atol=ATOL, rtol=0)


def test_the_bundle_records_layer_kinds_and_lowers_every_recurrence_to_standard_ops(hybrids):
    for family, (_, _, bundle, target) in hybrids.items():
        manifest = read_bundle(bundle)
        info = manifest["target"]
        assert info["layer_types"] == ["linear_attention", "full_attention"] * 2
        assert info["linear_attention"] == {"conv_dim": 2 * 2 * 16 + 4 * 16, "conv_kernel": 4, "num_key_heads": 2,
                                            "num_value_heads": 4, "key_head_dim": 16, "value_head_dim": 16}
        names = [io["name"] for io in manifest["graphs"]["target"]["inputs"]]
        assert names[3:] == ["past_key_1", "past_value_1", "past_key_3", "past_value_3",
                             "conv_state_0", "recurrent_state_0", "conv_state_2", "recurrent_state_2"]
        assert manifest["checks"]["polygraphy_vs_pytorch"]["target"] == "passed"
        graph = onnx.load(str(bundle / "target.onnx"), load_external_data=False)
        ops = [n.op_type for n in graph.graph.node]
        assert ops.count("Loop") == 2, family  # one per linear-attention layer
        assert all(n.domain in ("", "ai.onnx") for n in graph.graph.node)  # no custom op left
        assert not any(op.startswith("Sequence") or op == "ConcatFromSequence" for op in ops)


@pytest.mark.parametrize("family", FAMILIES)
def test_graph_logits_features_and_states_equal_hf(hybrids, family):
    _, _, bundle, target = hybrids[family]
    session = OrtTargetSession(OrtBundle(bundle))
    logits, features = session.prefill(PROMPT)
    hf_logits, hf_features, cache = hf_forward(target, PROMPT)
    torch.testing.assert_close(logits, hf_logits[-1], atol=ATOL, rtol=0)
    torch.testing.assert_close(features, hf_features, atol=ATOL, rtol=0)
    assert_states_equal_hf(session, target, cache)
    logits, features = session.forward(BLOCK)  # a verify: every position's logits
    session.commit(len(BLOCK))
    hf_logits, hf_features, cache = hf_forward(target, PROMPT + BLOCK)
    torch.testing.assert_close(logits, hf_logits[len(PROMPT):], atol=ATOL, rtol=0)
    torch.testing.assert_close(features, hf_features[len(PROMPT):], atol=ATOL, rtol=0)
    assert_states_equal_hf(session, target, cache)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("keep", range(1, len(BLOCK) + 1))
def test_rollback_after_every_acceptance_length_restores_the_plain_decode_state(hybrids, family, keep):
    """Verify a block, keep `keep` of it (what an acceptance of keep - 1 drafts commits), then decode on:
    states and logits equal a plain decode of the kept tokens, with no token fed twice."""
    _, _, bundle, target = hybrids[family]
    session = OrtTargetSession(OrtBundle(bundle))
    session.prefill(PROMPT)
    session.forward(BLOCK)
    session.commit(keep)
    kept = PROMPT + BLOCK[:keep]
    assert session.length == len(kept)
    assert_states_equal_hf(session, target, hf_forward(target, kept)[2])
    follow = [9, 180, 2]
    logits, _ = session.forward(follow)
    session.commit(len(follow))
    torch.testing.assert_close(logits, hf_forward(target, kept + follow)[0][len(kept):], atol=ATOL, rtol=0)


@pytest.fixture(scope="module")
def llms(hybrids):
    """family -> (the portable bundle's onnxruntime sessions, LLM on the HF checkpoints through torch)."""
    return {family: (OrtBundle(bundle), LLM(str(target_dir), str(draft_dir), backend="torch"))
            for family, (target_dir, draft_dir, bundle, _) in hybrids.items()}


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("block", [2, 4])
def test_greedy_dflash_through_onnxruntime_equals_greedy_autoregressive_decoding(llms, family, block):
    bundle, torch_llm = llms[family]
    params = SamplingParams(max_tokens=20, ignore_eos=True)
    for prompt in ["hello there", "The quick brown fox", [5, 6, 7]]:
        tokens, taus = generate(bundle, torch_llm.encode(prompt), params, block)
        assert tokens == reference_output(torch_llm, prompt, params).token_ids  # HF's forward, token by token
        # the same drafts and acceptances as the torch models, whose rollback re-feeds tokens
        spec = reference_output(torch_llm, prompt, params, speculative=True, block_size=block)
        assert taus == spec.metrics.acceptance_lengths


def test_sampled_onnxruntime_matches_torch_with_the_same_seed(llms):
    bundle, torch_llm = llms["qwen3_5_moe_text"]
    params = SamplingParams(max_tokens=16, temperature=0.8, top_p=0.9, seed=7, ignore_eos=True)
    want = reference_output(torch_llm, "hi", params, speculative=True, block_size=4).token_ids
    assert generate(bundle, torch_llm.encode("hi"), params, 4)[0] == want


def test_the_plugin_flavour_keeps_one_gated_delta_rule_node_per_linear_layer_and_decodes_as_ar(hybrids, tmp_path):
    """Plugin flavour: dflash::GatedDeltaRule stays in target.onnx (the op library's CPU kernel runs it
    here; the TensorRT plugin takes states_from as a shape input), checked against PyTorch at export."""
    from dflash_trt.export import op_library

    if not op_library.LIBRARY.is_file():
        pytest.skip("dflash op library not built (bash scripts/build_plugins.sh)")
    target_dir, draft_dir, portable, target = hybrids["qwen3_5_moe_text"]
    tokenizer = AutoTokenizer.from_pretrained(target_dir)
    bundle = export_bundle(target, load_drafter(draft_dir), tokenizer, tmp_path / "plugin", flavour="plugin", check=True)
    manifest = read_bundle(bundle)
    assert manifest["custom_ops"]["ops"] == ["InjectKV", "BlockAttention", "GatedDeltaRule", "MoE"]
    assert manifest["checks"]["polygraphy_vs_pytorch"]["target"] == "passed"
    nodes = onnx.load(str(bundle / "target.onnx"), load_external_data=False).graph.node
    rules = [n for n in nodes if (n.domain, n.op_type) == ("dflash", "GatedDeltaRule")]
    assert len(rules) == 2 and not any(n.op_type == "Loop" for n in nodes)
    assert all([a.ints for a in n.attribute if a.name == "tensorrt_plugin_shape_input_indices"] == [[6]] for n in rules)
    params = SamplingParams(max_tokens=20, ignore_eos=True)
    for prompt in [[9, 8, 7, 6], [5, 6, 7]]:
        tokens, taus = generate(bundle, prompt, params, 4)
        assert tokens == generate(portable, prompt, params)[0]
        assert taus == generate(portable, prompt, params, 4)[1]


def test_the_cli_exports_a_qwen3_5_vl_checkpoint_inspects_and_runs_it(tmp_path):
    """A Qwen3.5-MoE checkpoint as published (vision tower included) through `export`, `inspect` and
    `generate --bundle`: its text model is exported, and the bundle decodes as HF's AR greedy."""
    from click.testing import CliRunner
    from factories import make_drafter, make_vl_target

    from dflash_trt.cli import main

    target = make_vl_target(tmp_path / "vl", "qwen3_5_moe", seed=1)
    draft = make_drafter(tmp_path / "draft", seed=1, block_size=4, target_layer_ids=list(TAPS))
    out = tmp_path / "bundle"
    result = CliRunner().invoke(main, ["export", "--target", str(target), "--draft", str(draft), "-o", str(out),
                                       "--no-check"])
    assert result.exit_code == 0, result.output
    shown = CliRunner().invoke(main, ["inspect", str(out)]).output
    assert "target: qwen3_5_moe_text, 4 layers" in shown
    assert "Gated DeltaNet layers [0, 2] (conv 128 x 3, recurrent state 4 x 16 x 16 float32)" in shown
    params = SamplingParams(max_tokens=12, ignore_eos=True)
    ours = LLM.from_bundle(out).generate([5, 6, 7], params)[0].token_ids
    torch_llm = LLM(str(target), str(draft), backend="torch")
    assert ours == torch_llm.generate([5, 6, 7], params, speculative=False)[0].token_ids

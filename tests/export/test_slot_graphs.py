"""The slots flavour (graph contract 2): target.onnx writes fixed-capacity caches in place.

Every check runs the exported graph on onnxruntime as the batched runtime will: each cache_*_i input
and its cache_*_out_i output bound to one buffer (IOBinding over a numpy array), ragged rows, and
cache rows past each length holding garbage. References: the HF model per row (logits, features) and
contract 1's TargetGraph (the K/V rows it presents).
"""

import importlib

import numpy as np
import onnxruntime as ort
import pytest
import torch
from factories import make_drafter, make_target
from slot_checks import CAPACITY, Slots, assert_row_equals_reference, prefilled_slots, reference, v1_present

from dflash_trt.engines.build import build_engines
from dflash_trt.engines.config import BuildConfig
from dflash_trt.errors import DFlashError
from dflash_trt.export.bundle import export_bundle
from dflash_trt.export.manifest import read_bundle
from dflash_trt.export.slot_graphs import slot_kv_names
from dflash_trt.models.checkpoints import load_drafter, load_target

ATOL = 1e-4  # float32 on one CPU: reduction-order round-off
# qwen3-window: layers 2 and 3 keep the last 3 positions only (HF's `diff < window`), so the rows
# below, up to 16 tokens long, cross the window in every test.
FAMILIES = {"llama": ("llama", {}), "qwen3": ("qwen3", {}),
            "qwen3-window": ("qwen3", {"use_sliding_window": True, "sliding_window": 3, "max_window_layers": 2})}


@pytest.fixture(scope="module")
def slot_bundles(tmp_path_factory):
    """name -> (slots bundle, TargetModel, taps), exported with the polygraphy check."""
    root = tmp_path_factory.mktemp("slots")
    made = {}
    for seed, (name, (family, config)) in enumerate(FAMILIES.items()):
        target_dir = make_target(root / name, family, seed=seed, **config)
        drafter = load_drafter(make_drafter(root / f"{name}-draft", seed=seed, block_size=4, target_layer_ids=[1, 2]))
        target, tokenizer = load_target(str(target_dir))
        bundle = export_bundle(target, drafter, tokenizer, root / f"{name}-bundle", flavour="slots", check=True)
        made[name] = (bundle, target, tuple(drafter.config.target_layer_ids))
    return made


def bits(a):
    return a.view(np.uint32)  # NaN garbage compares too


@pytest.mark.parametrize("name", list(FAMILIES))
@pytest.mark.parametrize("garbage", [1e4, np.nan])
def test_a_ragged_step_writes_only_its_rows_in_place_and_matches_the_model(slot_bundles, name, garbage):
    """Five rows: committed 5, 0, 11, 7, 0 tokens; 4, 2, 1, 0 (idle) and 0 (idle, empty slot) of 4 new
    tokens valid. Everything past each row's length starts as garbage (NaN too: never read)."""
    bundle, target, taps = slot_bundles[name]
    committed, valid, new = [5, 0, 11, 7, 0], [4, 2, 1, 0, 0], 4
    slots, prefixes, ids = prefilled_slots(bundle, target, taps, committed, new, garbage, seed=len(name))
    before = [c.copy() for c in slots.caches]
    logits, features = slots.step(ids, committed, valid, np.tile(np.arange(new), (len(committed), 1)))
    assert logits.shape == (len(committed), new, target.vocab_size) and np.isfinite(features).all()
    for row, (p, q) in enumerate(zip(committed, valid, strict=True)):
        for cache, old in zip(slots.caches, before, strict=True):
            # the committed prefix and everything past the new rows: bit-identical
            assert np.array_equal(bits(cache[row, :, :p]), bits(old[row, :, :p]))
            assert np.array_equal(bits(cache[row, :, p + q :]), bits(old[row, :, p + q :]))
        assert not features[row, q:].any()  # padding rows' features are zero, never NaN
        if q == 0:
            continue
        sequence = prefixes[row] + ids[row, :q].tolist()
        assert_row_equals_reference(target, taps, slots, logits, features, row, sequence, p, ATOL)


@pytest.mark.parametrize("name", ["llama", "qwen3-window"])
def test_rollback_is_a_length_and_the_next_step_overwrites_the_rejected_rows(slot_bundles, name):
    """Row k verifies 4 tokens and keeps k of them (0..4); the next step, one token at
    cache_lengths + k, overwrites the rejected rows and equals decoding that sequence afresh."""
    bundle, target, taps = slot_bundles[name]
    rows, first = 5, 6
    g = torch.Generator().manual_seed(3)
    prompt = torch.randint(0, target.vocab_size, (rows, first), generator=g).numpy()
    block = torch.randint(0, target.vocab_size, (rows, 4), generator=g).numpy()
    decode = torch.randint(0, target.vocab_size, (rows, 1), generator=g).numpy()
    slots = Slots(bundle, target, rows)
    slots.step(prompt, [0] * rows, [first] * rows, [[first - 1]] * rows)
    slots.step(block, [first] * rows, [4] * rows, np.tile(np.arange(4), (rows, 1)))
    keep = np.arange(rows)
    logits, features = slots.step(decode, first + keep, [1] * rows, [[0]] * rows)
    for row in range(rows):
        sequence = prompt[row].tolist() + block[row, : keep[row]].tolist() + decode[row].tolist()
        ref_logits, ref_features = reference(target, taps, sequence)
        np.testing.assert_allclose(logits[row, 0], ref_logits[-1], atol=ATOL, rtol=0)
        np.testing.assert_allclose(features[row, 0], ref_features[-1], atol=ATOL, rtol=0)
        for cache, present in zip(slots.caches, v1_present(target, taps, sequence), strict=True):
            np.testing.assert_allclose(cache[row, :, : len(sequence)], present, atol=ATOL, rtol=0)


def greedy(target, prompt, n):
    ids = list(prompt)
    for _ in range(n):
        logits, _ = target.forward(ids, target.new_cache())
        ids.append(int(logits[-1].argmax()))
    return ids[len(prompt) :]


@pytest.mark.parametrize("name", list(FAMILIES))
def test_a_prefill_then_verifies_in_the_same_buffers_decode_like_the_model(slot_bundles, name):
    """Three prompts of 9, 2 and 5 tokens prefilled in one padded chunk (logits of each row's last
    token only), then 4-token verifies whose drafts are the model's own continuation with some
    corrupted: rows accept different counts, sit at different lengths, and a finished row idles
    (query_lengths 0). The tokens each row commits are the model's greedy continuation."""
    bundle, target, _ = slot_bundles[name]
    prompts = [[5, 17, 99, 3, 250, 8, 61, 42, 7], [200, 1], [9, 9, 30, 31, 140]]
    wanted = [12, 6, 12]
    truth = [greedy(target, p, n) for p, n in zip(prompts, wanted, strict=True)]
    corrupt = {(0, 2), (1, 1), (2, 0), (2, 5)}  # (row, index into the truth) drafted wrong
    rows = len(prompts)
    slots = Slots(bundle, target, rows)
    chunk = np.zeros((rows, max(map(len, prompts))), np.int64)
    for row, prompt in enumerate(prompts):
        chunk[row, : len(prompt)] = prompt
    lengths = [len(p) for p in prompts]
    logits, _ = slots.step(chunk, [0] * rows, lengths, [[n - 1] for n in lengths])
    out = [[int(logits[row, 0].argmax())] for row in range(rows)]
    steps = 0
    while any(len(o) < n for o, n in zip(out, wanted, strict=True)):
        steps += 1
        block, valid = np.zeros((rows, 4), np.int64), []
        for row in range(rows):
            done = len(out[row]) >= wanted[row]
            start = len(out[row])
            drafts = [(t + 1) % target.vocab_size if (row, start + i) in corrupt else t
                      for i, t in enumerate(truth[row][start : start + 3])]
            block[row, : 1 + len(drafts)] = [out[row][-1], *drafts]
            valid.append(0 if done else 1 + len(drafts))
        logits, _ = slots.step(block, lengths, valid, np.tile(np.arange(4), (rows, 1)))
        for row in range(rows):
            if valid[row] == 0:
                continue
            posterior = logits[row, : valid[row]].argmax(-1).tolist()
            accepted = 0
            while accepted < valid[row] - 1 and block[row, 1 + accepted] == posterior[accepted]:
                accepted += 1
            lengths[row] += 1 + accepted  # the bonus and the accepted drafts; the rest is rolled back
            out[row] += posterior[: accepted + 1]
    assert [o[:n] for o, n in zip(out, wanted, strict=True)] == truth
    assert steps < max(wanted)  # drafts were accepted: multi-token verifies were exercised


def test_the_manifest_records_contract_2_and_the_exact_target_io(slot_bundles, tmp_path):
    bundle, target, _ = slot_bundles["qwen3"]
    manifest = read_bundle(bundle)
    assert (manifest["contract"], manifest["flavour"]) == (2, "slots")
    spec = manifest["graphs"]["target"]
    layers = target.num_layers
    assert [io["name"] for io in spec["inputs"]] == ["input_ids", "cache_lengths", "query_lengths", "logits_index",
                                                     *slot_kv_names(layers)]
    assert [io["name"] for io in spec["outputs"]] == ["logits", "features", *slot_kv_names(layers, "_out")]
    assert spec["inputs"][4]["shape"] == ["batch", target.config.num_key_value_heads, "capacity", target.config.head_dim]
    assert spec["outputs"][0]["shape"] == ["batch", "rows", target.vocab_size]
    assert set(manifest["checks"]["polygraphy_vs_pytorch"].values()) >= {"passed"}
    assert manifest["checks"]["polygraphy_inspect"]["target"]["custom_ops"] == ["com.microsoft::GroupQueryAttention"]
    # the draft graphs are the portable ones
    assert [io["name"] for io in manifest["graphs"]["draft_block"]["inputs"]][:2] == ["block_ids", "context_lengths"]


def test_portable_bundles_record_contract_1_and_a_contract_must_match_its_flavour(bundles, slot_bundles, tmp_path):
    import json
    import shutil

    assert json.loads((bundles["qwen3"][0] / "bundle.json").read_text())["contract"] == 1
    copy = shutil.copytree(slot_bundles["qwen3"][0], tmp_path / "b")
    manifest = json.loads((copy / "bundle.json").read_text())
    (copy / "bundle.json").write_text(json.dumps({**manifest, "contract": 1}))
    with pytest.raises(DFlashError, match="slots-flavour bundle has graph contract 2, but its manifest says 1"):
        read_bundle(copy)


@pytest.mark.parametrize("engine", ["tensorrt-rtx", "tensorrt"])
def test_tensorrt_builds_refuse_a_slots_bundle_before_any_work(slot_bundles, tmp_path, engine):
    out = tmp_path / "engines"
    config = BuildConfig(engine=engine, compute_capabilities=("12.0",) if engine == "tensorrt-rtx" else ())
    with pytest.raises(DFlashError, match="slots-flavour .*GroupQueryAttention.*--flavour portable") as err:
        build_engines(slot_bundles["qwen3"][0], out, config)
    assert "\n" not in str(err.value) and not out.exists()


@pytest.mark.parametrize("name", list(FAMILIES))
def test_the_slots_target_rotates_queries_and_keys_inside_group_query_attention(slot_bundles, name):
    """RoPE is GroupQueryAttention's own (do_rotary from per-token tables), not ~20 nodes a layer: no
    Neg is left (rotate_half's), and the graph still equals the model (the ragged-step test above)."""
    import onnx

    bundle, target, _ = slot_bundles[name]
    nodes = onnx.load(str(bundle / "target.onnx"), load_external_data=False).graph.node
    attention = [n for n in nodes if n.op_type == "GroupQueryAttention"]
    assert len(attention) == target.config.num_hidden_layers
    for node in attention:
        assert {a.name: a.i for a in node.attribute if a.name in ("do_rotary", "rotary_interleaved")} == {
            "do_rotary": 1, "rotary_interleaved": 0}
        assert all(node.input[7:10]), "cos_cache, sin_cache and position_ids are bound"
    assert not [n for n in nodes if n.op_type == "Neg"]


def test_an_onnxruntime_engine_keeps_group_query_attention_and_runs_in_place(slot_bundles, tmp_path):
    import onnx

    bundle, target, taps = slot_bundles["qwen3-window"]
    out = tmp_path / "engines"
    build_engines(bundle, out, BuildConfig(engine="onnxruntime", max_seq_len=CAPACITY))
    ops = {n.op_type for n in onnx.load(str(out / "target.onnx"), load_external_data=False).graph.node}
    assert "GroupQueryAttention" in ops
    ids, committed, valid = [[4, 8, 15, 16], [23, 42, 0, 0]], [0, 0], [4, 2]
    results = [Slots(root, target, 2).step(ids, committed, valid, [[3], [1]]) for root in (bundle, out)]
    np.testing.assert_allclose(results[1][0], results[0][0], atol=ATOL, rtol=0)
    ref_logits, _ = reference(target, taps, ids[1][:2])
    np.testing.assert_allclose(results[1][0][1, 0], ref_logits[-1], atol=ATOL, rtol=0)


def test_a_float16_slots_bundle_passes_its_check_and_decodes_like_float32(tiny_pairs, tmp_path):
    target_dir, draft_dir = tiny_pairs["qwen3"]
    target, tokenizer = load_target(str(target_dir))
    bundle = export_bundle(target, load_drafter(draft_dir), tokenizer, tmp_path / "b", flavour="slots", dtype="float16")
    manifest = read_bundle(bundle)
    assert manifest["checks"]["polygraphy_vs_pytorch"]["target"] == "passed"
    session = ort.InferenceSession(str(bundle / "target.onnx"), providers=["CPUExecutionProvider"])
    cfg = target.config
    caches = {n: np.zeros((1, cfg.num_key_value_heads, 16, cfg.head_dim), np.float16) for n in slot_kv_names(target.num_layers)}
    prompt = [5, 17, 99, 3, 250, 8]
    logits, *_ = session.run(None, {"input_ids": np.array([prompt]), "cache_lengths": np.array([0]),
                                    "query_lengths": np.array([len(prompt)]), "logits_index": np.array([[len(prompt) - 1]]),
                                    **caches})
    assert int(logits[0, 0].argmax()) == greedy(target, prompt, 1)[0]


def test_bfloat16_slots_export_skips_the_onnxruntime_check(tiny_pairs, tmp_path):
    target_dir, draft_dir = tiny_pairs["llama"]
    target, tokenizer = load_target(str(target_dir))
    bundle = export_bundle(target, load_drafter(draft_dir), tokenizer, tmp_path / "b", flavour="slots", dtype="bfloat16")
    assert read_bundle(bundle)["checks"]["polygraphy_vs_pytorch"]["target"].startswith("skipped")


def test_the_cli_exports_slots_inspects_the_contract_runs_it_and_refuses_tensorrt(tiny_pairs, tmp_path):
    from click.testing import CliRunner

    from dflash_trt.cli import main

    target_dir, draft_dir = tiny_pairs["qwen3"]
    out = tmp_path / "b"
    result = CliRunner().invoke(main, ["export", "--target", str(target_dir), "--draft", str(draft_dir), "-o", str(out),
                                       "--flavour", "slots", "--no-check"])
    assert result.exit_code == 0, result.output
    result = CliRunner().invoke(main, ["inspect", str(out)])
    assert "slots flavour" in result.output and "graph contract 2" in result.output
    result = CliRunner().invoke(main, ["build", "--bundle", str(out), "-o", str(tmp_path / "e"), "--engine",
                                       "tensorrt-rtx", "--compute-capability", "12.0"])
    assert result.exit_code != 0 and "slots-flavour" in result.output
    assert len(result.output.strip().splitlines()) == 1, result.output
    assert not (tmp_path / "e").exists()
    # generate runs it on the C++ onnxruntime executor, like the torch pair it came from
    if getattr(importlib.import_module("dflash_trt._core"), "HAS_ORT_EXECUTOR", False):
        args = ["--max-tokens", "6", "--block-size", "4", "hey"]
        ours = CliRunner().invoke(main, ["generate", "--bundle", str(out), *args])
        ref = CliRunner().invoke(main, ["generate", "--target", str(target_dir), "--draft", str(draft_dir),
                                        "--backend", "torch", *args])
        assert ours.exit_code == 0 and ref.exit_code == 0, ours.output + ref.output
        assert ours.stdout.splitlines()[0] == ref.stdout.splitlines()[0]


def test_every_row_needs_room_for_the_padded_chunk_and_an_idle_row_can_sit_at_zero(slot_bundles):
    """onnxruntime's rule, which the runtime must keep: cache_lengths + new <= capacity for every row,
    idle rows included (query_lengths 0 is no exemption); an idle row fed cache_lengths 0 always fits."""
    bundle, target, _ = slot_bundles["llama"]
    slots = Slots(bundle, target, 2)
    ids = np.ones((2, 4), np.int64)
    with pytest.raises(Exception, match="does not fit in the KV cache capacity"):
        slots.step(ids, [CAPACITY - 2, 0], [0, 4], [[0], [3]])
    before = [c[0].copy() for c in slots.caches]
    slots.step(ids, [0, 0], [0, 4], [[0], [3]])
    assert all(np.array_equal(c[0], b) for c, b in zip(slots.caches, before, strict=True))

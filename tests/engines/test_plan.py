"""`build --dry-run`: the plan's numbers against HF's own models and by hand, and the command that prints
it without downloading, exporting or writing anything."""

import json
import shutil
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from factories import SMALL, draft_config_dict, linear_attention, make_drafter, make_target, target_config
from transformers import AutoModelForCausalLM, LlamaConfig, MistralConfig, Qwen2Config, Qwen3MoeConfig
from transformers.models.qwen3_5_moe import Qwen3_5MoeTextConfig

from dflash_trt.cli import main
from dflash_trt.engines.config import BuildConfig
from dflash_trt.engines.plan import (
    GIB,
    drafter_parameters,
    kv_bytes_per_token,
    plan_pair,
    position_input_bytes,
    state_bytes_per_request,
    target_parameters,
)
from dflash_trt.models.draft_config import DraftConfig
from dflash_trt.models.drafter import DFlashDrafter

COMMON = dict(vocab_size=264, num_hidden_layers=4, max_position_embeddings=512, **SMALL)
MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32)


def configs():
    """Every family the torch backend decodes, with the options that change the count."""
    no_dense = {k: v for k, v in COMMON.items() if k != "intermediate_size"}
    return {
        "llama": target_config("llama"),
        "llama-biases-untied": LlamaConfig(**COMMON, attention_bias=True, mlp_bias=True, tie_word_embeddings=False),
        "mistral": MistralConfig(**COMMON),
        "qwen2": Qwen2Config(**COMMON),
        "qwen3": target_config("qwen3"),
        "qwen3_moe": target_config("qwen3_moe"),
        # layer 1 dense by mlp_only_layers, layers 0 and 2 by decoder_sparse_step: layer 3 alone is MoE
        "qwen3_moe-dense-layers": Qwen3MoeConfig(**COMMON, **MOE, mlp_only_layers=[1], decoder_sparse_step=2),
        "qwen3_next": target_config("qwen3_next"),
        "qwen3_5_text": target_config("qwen3_5_text"),
        "qwen3_5_moe_text": Qwen3_5MoeTextConfig(**no_dense, **linear_attention(4), **MOE,
                                                 shared_expert_intermediate_size=48),
    }


@pytest.mark.parametrize("name", list(configs()))
def test_parameter_counts_equal_the_hf_models_built_from_the_same_config(name):
    config = configs()[name]
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    counted = target_parameters(config)
    assert counted["total"] == sum(p.numel() for p in model.parameters())  # tied weights counted once
    assert counted["total"] == sum(v for k, v in counted.items() if k not in ("total", "active"))


def test_active_parameters_leave_out_the_experts_a_token_does_not_pick():
    counted = target_parameters(configs()["qwen3_moe-dense-layers"])
    sparse_layers = 1  # layer 3 only: 1 is listed dense, 0 and 2 are off the sparse step
    idle = sparse_layers * (4 - 2) * 3 * 64 * 32
    assert counted["total"] - counted["active"] == idle
    dense = target_parameters(configs()["qwen3"])
    assert dense["active"] == dense["total"]


def test_a_published_moe_size_comes_out():
    """Qwen3-30B-A3B's config fields; its model card states 30.5B parameters, 3.3B activated."""
    config = Qwen3MoeConfig(vocab_size=151936, hidden_size=2048, intermediate_size=6144, num_hidden_layers=48,
                            num_attention_heads=32, num_key_value_heads=4, head_dim=128, num_experts=128,
                            num_experts_per_tok=8, moe_intermediate_size=768)
    counted = target_parameters(config)
    assert 30.5e9 <= counted["total"] < 30.6e9 and 3.3e9 <= counted["active"] < 3.4e9  # the card truncates
    # K/V per token by hand: 48 layers x (K and V) x 4 heads x 128 x 2 bytes
    assert kv_bytes_per_token(config, "bfloat16") == 48 * 2 * 4 * 128 * 2 == 96 * 1024


def test_drafter_count_equals_the_drafter_module():
    for raw in (draft_config_dict(), draft_config_dict(layers=3, target_layer_ids=[0, 1, 3], attention_bias=True)):
        config = DraftConfig.from_dict(raw)
        assert drafter_parameters(config) == sum(p.numel() for p in DFlashDrafter(config).parameters())


def test_kv_and_state_bytes_of_a_hybrid_target_by_hand():
    """qwen3_5_text tiny: layers 1 and 3 full attention (2 K/V heads of 16), 0 and 2 Gated DeltaNet
    (2 key heads and 4 value heads of 16, conv kernel 4)."""
    config = configs()["qwen3_5_text"]
    assert kv_bytes_per_token(config, "float32") == 2 * 2 * 2 * 16 * 4
    conv = (2 * 2 * 16 + 4 * 16) * (4 - 1)  # q, k, v channels x the kernel's last 3 inputs
    recurrent = 4 * 16 * 16  # value heads x key dim x value dim, float32 in every bundle dtype
    assert state_bytes_per_request(config, "float16") == 2 * (conv * 2 + recurrent * 4)
    assert state_bytes_per_request(configs()["qwen3"], "float16") == 0
    # per verified position: the conv input column (float16) and key, value, g, beta (float32)
    assert position_input_bytes(config, "float16") == 2 * ((2 * 2 * 16 + 4 * 16) * 2 + (2 * 16 + 4 * 16 + 2 * 4) * 4)
    assert position_input_bytes(configs()["qwen3"], "float16") == 0


@pytest.fixture
def config_only_pair(tmp_path):
    """A qwen3_moe target and a drafter as a user sees them before downloading: config.json only."""
    made = {}
    for name, family in (("moe", "qwen3_moe"), ("hybrid", "qwen3_next")):
        full = make_target(tmp_path / "full" / name, family, tokenizer=False)
        (tmp_path / name).mkdir()
        shutil.copy(full / "config.json", tmp_path / name / "config.json")
        made[name] = tmp_path / name
    (tmp_path / "draft").mkdir()
    (tmp_path / "draft" / "config.json").write_text(json.dumps(draft_config_dict(target_layer_ids=[1, 2])))
    shutil.rmtree(tmp_path / "full")
    return made, tmp_path / "draft"


def files_under(path):
    return sorted(str(p) for p in path.rglob("*"))


def test_dry_run_prints_the_plan_and_exports_downloads_and_writes_nothing(config_only_pair, tmp_path, monkeypatch):
    import dflash_trt.export.bundle as bundle
    import dflash_trt.models.checkpoints as checkpoints

    def forbidden(*args, **kwargs):
        raise AssertionError("a dry run loaded weights or exported")

    monkeypatch.setattr(bundle, "export_bundle", forbidden)
    monkeypatch.setattr(checkpoints, "load_target", forbidden)
    targets, draft = config_only_pair
    before = files_under(tmp_path)
    args = ["build", "--target", str(targets["moe"]), "--draft", str(draft), "--dry-run", "--engine", "onnxruntime",
            "--dtype", "bf16", "--max-batch", "4", "--max-seq-len", "1024", "-o", str(tmp_path / "engines")]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert files_under(tmp_path) == before  # not even the -o directory
    out = result.stdout
    counted = target_parameters(Qwen3MoeConfig.from_pretrained(targets["moe"]))
    assert "target total" in out and f"({counted['total']:,})" in out
    assert "moe experts" in out and "target active per token" in out
    assert "target.onnx, draft_context.onnx, draft_block.onnx (slots flavour, bf16) -> 3 onnxruntime engines" in out
    assert "export: supported" in out
    assert "max batch 4, max seq len 1024, block 4" in out
    # K/V per token in bf16: 4 layers x 2 x 2 heads x 16 x 2 bytes = 512 B; the drafter's 2 layers: 256 B
    assert "K/V per token (bf16): target 512 B, drafter 256 B" in out
    assert "fp32 " in out and "fp16 " in out and "bf16 " in out
    assert "pass --gpu-memory GiB" in out


def test_a_hybrid_target_is_planned_exportable(config_only_pair):
    targets, draft = config_only_pair
    for flavour in ("portable", "slots"):
        result = CliRunner().invoke(main, ["build", "--target", str(targets["hybrid"]), "--draft", str(draft),
                                           "--dry-run", "--engine", "onnxruntime", "--flavour", flavour])
        assert result.exit_code == 0, result.output
        assert "export: supported" in result.stdout
        assert "linear attention" in result.stdout and "conv + recurrent states" in result.stdout


def test_a_family_without_graphs_is_planned_and_build_refuses_it_before_loading(config_only_pair, tmp_path,
                                                                                 monkeypatch, hybrid_target, tiny_pairs):
    """Every supported family exports today; a family without graphs (qwen3_next struck from the list
    here) is still planned, and build refuses it in one line before any weights load."""
    import dflash_trt.export.graphs as graphs
    import dflash_trt.models.checkpoints as checkpoints

    monkeypatch.setattr(graphs, "EXPORTABLE_TARGETS", frozenset({"llama", "qwen3"}))
    targets, draft = config_only_pair
    result = CliRunner().invoke(main, ["build", "--target", str(targets["hybrid"]), "--draft", str(draft),
                                       "--dry-run", "--engine", "onnxruntime"])
    assert result.exit_code == 0 and "export: target model_type 'qwen3_next' has no ONNX graph yet" in result.stdout
    monkeypatch.setattr(checkpoints, "load_target", lambda *a, **k: pytest.fail("weights loaded before the refusal"))
    out = tmp_path / "engines"
    result = CliRunner().invoke(main, ["build", "--target", str(hybrid_target), "--draft", str(tiny_pairs["qwen3"][1]),
                                       "-o", str(out), "--engine", "onnxruntime"])
    assert result.exit_code == 2 and not out.exists()
    assert result.output.strip().splitlines() == [
        "Error: export: target model_type 'qwen3_next' has no ONNX graph yet (exportable: llama, qwen3)"]


@pytest.mark.parametrize("batch", [1, 64])
def test_the_fit_verdict_adds_weights_requests_and_the_stated_margin(config_only_pair, batch):
    targets, draft = config_only_pair
    config = BuildConfig(engine="onnxruntime", dtype="float16", max_batch=batch, max_seq_len=4096)
    plan = plan_pair(str(targets["hybrid"]), str(draft), config, "portable", None)
    total, margin = plan.needed
    assert total == plan.weight_bytes("float16") + batch * plan.per_request
    assert margin == int(GIB + 0.1 * total)
    need_gib = (total + margin) / GIB
    for have, verdict in ((need_gib * 1.01, "fits in"), (need_gib * 0.99, "does NOT fit")):
        result = CliRunner().invoke(main, ["build", "--target", str(targets["hybrid"]), "--draft", str(draft),
                                           "--dry-run", "--engine", "onnxruntime", "--dtype", "fp16", "--max-batch",
                                           str(batch), "--max-seq-len", "4096", "--gpu-memory", f"{have:.6f}"])
        assert result.exit_code == 0, result.output
        assert verdict in result.stdout.splitlines()[-1]


def test_dry_run_refusals_are_one_line(config_only_pair, bundles, tmp_path):
    targets, draft = config_only_pair
    cases = [
        (["--target", str(targets["moe"]), "--draft", str(draft), "--gpu-memory", "24", "-o", str(tmp_path / "e")],
         "--gpu-memory checks a plan: add --dry-run"),
        (["--bundle", str(bundles["qwen3"][0]), "--dry-run"], "--dry-run plans from the pair's configs"),
        (["--target", str(targets["moe"]), "--draft", str(draft), "--dry-run", "--gpu-memory", "0"],
         "--gpu-memory must be a positive number of GiB"),
        (["--target", str(tmp_path / "nowhere" / "x"), "--dry-run"], "is neither a directory, a hub id"),
        (["--target", str(targets["moe"])], "build needs -o/--output DIR"),
    ]
    for args, message in cases:
        result = CliRunner().invoke(main, ["build", "--engine", "onnxruntime", *args])
        assert result.exit_code == 2 and message in result.output, result.output
        assert len(result.output.strip().splitlines()) == 1
    assert not (tmp_path / "e").exists()


def test_a_drafter_for_another_target_is_refused_by_the_plan_naming_the_field(config_only_pair, tmp_path):
    targets, _ = config_only_pair
    other = make_drafter(tmp_path / "wide", hidden_size=128, target_layer_ids=[1, 2])
    result = CliRunner().invoke(main, ["build", "--target", str(targets["moe"]), "--draft", str(other), "--dry-run",
                                       "--engine", "onnxruntime"])
    assert result.exit_code == 2 and "drafter hidden_size=128 but the target's is 64" in result.output


ZLAB = Path(__file__).resolve().parent.parent / "data" / "zlab"


def test_the_seed_pair_is_planned_from_its_published_configs():
    """Qwen3.5-35B-A3B + its z-lab drafter (tests/data/zlab): hybrid MoE, exportable, planned."""
    config = BuildConfig(engine="onnxruntime", dtype="bfloat16", max_batch=8, max_seq_len=32768)
    plan = plan_pair(str(ZLAB / "targets" / "Qwen3.5-35B-A3B"), str(ZLAB / "drafters" / "Qwen3.5-35B-A3B-DFlash"),
                     config, "portable", 96)
    assert plan.model_type == "qwen3_5_moe_text" and plan.export_refusal is None
    assert plan.layers == {"attention": 10, "linear": 30, "moe": 40}
    assert 34e9 < plan.parameters["total"] < 35e9 and 3e9 < plan.parameters["active"] < 4e9  # "35B-A3B"
    assert plan.kv_per_token == 10 * 2 * 2 * 256 * 2  # 10 full-attention layers, 2 K/V heads of 256, bf16
    # 30 Gated DeltaNet layers: conv over q, k, v (2 x 16 x 128 + 32 x 128 channels, last 3 inputs) and
    # a 32 x 128 x 128 recurrent state
    assert plan.states == 30 * ((2 * 16 * 128 + 32 * 128) * 3 * 2 + 32 * 128 * 128 * 4)  # bf16 conv, fp32 state
    assert plan.block_size == 16


def test_a_published_drafter_size_comes_out():
    """Qwen3-4B-DFlash-b16 is ~1.07 GB in bf16 (research/dflash.md)."""
    draft = DraftConfig.from_dir(ZLAB / "drafters" / "Qwen3-4B-DFlash-b16")
    assert abs(drafter_parameters(draft) * 2 - 1.07e9) < 0.01e9


def test_the_plan_states_the_exports_peak_memory_and_export_refuses_a_pair_too_big_for_the_machine(
        config_only_pair, tiny_pairs, tmp_path, monkeypatch):
    """The estimate: the weights the export holds times the measured peak ratio; an export that would
    not fit this machine's memory is refused in one line before any weights load."""
    import dflash_trt.engines.plan as plan
    import dflash_trt.models.checkpoints as checkpoints

    targets, draft = config_only_pair
    config = Qwen3MoeConfig.from_pretrained(targets["moe"])
    held = target_parameters(config)["total"] + plan.drafter_parameters(plan.DraftConfig.from_dir(draft))
    result = CliRunner().invoke(main, ["build", "--target", str(targets["moe"]), "--draft", str(draft), "--dry-run",
                                       "--engine", "onnxruntime", "--dtype", "bf16"])
    assert result.exit_code == 0, result.output
    peak = plan._bytes(held * 2 * plan.EXPORT_PEAK_PER_WEIGHT_BYTE["bfloat16"])
    assert f"export (bf16): peak memory about {peak} ({plan.EXPORT_PEAK_PER_WEIGHT_BYTE['bfloat16']:g}x the {plan._bytes(held * 2)} of weights it holds" in result.stdout
    assert ": fits" in result.stdout
    monkeypatch.setattr(plan, "machine_memory", lambda: 1024)
    monkeypatch.setattr(checkpoints, "load_target", lambda *a, **k: pytest.fail("weights loaded before the refusal"))
    target, tiny_draft = tiny_pairs["qwen3"]
    for command in (["export"], ["build", "--engine", "onnxruntime"]):
        result = CliRunner().invoke(main, [*command, "--target", str(target), "--draft", str(tiny_draft),
                                           "-o", str(tmp_path / "out")])
        assert result.exit_code == 2 and not (tmp_path / "out").exists()
        (line,) = result.output.strip().splitlines()
        assert line.startswith("Error: export: the fp32 weights (") and "this machine has 1.00 KiB" in line


def test_the_plan_states_a_tensorrt_rtx_builds_peak_memory_and_build_refuses_what_cannot_fit(
        config_only_pair, tiny_pairs, bundles, tmp_path, monkeypatch):
    """A TensorRT-RTX build holds the measured multiple of the weights: the dry run says so, and a build
    the machine cannot hold is refused in one line before any weights load or any engine is built,
    from --target/--draft (memory enough to export, not to build) and from a --bundle (its files)."""
    import dflash_trt.engines.plan as plan
    import dflash_trt.engines.trt_engine as trt_engine
    import dflash_trt.models.checkpoints as checkpoints

    targets, draft = config_only_pair
    config = Qwen3MoeConfig.from_pretrained(targets["moe"])
    held = plan.pair_weight_bytes(config, plan.DraftConfig.from_dir(draft), "bfloat16")
    rtx = ["--engine", "tensorrt-rtx", "--compute-capability", "12.0"]
    result = CliRunner().invoke(main, ["build", "--target", str(targets["moe"]), "--draft", str(draft), "--dry-run",
                                       "--dtype", "bf16", *rtx])
    assert result.exit_code == 0, result.output
    peak = plan._bytes(held * plan.BUILD_PEAK_PER_WEIGHT_BYTE)
    assert f"build (tensorrt-rtx): peak memory about {peak} ({plan.BUILD_PEAK_PER_WEIGHT_BYTE:g}x the weights" in result.stdout
    target, tiny_draft = tiny_pairs["qwen3"]
    weights = plan.pair_weight_bytes(*(checkpoints.read_target_config(str(target))[1], checkpoints.read_draft_config(tiny_draft)),
                                     "float32")
    exportable = int(plan.export_peak_bytes(weights // 4, "float32") * 1.05)  # exports, cannot build
    assert exportable < plan.build_peak_bytes(weights)
    monkeypatch.setattr(plan, "machine_memory", lambda: exportable)
    monkeypatch.setattr(checkpoints, "load_target", lambda *a, **k: pytest.fail("weights loaded before the refusal"))
    monkeypatch.setattr(trt_engine, "build_trt_graph", lambda *a, **k: pytest.fail("an engine built before the refusal"))
    for source in (["--target", str(target), "--draft", str(tiny_draft)], ["--bundle", str(bundles["qwen3"][0])]):
        result = CliRunner().invoke(main, ["build", *source, *rtx, "-o", str(tmp_path / "out")])
        assert result.exit_code == 2 and not (tmp_path / "out").exists(), result.output
        (line,) = result.output.strip().splitlines()
        assert line.startswith("Error: build: TensorRT-RTX engines of ") and "to build, and this machine has" in line

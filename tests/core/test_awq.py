"""export --quant int4-awq: ModelOpt's AWQ-lite scales, folded into the target by ModelOpt's own export
steps, leave the target's function unchanged (its weights only round better), and the int4 bundle
made from them decodes greedy DFlash equal to its own plain greedy decoding."""

import json

import onnx
import pytest
import torch
from factories import export_tiny_slots_bundle, make_target
from scheduler_checks import bundle_scheduler, drive_scheduler

from dflash_trt.export.quantize import quant_refusal
from dflash_trt.models.checkpoints import load_target

pytest.importorskip("modelopt", reason="NVIDIA ModelOpt computes the AWQ scales: pip install nvidia-modelopt")

SMALL_CALIBRATION = {"sequences": 4, "tokens": 32, "seed": 0, "temperature": 1.0}


@pytest.mark.parametrize("family", ["qwen3", "llama"])  # llama: a tied LM head
def test_folding_keeps_the_function_rescales_the_weights_and_leaves_the_target_alone(family, tmp_path):
    from dflash_trt.export.awq import awq_folded

    target, _ = load_target(str(make_target(tmp_path / "t", family)))
    before = {name: p.detach().clone() for name, p in target.model.named_parameters()}
    folded = awq_folded(target, SMALL_CALIBRATION)
    ids = torch.randint(0, 264, (2, 24), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(folded.model(ids).logits, target.model(ids).logits, atol=1e-4, rtol=1e-4)
    changed = {name for name, p in folded.model.named_parameters() if not torch.equal(p, before[name])}
    layers = target.config.num_hidden_layers
    for kind in ("input_layernorm", "post_attention_layernorm", "q_proj", "v_proj", "up_proj"):
        assert sum(kind in name for name in changed) == layers, (kind, sorted(changed))
    assert all(torch.equal(p, before[name]) for name, p in target.model.named_parameters())


def test_an_int4_awq_bundle_decodes_greedy_dflash_equal_to_its_own_plain_decoding(core, ort, tmp_path):
    bundle = export_tiny_slots_bundle(tmp_path, quant="int4-awq")
    record = json.loads((bundle / "bundle.json").read_text())
    assert record["quant"]["weights"] == "int4-awq" and "AWQ-lite" in record["quant"]["method"]
    assert record["quant"]["quantized_matmuls"] == 29 and record["min_query_tokens"] == 2
    model = onnx.load(str(bundle / "target.onnx"), load_external_data=False)
    assert sum(n.op_type == "MatMulNBits" for n in model.graph.node) == 29
    work = [(0, [5, 6, 7], 12), (1, [9, 10, 11, 12], 10), (2, [20], 14)]
    plain, _ = drive_scheduler(core, bundle_scheduler(core, ort, bundle, 1, 1)[0], work)
    tokens, _ = drive_scheduler(core, bundle_scheduler(core, ort, bundle, 3, 4)[0], work)
    assert tokens == plain


def test_a_family_whose_scales_cannot_be_folded_is_refused_in_one_line():
    assert "a qwen3_5_text target is not supported: use --quant int4" in quant_refusal(
        "int4-awq", "slots", "float32", False, "qwen3_5_text")
    assert quant_refusal("int4-awq", "slots-trt", "float32", False, "llama") is None

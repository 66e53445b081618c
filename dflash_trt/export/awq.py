"""Activation-aware scales for an int4 target (`export --quant int4-awq`).

NVIDIA ModelOpt's AWQ-lite (`mtq.INT4_AWQ_CFG`, blocks of 32 as our int4 writer's) searches, per
linear layer, input-channel scales that make its int4 rounding cost the least on activations the
target produces. Calibration text is the target's own: sequences it samples from its BOS token at
temperature 1 (seeded), never a benchmark set. ModelOpt's own export steps then fold the scales away
(`preprocess_linear_fusion` + `fuse_prequant_layernorm`: q/k/v and gate/up share one scale, folded
into the norm before them; `fuse_prequant_to_linear`: o_proj's into v_proj's rows, down_proj's into
up_proj's), leaving a float model with the same function whose weights round to int4 with less
error. The int4 writer (export/quantize.py) then quantizes those weights as it does for `int4`.
"""

from __future__ import annotations

import contextlib
import copy
import io
import warnings

import torch

from dflash_trt.models.target import TargetModel

CALIBRATION = {"sequences": 16, "tokens": 128, "seed": 0, "temperature": 1.0}
BLOCK_SIZE = 32


def _modelopt():
    with warnings.catch_warnings():  # it warns about transformers versions it has not tested
        warnings.simplefilter("ignore")
        import modelopt.torch.quantization as mtq
        from modelopt.torch.export import quant_utils
    return mtq, quant_utils


def calibration_ids(model, sequences: int, tokens: int, seed: int, temperature: float) -> torch.Tensor:
    """[sequences, 1 + tokens] token ids the model samples itself from its BOS token."""
    bos = model.config.bos_token_id if model.config.bos_token_id is not None else 0
    torch.manual_seed(seed)
    start = torch.full((sequences, 1), bos, dtype=torch.long)
    with torch.no_grad():
        return model.generate(start, attention_mask=torch.ones_like(start), do_sample=True, temperature=temperature,
                              top_k=0, top_p=1.0, max_new_tokens=tokens, min_new_tokens=tokens,
                              pad_token_id=bos)


def awq_folded(target: TargetModel, calibration: dict = CALIBRATION) -> TargetModel:
    """A copy of `target` with ModelOpt's AWQ-lite scales folded into its weights and norms (the
    same float function); `target` is left as it was."""
    mtq, quant_utils = _modelopt()
    ids = calibration_ids(target.model, **calibration)
    model = copy.deepcopy(target.model)
    config = copy.deepcopy(mtq.INT4_AWQ_CFG)
    for entry in config["quant_cfg"]:
        if entry.get("quantizer_name") == "*weight_quantizer":
            entry["cfg"]["block_sizes"] = {-1: BLOCK_SIZE, "type": "static"}
    config["quant_cfg"].append({"quantizer_name": "*lm_head*", "enable": False})

    def forward_loop(quantized):
        with torch.no_grad():
            for row in ids:
                quantized(row[None])

    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):  # its progress prints
        warnings.simplefilter("ignore")
        mtq.quantize(model, config, forward_loop)
        for layer in model.model.layers:
            attention, mlp = layer.self_attn, layer.mlp
            for norm, group in ((layer.input_layernorm, [attention.q_proj, attention.k_proj, attention.v_proj]),
                                (layer.post_attention_layernorm, [mlp.gate_proj, mlp.up_proj])):
                quant_utils.preprocess_linear_fusion(group, resmooth_only=True)
                quant_utils.fuse_prequant_layernorm(norm, group)
        quant_utils.fuse_prequant_to_linear(model, fuse_grouped_heads=True)
    folded = copy.deepcopy(target.model)
    weights = model.state_dict()
    for name, module in model.named_modules():  # a scale no fusion took goes back into its own weight
        scale = getattr(getattr(module, "input_quantizer", None), "_pre_quant_scale", None)
        if scale is not None:
            weights[f"{name}.weight"] = module.weight.detach() * scale.to(module.weight.dtype)
    folded.load_state_dict({key: weights[key] for key in folded.state_dict()})
    return TargetModel(folded)

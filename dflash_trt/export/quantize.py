"""Weight-only quantization of an exported target graph (`export --quant`).

fp8 and nvfp4 are TensorRT's float formats, for slots-trt only (export/float_formats.py: ModelOpt's
scales behind standard DequantizeLinear); `quant_build_refusal` says which GPUs build them. int4-awq
is int4 written from weights ModelOpt's AWQ rescaled first (export/awq.py, run by export_bundle).

int4 is onnxruntime's own quantizer (`MatMulNBitsQuantizer`): every MatMul whose weight is an
initializer gets 4-bit weights in blocks of 32 along the input dimension with one float scale per
block (symmetric, round to nearest: no calibration data), in the form the flavour's runtime reads:

- slots (onnxruntime): one `com.microsoft::MatMulNBits` per matmul; `accuracy_level` 4 quantizes each
  activation block to int8 inside the kernel, onnxruntime's fast CPU path. Greedy DFlash stays
  lossless against the quantized target because every target step runs the same kernels (the
  runtime feeds two query rows at least: `ExecutorConfig.min_query_tokens`).
- slots-trt (TensorRT): standard ONNX, a blocked int4 `DequantizeLinear` (opset 21+; the graph is at
  24) into each MatMul, TensorRT's INT4 weight-only form (symmetric, as its dequantize layer requires);
  activations stay float.

Where activations are quantized (int4 on onnxruntime), a verified block equals one-token steps only
when every step feeds two query rows at least (see `min_query_tokens`): the bundle records it.

The embedding lookup, norms and attention stay in the bundle's dtype; the drafter is not quantized.
"""

from __future__ import annotations

import importlib.util
import logging
from collections import Counter
from contextlib import contextmanager
from pathlib import Path

import onnx

from dflash_trt.export.manifest import DRAFT_QUANTS, QUANTS

AWQ_FAMILIES = ("llama", "qwen3")  # ModelOpt folds AWQ scales through these families' module names (export/awq.py)

INT4 = {"block_size": 32, "symmetric": True, "accuracy_level": 4}
_QUANTIZER_LOG = "onnxruntime.quantization.matmul_nbits_quantizer"
FORMS = {  # quant -> flavour -> how its graphs carry the weights
    "int4": {"slots": "com.microsoft.MatMulNBits", "slots-trt": "DequantizeLinear (int4, blocked) into MatMul"},
    "fp8": {"slots-trt": "DequantizeLinear (float8 E4M3, a scale per output channel) into MatMul"},
    "nvfp4": {"slots-trt": "DequantizeLinear (float4 E2M1, blocks of 16 along the input) into MatMul, each block's "
                           "scale a DequantizeLinear of float8 E4M3 by one float32 per tensor"},
}
FORMS["int4-awq"] = FORMS["int4"]  # the same writer, after the AWQ rescaling
# The oldest GPU whose TensorRT builds each float format (TensorRT-RTX 1.7: FP8 for 8.9 and 12.x, FP4
# for 12.x; measured by building here), and why onnxruntime does not serve it.
MIN_COMPUTE_CAPABILITY = {"fp8": "8.9", "nvfp4": "12.0"}
NOT_ON_ONNXRUNTIME = {
    "fp8": "onnxruntime's CPU kernels have no FP8 matmul: they would dequantize every weight at every step",
    "nvfp4": "onnxruntime has no float4 DequantizeLinear kernel",
}


def min_query_tokens(quant: str | None, flavour: str) -> int:
    """Query rows every target step of the bundle must feed (ExecutorConfig.min_query_tokens): 2 where
    activations are quantized, whose rounding turns one-row kernels' last-bit differences into tokens."""
    return 2 if quant in ("int4", "int4-awq") and flavour == "slots" else 1


def quant_refusal(quant: str | None, flavour: str, dtype: str, moe: bool, model_type: str = "") -> str | None:
    """One line for a quantization this export cannot write, before any work; None when it can."""
    if quant is None:
        return None
    if quant not in QUANTS:
        return f"unknown --quant '{quant}'; choose one of {', '.join(QUANTS)}"
    if flavour not in FORMS[quant]:
        if quant in NOT_ON_ONNXRUNTIME:
            return (f"--quant {quant} is a TensorRT weight format, written for --flavour slots-trt "
                    f"({NOT_ON_ONNXRUNTIME[quant]}); for the CPU use --quant int4")
        return (f"--quant {quant} is written for --flavour slots (onnxruntime's MatMulNBits) and slots-trt "
                f"(int4 DequantizeLinear for TensorRT); --flavour {flavour} has no quantized form yet")
    if quant != "int4" and importlib.util.find_spec("modelopt") is None:
        return f"--quant {quant} takes its scales from NVIDIA ModelOpt: pip install 'dflash-trt[quant]'"
    if dtype != "float32":
        return f"--quant {quant} quantizes a float32 export (its activations stay float32); drop --dtype {dtype}"
    if moe:
        return f"--quant {quant} would leave a MoE target's experts in float: not supported yet"
    if quant == "int4-awq" and model_type not in AWQ_FAMILIES:
        return (f"--quant int4-awq folds AWQ scales through {', '.join(AWQ_FAMILIES)} layers; a {model_type} target "
                f"is not supported: use --quant int4")
    return None


def draft_quant_refusal(draft_quant: str | None, flavour: str, dtype: str) -> str | None:
    """One line for a drafter quantization this export cannot write, before any work."""
    if draft_quant is None:
        return None
    if draft_quant not in DRAFT_QUANTS:
        return f"unknown --draft-quant '{draft_quant}'; choose one of {', '.join(DRAFT_QUANTS)}"
    if flavour not in FORMS[draft_quant] or dtype != "float32":
        flavours = " and ".join(FORMS[draft_quant])
        return (f"--draft-quant {draft_quant} is written for float32 --flavour {flavours} exports, not a {dtype} "
                f"{flavour} one")
    if draft_quant != "int4" and importlib.util.find_spec("modelopt") is None:
        return f"--draft-quant {draft_quant} takes its scales from NVIDIA ModelOpt: pip install 'dflash-trt[quant]'"
    return None



def _capability(cc: str) -> tuple[int, int]:
    major, _, minor = cc.partition(".")
    return int(major), int(minor or 0)


def quant_build_refusal(quants: tuple, engine: str, compute_capabilities: tuple[str, ...]) -> str | None:
    """One line for engines that cannot hold the bundle's weight formats (`quants`: the target's and
    the drafter's, None for float), before any engine is built."""
    for quant in quants:
        need = MIN_COMPUTE_CAPABILITY.get(quant or "")
        if need is None:
            continue
        if engine == "onnxruntime":
            return (f"{quant} weights are for TensorRT engines ({NOT_ON_ONNXRUNTIME[quant]}): build --engine "
                    f"tensorrt-rtx or tensorrt")
        old = [cc for cc in compute_capabilities if _capability(cc) < _capability(need)]
        if old:
            return (f"{quant} weights need compute capability {need} or newer (TensorRT has no {quant.upper()} GEMM "
                    f"below it); SM {', '.join(old)} cannot build them: use --quant int4 (any GPU), or no --quant")
    return None


@contextmanager
def _quiet(name: str):
    """onnxruntime's quantizer logs every node it visits at INFO."""
    logger = logging.getLogger(name)
    saved = logger.level
    logger.setLevel(logging.WARNING)
    try:
        yield
    finally:
        logger.setLevel(saved)


def quantize_graph(path: Path, quant: str, flavour: str, external_threshold: int) -> dict:
    """Rewrite the `flavour` graph at `path` (weights in `<path>.data`) with `quant` weights in place;
    -> the manifest's record of what was quantized."""
    if quant in ("int4", "int4-awq"):
        record = quantize_int4(path, flavour, external_threshold)
        if quant == "int4-awq":
            from dflash_trt.export.awq import CALIBRATION

            record.update(weights=quant, method=(
                f"NVIDIA ModelOpt AWQ-lite scales ({CALIBRATION['sequences']} sequences of {CALIBRATION['tokens']} "
                f"tokens the target sampled itself) folded into its norms and projections, then " + record["method"]))
        return record
    from dflash_trt.export.float_formats import NVFP4_BLOCK, quantize_matmul_weights

    model = onnx.load(str(path))
    model, done, left = quantize_matmul_weights(model, quant)
    _save(model, path, external_threshold)
    scales = ({"scales": "one float32 per output channel (amax / 448)"} if quant == "fp8" else
              {"block_size": NVFP4_BLOCK, "scales": "float8 E4M3 per block of 16, times one float32 per tensor"})
    return {
        "weights": quant,
        "method": f"NVIDIA ModelOpt {'FP8QTensor' if quant == 'fp8' else 'NVFP4QTensor'} (round to nearest, no calibration)",
        "form": FORMS[quant][flavour],
        **scales,
        "activations": "float (weight-only)",
        "quantized_matmuls": done,
        "float_matmuls": left,
    }


def _save(model: onnx.ModelProto, path: Path, external_threshold: int) -> None:
    """Write `model` over the graph at `path`, its weights in `<path>.data` (replaced), and check it."""
    data = path.with_name(path.name + ".data")
    data.unlink()  # rewritten below: the float weights it held are gone from the graph
    onnx.save_model(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                    location=data.name, size_threshold=external_threshold)
    data.chmod(path.stat().st_mode & 0o777)  # onnx writes it private; the bundle's other files are not
    onnx.checker.check_model(str(path))


def quantize_int4(path: Path, flavour: str, external_threshold: int) -> dict:
    """Rewrite the `flavour` graph at `path` (weights in `<path>.data`) with int4 weights in place;
    -> the manifest's record of what was quantized."""
    from onnxruntime.quantization import QuantFormat
    from onnxruntime.quantization.matmul_nbits_quantizer import DefaultWeightOnlyQuantConfig, MatMulNBitsQuantizer

    model = onnx.load(str(path))  # with its weights: the quantizer reads and replaces them
    kernel = flavour == "slots"
    config = DefaultWeightOnlyQuantConfig(block_size=INT4["block_size"], is_symmetric=INT4["symmetric"],
                                          accuracy_level=INT4["accuracy_level"] if kernel else None,
                                          quant_format=QuantFormat.QOperator if kernel else QuantFormat.QDQ)
    quantizer = MatMulNBitsQuantizer(model, algo_config=config)
    with _quiet(_QUANTIZER_LOG):
        quantizer.process()
    quantized = quantizer.model.model
    ops = Counter(node.op_type for node in quantized.graph.node)
    _save(quantized, path, external_threshold)
    quantized_matmuls = ops["MatMulNBits"] if kernel else ops["DequantizeLinear"]
    return {
        "weights": "int4",
        "method": "onnxruntime MatMulNBitsQuantizer (round to nearest, no calibration)",
        "form": FORMS["int4"][flavour],
        "block_size": INT4["block_size"],
        "scales": f"one float32 per block of {INT4['block_size']}",
        "symmetric": INT4["symmetric"],
        "activations": "int8 per block inside MatMulNBits (accuracy_level 4)" if kernel else "float (weight-only)",
        "quantized_matmuls": quantized_matmuls,
        "float_matmuls": ops["MatMul"] - (0 if kernel else quantized_matmuls),
    }

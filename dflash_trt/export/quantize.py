"""Weight-only quantization of an exported target graph (`export --quant`).

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

import logging
from collections import Counter
from contextlib import contextmanager
from pathlib import Path

import onnx

from dflash_trt.export.manifest import DRAFT_QUANTS, QUANTS

INT4 = {"block_size": 32, "symmetric": True, "accuracy_level": 4}
_QUANTIZER_LOG = "onnxruntime.quantization.matmul_nbits_quantizer"
FORMS = {  # flavour -> how its graphs carry int4 weights
    "slots": "com.microsoft.MatMulNBits",
    "slots-trt": "DequantizeLinear (int4, blocked) into MatMul",
}


def min_query_tokens(quant: str | None, flavour: str) -> int:
    """Query rows every target step of the bundle must feed (ExecutorConfig.min_query_tokens): 2 where
    activations are quantized, whose rounding turns one-row kernels' last-bit differences into tokens."""
    return 2 if quant == "int4" and flavour == "slots" else 1


def quant_refusal(quant: str | None, flavour: str, dtype: str, moe: bool) -> str | None:
    """One line for a quantization this export cannot write, before any work; None when it can."""
    if quant is None:
        return None
    if quant not in QUANTS:
        return f"unknown --quant '{quant}'; choose one of {', '.join(QUANTS)}"
    if flavour not in FORMS:
        return (f"--quant {quant} is written for --flavour slots (onnxruntime's MatMulNBits) and slots-trt "
                f"(int4 DequantizeLinear for TensorRT); --flavour {flavour} has no quantized form yet")
    if dtype != "float32":
        return f"--quant {quant} quantizes a float32 export (its activations stay float32); drop --dtype {dtype}"
    if moe:
        return f"--quant {quant} would leave a MoE target's experts in float: not supported yet"
    return None


def draft_quant_refusal(draft_quant: str | None, flavour: str, dtype: str) -> str | None:
    """One line for a drafter quantization this export cannot write (int4 only), before any work."""
    if draft_quant is None:
        return None
    if draft_quant not in DRAFT_QUANTS:
        return f"unknown --draft-quant '{draft_quant}'; choose one of {', '.join(DRAFT_QUANTS)}"
    if flavour not in FORMS or dtype != "float32":
        return (f"--draft-quant int4 is written for float32 --flavour slots and slots-trt exports, not a {dtype} "
                f"{flavour} one")
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
    data = path.with_name(path.name + ".data")
    data.unlink()  # rewritten below: the float weights it held are gone from the graph
    onnx.save_model(quantized, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                    location=data.name, size_threshold=external_threshold)
    data.chmod(path.stat().st_mode & 0o777)  # onnx writes it private; the bundle's other files are not
    onnx.checker.check_model(str(path))
    quantized_matmuls = ops["MatMulNBits"] if kernel else ops["DequantizeLinear"]
    return {
        "weights": "int4",
        "method": "onnxruntime MatMulNBitsQuantizer (round to nearest, no calibration)",
        "form": FORMS[flavour],
        "block_size": INT4["block_size"],
        "symmetric": INT4["symmetric"],
        "activations": "int8 per block inside MatMulNBits (accuracy_level 4)" if kernel else "float (weight-only)",
        "quantized_matmuls": quantized_matmuls,
        "float_matmuls": ops["MatMul"] - (0 if kernel else quantized_matmuls),
    }

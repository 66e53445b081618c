"""Weight-only quantization of an exported target graph (`export --quant`).

int4 is onnxruntime's own quantizer (`MatMulNBitsQuantizer`): every MatMul whose weight is an
initializer becomes one `com.microsoft::MatMulNBits` with 4-bit weights in blocks of 32 along the
input dimension, one float scale per block (symmetric, round to nearest: no calibration data).
`accuracy_level` 4 quantizes each activation block to int8 inside the kernel, onnxruntime's fast
CPU path. The embedding lookup, norms and attention stay in the bundle's dtype; the drafter is not
quantized. Greedy DFlash stays lossless against the quantized target because every target step
runs the same kernels (the runtime feeds two query rows at least: `ExecutorConfig.min_query_tokens`).
"""

from __future__ import annotations

import logging
from collections import Counter
from contextlib import contextmanager
from pathlib import Path

import onnx

from dflash_trt.export.manifest import QUANTS

INT4 = {"block_size": 32, "symmetric": True, "accuracy_level": 4}
_QUANTIZER_LOG = "onnxruntime.quantization.matmul_nbits_quantizer"


def quant_refusal(quant: str | None, flavour: str, dtype: str, moe: bool) -> str | None:
    """One line for a quantization this export cannot write, before any work; None when it can."""
    if quant is None:
        return None
    if quant not in QUANTS:
        return f"unknown --quant '{quant}'; choose one of {', '.join(QUANTS)}"
    if flavour != "slots":
        return (f"--quant {quant} writes onnxruntime's MatMulNBits kernel, which only the slots flavour runs; "
                f"--flavour {flavour} has no quantized form yet")
    if dtype != "float32":
        return f"--quant {quant} quantizes a float32 export (its activations stay float32); drop --dtype {dtype}"
    if moe:
        return (f"--quant {quant} leaves a MoE target's experts in float (onnxruntime's MoE kernel takes them "
                f"unquantized): not supported yet")
    return None


@contextmanager
def _quiet(name: str):
    """The quantizer logs every node it visits at INFO."""
    logger = logging.getLogger(name)
    level = logger.level
    logger.setLevel(logging.WARNING)
    try:
        yield
    finally:
        logger.setLevel(level)


def quantize_int4(path: Path, external_threshold: int) -> dict:
    """Rewrite the graph at `path` (weights in `<path>.data`) with int4 weights in place; -> the
    manifest's record of what was quantized."""
    from onnxruntime.quantization.matmul_nbits_quantizer import DefaultWeightOnlyQuantConfig, MatMulNBitsQuantizer

    model = onnx.load(str(path))  # with its weights: the quantizer reads and replaces them
    config = DefaultWeightOnlyQuantConfig(block_size=INT4["block_size"], is_symmetric=INT4["symmetric"],
                                          accuracy_level=INT4["accuracy_level"])
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
    return {
        "weights": "int4",
        "method": "onnxruntime MatMulNBitsQuantizer (round to nearest, no calibration)",
        "block_size": INT4["block_size"],
        "symmetric": INT4["symmetric"],
        "activations": "int8 per block inside MatMulNBits (accuracy_level 4)",
        "quantized_matmuls": ops["MatMulNBits"],
        "float_matmuls": ops["MatMul"],
    }

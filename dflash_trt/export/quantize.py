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

fp8 (slots-trt: TensorRT's FP8 GEMMs, compute capability 8.9+) is onnxruntime's static quantizer:
QuantizeLinear / DequantizeLinear in float8 e4m3 on every weight matmul's weight and input, one
scale per tensor, the activations' scales calibrated on text the target writes itself (greedy
continuations of a few neutral openings: never a benchmark set).

Where activations are quantized (int4 on onnxruntime, fp8), a verified block equals one-token steps
only when every step feeds two query rows at least (see `min_query_tokens`): the bundle records it
and, where the graphs fix the capacity (slots-trt), they hold the one spare position it needs.

The embedding lookup, norms and attention stay in the bundle's dtype; the drafter is not quantized.
"""

from __future__ import annotations

import io
import logging
from collections import Counter
from contextlib import contextmanager, redirect_stdout
from pathlib import Path

import onnx

from dflash_trt.export.manifest import QUANTS

INT4 = {"block_size": 32, "symmetric": True, "accuracy_level": 4}
_QUANTIZER_LOG = "onnxruntime.quantization.matmul_nbits_quantizer"
FORMS = {  # flavour -> how its graphs carry int4 weights
    "slots": "com.microsoft.MatMulNBits",
    "slots-trt": "DequantizeLinear (int4, blocked) into MatMul",
}


# the openings the target continues into its own fp8 calibration text
CALIBRATION_OPENINGS = ("The", "def ", "Once upon a time", "1.", "In this")


def min_query_tokens(quant: str | None, flavour: str) -> int:
    """Query rows every target step of the bundle must feed (ExecutorConfig.min_query_tokens): 2 where
    activations are quantized, whose rounding turns one-row kernels' last-bit differences into tokens."""
    return 2 if quant == "fp8" or (quant == "int4" and flavour == "slots") else 1


def quant_refusal(quant: str | None, flavour: str, dtype: str, moe: bool) -> str | None:
    """One line for a quantization this export cannot write, before any work; None when it can."""
    if quant is None:
        return None
    if quant not in QUANTS:
        return f"unknown --quant '{quant}'; choose one of {', '.join(QUANTS)}"
    if quant == "fp8" and flavour != "slots-trt":
        return (f"--quant fp8 is for TensorRT's FP8 GEMMs (--flavour slots-trt, GPUs of compute capability 8.9+); "
                f"onnxruntime's CPU kernels have none: use --quant int4 for --flavour {flavour}")
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
    if draft_quant != "int4":
        return f"--draft-quant takes int4 only, not '{draft_quant}'"
    if flavour not in FORMS or dtype != "float32":
        return (f"--draft-quant int4 is written for float32 --flavour slots and slots-trt exports, not a {dtype} "
                f"{flavour} one")
    return None


@contextmanager
def _quiet(name: str | None, level: int = logging.WARNING):
    """onnxruntime's quantizers log every node they visit, and print their calibration's progress."""
    logger = logging.getLogger(name)
    saved = logger.level
    logger.setLevel(level)
    try:
        with redirect_stdout(io.StringIO()):
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

def calibration_feeds(target, tokenizer, inputs: list[dict], length: int = 48) -> list[dict]:
    """Prefill feeds of the slots target graph (I/O `inputs` as the manifest declares them, batch 1,
    empty caches and states) over text the target writes itself from CALIBRATION_OPENINGS."""
    import numpy as np
    import torch

    if tokenizer is not None:
        seeds = [tokenizer(text, add_special_tokens=False)["input_ids"] or [0] for text in CALIBRATION_OPENINGS]
    else:
        seeds = [[i % target.vocab_size] for i in range(1, len(CALIBRATION_OPENINGS) + 1)]
    written = []
    for seed in seeds:
        with torch.no_grad():
            written.append(target.model.generate(torch.tensor([seed]), max_new_tokens=length, min_new_tokens=length,
                                                 do_sample=False, pad_token_id=0)[0].tolist())
    n = min(len(ids) for ids in written)  # one length: the calibrator stacks each tensor's values
    feeds = []
    for ids in (ids[:n] for ids in written):
        feed = {"input_ids": np.asarray([ids], np.int64), "cache_lengths": np.zeros(1, np.int64),
                "query_lengths": np.asarray([n], np.int64), "logits_index": np.asarray([[n - 1]], np.int64)}
        for spec in inputs:
            if spec["name"] not in feed:  # caches and linear-attention states: empty
                shape = [1 if dim == "batch" else dim for dim in spec["shape"]]
                feed[spec["name"]] = np.zeros(shape, spec["dtype"])
        feeds.append(feed)
    return feeds


def quantize_fp8(path: Path, feeds: list[dict], external_threshold: int) -> dict:
    """Rewrite the slots-trt graph at `path` with float8 Q/DQ on every weight matmul, the activations'
    scales calibrated on `feeds`; -> the manifest's record."""
    import tempfile

    from onnxruntime.quantization import (CalibrationDataReader, CalibrationMethod, QuantFormat, QuantType,
                                          quantize_static)

    class Feeds(CalibrationDataReader):
        def __init__(self):
            self.remaining = iter(feeds)

        def get_next(self):
            return next(self.remaining, None)

    # the root logger: the static quantizer advises pre-processing (shape inference), which the export did
    with tempfile.TemporaryDirectory(dir=path.parent) as scratch, _quiet(None, logging.ERROR):
        staged = Path(scratch) / path.name
        quantize_static(str(path), str(staged), Feeds(), quant_format=QuantFormat.QDQ, op_types_to_quantize=["MatMul"],
                        activation_type=QuantType.QFLOAT8E4M3FN, weight_type=QuantType.QFLOAT8E4M3FN,
                        calibrate_method=CalibrationMethod.Distribution, use_external_data_format=True,
                        extra_options={"ActivationSymmetric": True, "WeightSymmetric": True})
        quantized = onnx.load(str(staged))
    data = path.with_name(path.name + ".data")
    data.unlink()
    onnx.save_model(quantized, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                    location=data.name, size_threshold=external_threshold)
    data.chmod(path.stat().st_mode & 0o777)
    onnx.checker.check_model(str(path))
    dequantized = {out for node in quantized.graph.node if node.op_type == "DequantizeLinear" for out in node.output}
    matmuls = [node for node in quantized.graph.node if node.op_type == "MatMul"]
    ops = Counter(node.op_type for node in quantized.graph.node)
    return {
        "weights": "fp8",
        "method": f"onnxruntime quantize_static (float8 e4m3, per-tensor scales; activations calibrated on "
                  f"{len(feeds)} sequences the target generated)",
        "form": "QuantizeLinear / DequantizeLinear (float8 e4m3) on each weight matmul's weight and input",
        "activations": "float8 e4m3 at each weight matmul's input",
        "quantized_matmuls": sum(node.input[1] in dequantized for node in matmuls),
        "float_matmuls": sum(node.input[1] not in dequantized for node in matmuls),
        "quantize_nodes": ops["QuantizeLinear"],
    }

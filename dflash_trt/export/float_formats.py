"""TensorRT's low-precision float weight formats for a slots-trt target (`export --quant fp8 | nvfp4`).

Every MatMul whose weight is an initializer [K, N] gets its weight in the format behind a standard
ONNX DequantizeLinear, the form TensorRT parses as a weight-only quantized GEMM (activations stay
float). The scales are NVIDIA ModelOpt's own (its `FP8QTensor` / `NVFP4QTensor`, the code its
checkpoint export uses), computed from the weights alone: round to nearest, no calibration data.

- fp8: float8 E4M3 with one float32 scale per output channel (amax / 448); DequantizeLinear axis 1.
- nvfp4: float4 E2M1 in blocks of 16 along the input dimension, each block's scale a float8 E4M3
  times one float32 scale for the tensor (amax / (6 x 448)): DequantizeLinear(block scales, tensor
  scale) feeds DequantizeLinear(weights, axis 0, block_size 16). A K not divisible by 16 keeps its
  matmul in float.

onnxruntime runs the fp8 form on the CPU (it dequantizes each weight at every step: a check, not a
speed path); it has no float4 DequantizeLinear, so an nvfp4 graph runs on TensorRT only.
"""

from __future__ import annotations

import warnings

import numpy as np
import onnx
import onnx.version_converter
import torch
from onnx import TensorProto, helper, numpy_helper

NVFP4_BLOCK = 16


def _qtensors():
    """ModelOpt's quantized-tensor classes (its import warns about untested transformers versions:
    only these two torch classes are used, no model code)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from modelopt.torch.quantization.qtensor import FP8QTensor, NVFP4QTensor
    return FP8QTensor, NVFP4QTensor


def _to_torch(weight: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(weight.T))  # [N, K]: ModelOpt scales along its last axis


def fp8_rows(rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A weight [N, K] (float32) in fp8 by ModelOpt -> (E4M3 codes [N, K] as torch.float8_e4m3fn, float32
    scales [N]): row n is codes[n] * scales[n]."""
    FP8QTensor, _ = _qtensors()
    quantized, scales = FP8QTensor.quantize(rows, axis=0)  # a scale per row N
    if bool((scales == 0).any()):  # an all-zero row: any scale holds it, and 0 would divide 0 by 0
        quantized, scales = FP8QTensor.quantize(rows, scales=scales.masked_fill(scales == 0, 1.0), axis=0)
    return quantized._quantized_data, scales.reshape(-1).float()


def nvfp4_rows(rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A weight [N, K] (float32, K a multiple of 16) in nvfp4 by ModelOpt -> (E2M1 codes packed two to a
    byte [N, K / 2] (element 2i in the low nibble), E4M3 block scales [N, K / 16] as torch.float8_e4m3fn,
    the float32 tensor scale): element (n, k) is E2M1(code) * block_scale[n, k / 16] * tensor_scale."""
    _, NVFP4QTensor = _qtensors()
    quantized, block_scales, tensor_scale = NVFP4QTensor.quantize(rows, NVFP4_BLOCK)
    return quantized._quantized_data, block_scales, tensor_scale.float()


def _fp8(name: str, weight: np.ndarray) -> tuple[list, list]:
    codes, scales = fp8_rows(_to_torch(weight))
    codes = codes.T.contiguous().view(torch.uint8).numpy()  # [K, N] E4M3 bytes
    initializers = [helper.make_tensor(f"{name}_fp8", TensorProto.FLOAT8E4M3FN, codes.shape, codes.tobytes(), raw=True),
                    numpy_helper.from_array(scales.numpy(), f"{name}_fp8_scale")]
    node = helper.make_node("DequantizeLinear", [f"{name}_fp8", f"{name}_fp8_scale"], [f"{name}_dequantized"],
                            axis=1, name=f"{name}_dequantize")
    return initializers, [node]


def _nvfp4(name: str, weight: np.ndarray) -> tuple[list, list]:
    packed, block_scales, tensor_scale = nvfp4_rows(_to_torch(weight))
    packed = packed.numpy()  # [N, K / 2]: element 2i in the low nibble, 2i + 1 in the high
    codes = np.empty((packed.shape[0], packed.shape[1] * 2), np.uint8)
    codes[:, 0::2], codes[:, 1::2] = packed & 0xF, packed >> 4
    flat = np.ascontiguousarray(codes.T).reshape(-1)  # [K, N] in ONNX's order, packed two to a byte the same way
    onnx_packed = (flat[0::2] | (flat[1::2] << 4)).astype(np.uint8)
    scales = block_scales.T.contiguous().view(torch.uint8).numpy()  # [K / 16, N] E4M3 bytes
    initializers = [
        helper.make_tensor(f"{name}_fp4", TensorProto.FLOAT4E2M1, weight.shape, onnx_packed.tobytes(), raw=True),
        helper.make_tensor(f"{name}_fp4_block_scale", TensorProto.FLOAT8E4M3FN, scales.shape, scales.tobytes(), raw=True),
        numpy_helper.from_array(np.asarray(tensor_scale.item(), np.float32), f"{name}_fp4_tensor_scale"),
    ]
    nodes = [
        helper.make_node("DequantizeLinear", [f"{name}_fp4_block_scale", f"{name}_fp4_tensor_scale"],
                         [f"{name}_fp4_scale"], name=f"{name}_dequantize_scale"),
        helper.make_node("DequantizeLinear", [f"{name}_fp4", f"{name}_fp4_scale"], [f"{name}_dequantized"],
                         axis=0, block_size=NVFP4_BLOCK, name=f"{name}_dequantize"),
    ]
    return initializers, nodes


WRITERS = {"fp8": _fp8, "nvfp4": _nvfp4}
# DequantizeLinear's first opset with the format: float8 inputs with an axis (21, as TensorRT's parser
# reads it), float4 blocks (23). A lower graph (the draft graphs are at 17) is converted first.
MIN_OPSET = {"fp8": 21, "nvfp4": 23}


def _at_opset(model: onnx.ModelProto, opset: int) -> onnx.ModelProto:
    current = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
    return model if current >= opset else onnx.version_converter.convert_version(model, opset)


def quantize_matmul_weights(model: onnx.ModelProto, quant: str) -> tuple[onnx.ModelProto, int, int]:
    """`model` (weights loaded) with each float32 MatMul weight initializer in `quant` behind its
    DequantizeLinear, at an opset that has it -> (model, quantized matmuls, matmuls left in float)."""
    model = _at_opset(model, MIN_OPSET[quant])
    graph = model.graph
    weights = {init.name: init for init in graph.initializer}
    users: dict[str, list] = {}
    for node in graph.node:
        if node.op_type == "MatMul" and len(node.input) == 2 and node.input[1] in weights:
            users.setdefault(node.input[1], []).append(node)
    new_initializers, new_nodes, done, left = [], [], 0, 0
    for name, nodes in users.items():
        init = weights[name]
        if init.data_type != TensorProto.FLOAT or len(init.dims) != 2 or (
                quant == "nvfp4" and init.dims[0] % NVFP4_BLOCK):
            left += len(nodes)
            continue
        initializers, dequantize = WRITERS[quant](name, numpy_helper.to_array(init))
        graph.initializer.remove(init)
        new_initializers += initializers
        new_nodes += dequantize
        for node in nodes:
            node.input[1] = dequantize[-1].output[0]
        done += len(nodes)
    graph.initializer.extend(new_initializers)
    ordered = new_nodes + list(graph.node)  # the dequantizations read initializers only: first is in order
    del graph.node[:]
    graph.node.extend(ordered)
    return model, done, left

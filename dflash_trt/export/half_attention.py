"""The ONNX symbolic of scaled_dot_product_attention for float16 and bfloat16 graphs.

The TorchScript exporter's own symbolic builds the additive mask from float32 constants: in a
float16 graph the scores, the attention output and every layer after the first attention silently
become float32, and with an explicit `scale` a bfloat16 graph does not export at all
(pytorch/pytorch#158658). This one keeps the query's dtype throughout except the softmax, which
runs in float32 as HF's eager attention does. Float32 queries keep the exporter's own symbolic, so
float32 bundles are unchanged.
"""

from __future__ import annotations

import torch
from torch.onnx import symbolic_helper
from torch.onnx._internal.torchscript_exporter import symbolic_opset14
from torch.onnx._internal.torchscript_exporter._type_utils import JitScalarType

FLOAT = JitScalarType.FLOAT.onnx_type()


@symbolic_helper.parse_args("v", "v", "v", "v", "f", "b", "v", "b")
def _sdpa(g, query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa):
    dtype = JitScalarType.from_value(query)
    if dtype == JitScalarType.FLOAT:
        return symbolic_opset14.scaled_dot_product_attention(
            g, query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
    # What the exported graphs use: explicit masks, K/V groups repeated, the scale given, no dropout.
    assert not is_causal and not enable_gqa and dropout_p == 0.0 and not symbolic_helper._is_none(scale)
    scale = symbolic_helper._maybe_get_const(scale, "f")
    # Scaled before the product, so half-precision scores stay far from overflow.
    query = g.op("Mul", query, g.op("Constant", value_t=torch.tensor(scale, dtype=dtype.dtype())))
    perm = list(range(symbolic_helper._get_tensor_rank(key)))
    perm[-2:] = perm[-1], perm[-2]
    scores = g.op("Cast", g.op("MatMul", query, g.op("Transpose", key, perm_i=perm)), to_i=FLOAT)
    if not symbolic_helper._is_none(attn_mask):  # boolean, True where a key is visible
        assert JitScalarType.from_value(attn_mask) == JitScalarType.BOOL
        bias = g.op("Where", attn_mask, g.op("Constant", value_t=torch.tensor(0.0)),
                    g.op("Constant", value_t=torch.tensor(float("-inf"))))
        scores = g.op("Add", scores, bias)
    weights = g.op("Cast", g.op("Softmax", scores, axis_i=-1), to_i=dtype.onnx_type())
    return g.op("MatMul", weights, value)


def register_half_attention(opset: int) -> None:
    torch.onnx.register_custom_op_symbolic("aten::scaled_dot_product_attention", _sdpa, opset)

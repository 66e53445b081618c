"""Weight-only int4 / fp8 / nvfp4 targets on the torch backend (`LLM(backend="torch", quant=...)`).

Every linear layer of the target (its decoder layers and its LM head) holds its weight as the slots-trt
export writes it (export/quantize.py, export/float_formats.py: int4 in blocks of 32 along the input with a
float32 scale each; fp8 E4M3 with a scale per output row; nvfp4 E2M1 in blocks of 16 along the input with
E4M3 block scales and a float32 tensor scale) and dequantizes it at every
call, as the exported graph's DequantizeLinear feeds its MatMul: the same quantized target TensorRT
would run, stored in the format's bytes. The product is in the model's dtype; no kernel here multiplies
in fp8 or fp4 (a check of the format, not a speed path). The drafter stays in the model's dtype (its
head is built from the float LM head first). A linear whose input width is not a multiple of 16 stays
in float for nvfp4, as in the export. MoE routers and experts (parameters, not linear layers) stay in
float here, where the export quantizes the router's matmul: on MoE targets the two differ in that.

int4 codes come from onnxruntime's quantizer, as in the export. For fp8 and nvfp4 the export computes
its scales with NVIDIA ModelOpt; `fp8_weight` and `nvfp4_weight` are ModelOpt's
formulas (FP8QTensor / NVFP4QTensor.quantize) in plain torch, because ModelOpt's import pulls in
packages the GPU machine lacks (scipy, pulp, omegaconf: more than its carry allows). Tests hold them
to ModelOpt bit for bit.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

NVFP4_BLOCK = 16  # export/float_formats.py's
E4M3_MAX, E2M1_MAX = 448.0, 6.0
E2M1_BOUNDS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)  # between consecutive magnitudes; ties go up at 0.75, 1.75, 3.5


INT4_BLOCK = 32  # export/quantize.py's INT4 block size (symmetric, round to nearest)


def int4_weight(rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """rows [N, K] float32 -> (signed int4 codes [N, K] as int8, float32 scales [N, ceil(K / 32)]): row n's
    block b is codes * scale[n, b], by onnxruntime's own block quantizer with the export's settings
    (MatMulNBitsQuantizer's QDQ form, which the slots-trt int4 graph carries)."""
    from onnxruntime.quantization import QuantFormat
    from onnxruntime.quantization.matmul_nbits_quantizer import DefaultWeightOnlyQuantConfig, DefaultWeightOnlyQuantizer

    n, k = rows.shape
    config = DefaultWeightOnlyQuantConfig(block_size=INT4_BLOCK, is_symmetric=True, quant_format=QuantFormat.QDQ)
    packed, scales, _ = DefaultWeightOnlyQuantizer(config).qbits_block_quant(rows.T.contiguous().numpy())  # of [K, N]
    packed = torch.from_numpy(packed)  # [K * N] two's-complement nibbles, element 2i in the low one
    codes = torch.stack([packed & 0xF, packed >> 4], dim=-1).flatten()[: k * n].to(torch.int8)
    codes = torch.where(codes >= 8, codes - 16, codes).view(k, n).T.contiguous()
    return codes, torch.from_numpy(scales).float().T.contiguous()


def fp8_weight(rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """rows [N, K] float32 -> (E4M3 codes [N, K], float32 scales [N]): a scale per row, amax / 448 (an
    all-zero row takes 1), codes = rows / scale rounded to E4M3."""
    scales = rows.abs().amax(dim=1, keepdim=True) / E4M3_MAX
    scales = scales.masked_fill(scales == 0, 1.0)
    return (rows / scales).to(torch.float8_e4m3fn), scales.reshape(-1)


def nvfp4_weight(rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """rows [N, K] float32, K a multiple of 16 -> (E2M1 codes packed two to a byte [N, K / 2], element 2i
    in the low nibble; E4M3 block scales [N, K / 16]; the float32 tensor scale amax / (6 * 448))."""
    n, k = rows.shape
    tensor_scale = rows.abs().amax().float() / (E2M1_MAX * E4M3_MAX)
    blocks = rows.view(n, k // NVFP4_BLOCK, NVFP4_BLOCK)
    per_block = blocks.abs().amax(dim=-1).float() / (E2M1_MAX * tensor_scale)
    per_block[per_block == 0] = 1.0
    block_scales = per_block.clamp(min=2**-9, max=E4M3_MAX).to(torch.float8_e4m3fn)
    scaled = (blocks / (block_scales.float() * tensor_scale).unsqueeze(-1)).view(n, k)
    magnitude = scaled.abs()
    bounds = torch.tensor(E2M1_BOUNDS, device=rows.device)
    codes = torch.searchsorted(bounds, magnitude, out_int32=True).to(torch.uint8)
    codes += (magnitude[..., None] == bounds[[1, 3, 5]]).any(dim=-1).to(torch.uint8)  # a tie rounds to even
    codes += (scaled < 0).to(torch.uint8) << 3
    return (codes[:, 1::2] << 4) | codes[:, 0::2], block_scales, tensor_scale

# The 16 E2M1 values by code: sign in bit 3, then 2 exponent bits and 1 mantissa bit.
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)


class WeightOnlyLinear(nn.Module):
    """A linear layer whose weight is kept in `quant` and dequantized to the input's dtype per call."""

    def __init__(self, linear: nn.Linear, quant: str):
        super().__init__()
        self.quant = quant
        self.in_features, self.out_features = linear.in_features, linear.out_features
        rows = linear.weight.detach().float().cpu()
        device = linear.weight.device
        if quant == "fp8":
            codes, scales = fp8_weight(rows)
            self.register_buffer("codes", codes.to(device))
            self.register_buffer("scales", scales[:, None].to(device))
        elif quant == "int4":
            codes, scales = int4_weight(rows)
            self.register_buffer("codes", codes.to(device))
            self.register_buffer("scales", scales.to(device))
        else:
            codes, block_scales, tensor_scale = nvfp4_weight(rows)
            self.register_buffer("codes", codes.to(device))
            self.register_buffer("block_scales", block_scales.to(device))
            self.register_buffer("tensor_scale", tensor_scale.to(device))
            self.register_buffer("values", torch.tensor(E2M1_VALUES, device=device))
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach(), requires_grad=False)

    def dequantized(self) -> torch.Tensor:
        """The weight [out, in] in float32, as DequantizeLinear computes it."""
        if self.quant == "fp8":
            return self.codes.float() * self.scales
        if self.quant == "int4":
            return self.codes.float() * self.scales.repeat_interleave(INT4_BLOCK, dim=1)[:, : self.in_features]
        nibbles = torch.stack([self.codes & 0xF, self.codes >> 4], dim=-1).flatten(1).long()  # [N, K]
        blocks = self.values[nibbles].view(self.out_features, -1, NVFP4_BLOCK)
        scales = self.block_scales.float() * self.tensor_scale  # [N, K / 16]
        return (blocks * scales[..., None]).view(self.out_features, self.in_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.dequantized().to(x.dtype), self.bias)


def _quantizable(linear: nn.Linear, quant: str) -> bool:
    return quant != "nvfp4" or linear.in_features % NVFP4_BLOCK == 0


def quantize_target(model: nn.Module, quant: str) -> int:
    """Replace the linear layers of an HF causal LM (decoder and LM head) with WeightOnlyLinear in
    place -> how many. The input embeddings stay in float (a tied head gets its own quantized copy)."""
    replaced = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, nn.Linear) and _quantizable(child, quant):
                setattr(parent, name, WeightOnlyLinear(child, quant))
                replaced += 1
    return replaced

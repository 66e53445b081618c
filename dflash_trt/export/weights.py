"""A graph's weights written one tensor at a time, so export holds no second copy of them.

Traced as module parameters, weights are constants to the exporter: it serialises them, and its
shape inference evaluates the transposes and reshapes applied to them (measured: peak memory 4x the
weights for a 2 GB target). `WeightsAsInputs` hands the exporter the same tensors as graph inputs
instead, named by their state-dict keys: the trace still runs the module's own forward on them, and
nothing copies them. `attach_weights` then turns those inputs into initializers, streaming each
tensor's bytes into `<graph>.onnx.data`. Transposes and reshapes of weights stay in the graph, as
nodes over initializers: onnxruntime folds them when a session loads the graph, TensorRT when it
builds an engine.
"""

from __future__ import annotations

from pathlib import Path

import onnx
import torch
from torch import nn

ONNX_TYPES = {torch.float32: onnx.TensorProto.FLOAT, torch.float16: onnx.TensorProto.FLOAT16,
              torch.bfloat16: onnx.TensorProto.BFLOAT16, torch.int64: onnx.TensorProto.INT64,
              torch.int32: onnx.TensorProto.INT32, torch.bool: onnx.TensorProto.BOOL,
              torch.uint8: onnx.TensorProto.UINT8, torch.int8: onnx.TensorProto.INT8}
ALIGNMENT = 64  # bytes: each tensor in the data file starts on this boundary (mmap-friendly)


def module_weights(module: nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter and persistent buffer, each tensor once (a tied weight under its first name)."""
    seen, weights = set(), {}
    for name, tensor in module.state_dict(keep_vars=True).items():
        if id(tensor) not in seen:
            seen.add(id(tensor))
            weights[name] = tensor
    return weights


class WeightsAsInputs(nn.Module):
    """Traces `module` with its weights as trailing inputs: forward(*inputs, *weights) runs
    module(*inputs), whose parameters are the very tensors passed as weights (the module is held
    outside this one's own state, so the exporter sees no parameter at all)."""

    def __init__(self, module: nn.Module, inputs: int):
        super().__init__()
        self.held, self.inputs = [module], inputs

    def forward(self, *args: torch.Tensor):
        return self.held[0](*args[: self.inputs])


def attach_weights(model: onnx.ModelProto, weights: dict[str, torch.Tensor], data: Path, threshold: int) -> None:
    """Graph inputs named after `weights`' keys -> initializers: tensors of at least `threshold`
    bytes written to the file `data` (beside the graph; referenced by its name), smaller ones
    inline. The model is changed in place; nothing is written when no tensor is that large."""
    named = weights
    weights = [value.name for value in model.graph.input if value.name in named]
    offset = 0
    with open(data, "wb") as out:
        for name in weights:
            tensor = named[name].detach()
            if tensor.dtype not in ONNX_TYPES:
                raise TypeError(f"{name}: no ONNX type for {tensor.dtype}")
            raw = tensor.contiguous().cpu().reshape(-1).view(torch.uint8).numpy()
            proto = onnx.TensorProto(name=name, dims=list(tensor.shape), data_type=ONNX_TYPES[tensor.dtype])
            if raw.nbytes < threshold:
                proto.raw_data = raw.tobytes()
            else:
                padding = -offset % ALIGNMENT
                out.write(b"\0" * padding)
                offset += padding
                out.write(memoryview(raw))
                proto.data_location = onnx.TensorProto.EXTERNAL
                for key, value in (("location", data.name), ("offset", str(offset)), ("length", str(raw.nbytes))):
                    proto.external_data.add(key=key, value=value)
                offset += raw.nbytes
            model.graph.initializer.append(proto)
    if offset == 0:
        data.unlink()
    kept = [value for value in model.graph.input if value.name not in named]
    del model.graph.input[:]
    model.graph.input.extend(kept)

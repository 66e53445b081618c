"""A graph's weights written one tensor at a time, so export holds no second copy of them.

Traced as module parameters, weights are constants to the exporter: it serialises them, and its
shape inference evaluates the transposes and reshapes applied to them (measured: peak memory 4x the
weights for a 2 GB target). `WeightsAsInputs` hands the exporter the same tensors as graph inputs
instead, named by their state-dict keys: the trace still runs the module's own forward on them, and
nothing copies them. `attach_weights` then turns those inputs into initializers, streaming each
tensor's bytes into `<graph>.onnx.data`, with the transposes and reshapes the trace applied to them
folded in one tensor at a time (the graph reads as a constant-folding exporter's would).
"""

from __future__ import annotations

from collections.abc import Callable
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


def _attribute(node: onnx.NodeProto, name: str, default):
    found = [a for a in node.attribute if a.name == name]
    return onnx.helper.get_attribute_value(found[0]) if found else default


def _transposed(source: Callable[[], torch.Tensor], perm: list[int] | None) -> Callable[[], torch.Tensor]:
    def tensor() -> torch.Tensor:
        t = source()
        return t.permute(perm or list(range(t.dim() - 1, -1, -1)))  # ONNX's default: reverse the axes
    return tensor


def _reshaped(source: Callable[[], torch.Tensor], shape: list[int]) -> Callable[[], torch.Tensor]:
    def tensor() -> torch.Tensor:
        t = source()
        return t.reshape([t.shape[i] if d == 0 else d for i, d in enumerate(shape)])  # ONNX's 0: keep that axis
    return tensor


def _fold_layouts(model: onnx.ModelProto, sources: dict[str, Callable[[], torch.Tensor]]) -> None:
    """Transpose and Reshape nodes over weights (what the trace leaves where the exporter would have
    constant-folded) become weights themselves: `sources` gains a lazy tensor per folded output, the
    nodes go. Lazy, so each is materialised only when written, one at a time."""
    constants = {n.output[0]: onnx.numpy_helper.to_array(_attribute(n, "value", None))
                 for n in model.graph.node if n.op_type == "Constant" and _attribute(n, "value", None) is not None}
    folded = []
    for node in model.graph.node:  # in topological order: a chain folds front to back
        source = sources.get(node.input[0]) if node.input else None
        if source is None:
            continue
        if node.op_type == "Transpose":
            sources[node.output[0]] = _transposed(source, _attribute(node, "perm", None))
        elif node.op_type == "Reshape" and node.input[1] in constants and not _attribute(node, "allowzero", 0):
            sources[node.output[0]] = _reshaped(source, [int(d) for d in constants[node.input[1]]])
        else:
            continue
        folded.append(node)
    for node in folded:
        model.graph.node.remove(node)


def attach_weights(model: onnx.ModelProto, weights: dict[str, torch.Tensor], data: Path, threshold: int) -> None:
    """Graph inputs named after `weights`' keys -> initializers: tensors of at least `threshold`
    bytes written to the file `data` (beside the graph; referenced by its name), smaller ones
    inline. Layout ops over weights are folded into them first (_fold_layouts), so the graph reads
    as a constant-folding exporter's would. The model is changed in place; no data file is left
    when no tensor is that large."""
    sources = {value.name: weights[value.name].detach for value in model.graph.input if value.name in weights}
    _fold_layouts(model, sources)
    read = {name for node in model.graph.node for name in node.input} | {o.name for o in model.graph.output}
    offset = 0
    with open(data, "wb") as out:
        for name, source in sources.items():
            if name not in read:
                continue  # only ever read through a folded layout op
            tensor = source().contiguous().cpu()
            if tensor.dtype not in ONNX_TYPES:
                raise TypeError(f"{name}: no ONNX type for {tensor.dtype}")
            raw = tensor.reshape(-1).view(torch.uint8).numpy()
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
            del tensor, raw  # one weight's copy at a time
    if offset == 0:
        data.unlink()
    kept = [value for value in model.graph.input if value.name not in weights]
    del model.graph.input[:]
    model.graph.input.extend(kept)

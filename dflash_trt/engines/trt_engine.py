"""TensorRT and TensorRT-RTX engine builds: one ONNX graph -> one serialized engine with its profiles.

The two libraries share the builder API (module `tensorrt` or `tensorrt_rtx`). Networks are
strongly typed: each tensor keeps the dtype the exported graph gives it, so `--dtype` is decided
at export (TensorRT-RTX accepts nothing else). TensorRT-RTX builds ahead of time for the compute
capabilities named, without a GPU; full TensorRT builds for the GPU it runs on and is the only one
that takes our plugin library (TensorRT-RTX's ONNX parser aborts on custom-domain nodes).
"""

from __future__ import annotations

import time
from pathlib import Path

from dflash_trt.engines.machine import library_module
from dflash_trt.engines.profiles import input_ranges
from dflash_trt.errors import DFlashError


class _Collect:
    """Keeps the builder's log: errors become the one-line failure, the rest is dropped (the int64
    binding warnings repeat for every graph and say nothing a user can act on)."""

    def __init__(self, trt):
        outer = self

        class Logger(trt.ILogger):
            def __init__(self):
                trt.ILogger.__init__(self)

            def log(self, severity, msg):
                if severity <= trt.ILogger.Severity.ERROR:
                    outer.errors.append(msg)

        self.errors: list[str] = []
        self.logger = Logger()


def _allow_decomposed_attention(trt, network) -> int:
    """Mark every attention the parser made (ONNX `Attention`: the slots-trt target) decomposable, so
    TensorRT may build it from plain layers where it has no fused kernel for the shapes and dtype (on
    TensorRT-RTX 1.7, float32: "Attention operation was not supported by a dedicated kernel"); where
    one exists it is still used. Returns how many were marked."""
    kind = getattr(getattr(trt, "LayerType", None), "ATTENTION_INPUT", None)
    if kind is None or not hasattr(trt, "IAttentionInputLayer"):  # a TensorRT without IAttention
        return 0
    marked = 0
    for index in range(network.num_layers):
        layer = network.get_layer(index)
        if layer.type == kind:
            layer.__class__ = trt.IAttentionInputLayer  # TensorRT's Python idiom for a layer's own API
            layer.attention.decomposable = True
            marked += 1
    return marked


def build_trt_graph(kind: str, source: Path, out: Path, spec: dict, profiles: dict[str, dict],
                    compute_capabilities: tuple[str, ...], plugin_library: Path | None = None) -> dict:
    """Build `source` into `out` with one optimization profile per phase; returns what was built."""
    trt = library_module(kind)
    log = _Collect(trt)
    builder = trt.Builder(log.logger)
    if plugin_library is not None:
        builder.get_plugin_registry().load_library(str(plugin_library))
    network = builder.create_network(1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED))
    parser = trt.OnnxParser(network, log.logger)
    if not parser.parse_from_file(str(source)):
        errors = [parser.get_error(i).desc() for i in range(parser.num_errors)] or log.errors
        raise DFlashError(f"{source.name}: {kind} could not parse it: {errors[0] if errors else 'unknown error'}")
    _allow_decomposed_attention(trt, network)
    tensors = [network.get_input(i) for i in range(network.num_inputs)] + \
        [network.get_output(i) for i in range(network.num_outputs)]
    io = {t.name: t.dtype.name for t in tensors}  # as TensorRT typed them: the graph's own dtypes
    config = builder.create_builder_config()
    if kind == "tensorrt-rtx":
        config.num_compute_capabilities = len(compute_capabilities)
        for index, cc in enumerate(compute_capabilities):
            config.set_compute_capability(getattr(trt.ComputeCapability, "SM" + cc.replace(".", "")), index)
    shape_inputs = {network.get_input(i).name for i in range(network.num_inputs) if network.get_input(i).is_shape_tensor}
    for dims in profiles.values():
        profile = builder.create_optimization_profile()
        for name, (low, opt, high) in input_ranges(spec, dims).items():
            if name in shape_inputs:
                profile.set_shape_input(name, low, opt, high)
            else:
                profile.set_shape(name, low, opt, high)
        config.add_optimization_profile(profile)
    start = time.perf_counter()
    # streamed into the file as it is serialised: a whole plan in memory would be one more copy of the
    # weights beside the parsed network's (measured at a flagship's widths: docs/bench/real-width-*.json)
    with out.open("wb") as f:
        built = builder.build_serialized_network_to_stream(network, config, _file_writer(trt, f))
    seconds = time.perf_counter() - start
    if not built:
        # the first error is the cause: a failed compile is followed by errors of the steps it broke
        raise DFlashError(f"{source.name}: {kind} build failed: {log.errors[0] if log.errors else 'no engine returned'}")
    return {"file": out.name, "build_s": round(seconds, 3), "bytes": out.stat().st_size, "io": io}


def _file_writer(trt, f):
    """A TensorRT IStreamWriter appending each chunk it is handed to `f`."""

    class FileWriter(trt.IStreamWriter):
        def __init__(self):
            trt.IStreamWriter.__init__(self)

        def write(self, data) -> int:
            f.write(data)
            return len(data)

    return FileWriter()

"""Check exported graphs with polygraphy: onnxruntime outputs against PyTorch goldens.

For each graph, polygraphy's `OnnxrtRunner` (what `polygraphy run --onnxrt` uses) runs the graph on
seeded random inputs — with the dflash op library loaded for the plugin flavour, which the CLI
cannot do — and `Comparator.compare_accuracy` checks it against the PyTorch module's outputs.
"""

from __future__ import annotations

from pathlib import Path

import torch

from dflash_trt.errors import DFlashError
from dflash_trt.export.op_library import session_options

ATOL = 1e-3
RTOL = 1e-3


def check_graph(graph: Path, module: torch.nn.Module, inputs: tuple[torch.Tensor, ...], input_names: list[str],
                output_names: list[str], plugin: bool = False) -> str:
    """Returns "passed"; raises DFlashError naming the graph when any output is out of tolerance."""
    import onnxruntime as ort
    from polygraphy.backend.onnxrt import OnnxrtRunner
    from polygraphy.comparator import Comparator, IterationResult
    from polygraphy.comparator.compare import SimpleCompareFunc
    from polygraphy.logger import G_LOGGER

    G_LOGGER.module_severity = G_LOGGER.ERROR  # its per-output report would bury our progress bar
    with torch.no_grad():
        outputs = module.eval()(*inputs)
    goldens = IterationResult({n: t.numpy() for n, t in zip(output_names, outputs, strict=True)}, runner_name="pytorch")
    session = ort.InferenceSession(str(graph), session_options(plugin), providers=["CPUExecutionProvider"])
    feed = {n: t.numpy() for n, t in zip(input_names, inputs, strict=True)}
    results = Comparator.run([OnnxrtRunner(session, name="onnxruntime")], data_loader=[feed])
    results.append(("pytorch", [goldens]))
    verdict = Comparator.compare_accuracy(results, compare_func=SimpleCompareFunc(atol=ATOL, rtol=RTOL))
    if not bool(verdict):
        raise DFlashError(f"polygraphy: {graph.name} on onnxruntime differs from PyTorch beyond atol={ATOL}, rtol={RTOL}")
    return "passed"


def inspect_graph(graph: Path, spec: dict) -> dict:
    """polygraphy's `inspect model` view of an exported graph, held against the manifest: every input
    and output must have the declared name, dtype and (symbolic) shape, in order. Returns a summary."""
    from collections import Counter

    import onnx
    from polygraphy.backend.onnx import util as onnx_util

    model = onnx.load(str(graph), load_external_data=False)
    for kind, found in (("inputs", onnx_util.get_input_metadata(model.graph)),
                        ("outputs", onnx_util.get_output_metadata(model.graph))):
        seen = [(name, str(meta.dtype), [d if isinstance(d, str) else int(d) for d in meta.shape])
                for name, meta in found.items()]
        declared = [(io["name"], io["dtype"], list(io["shape"])) for io in spec[kind]]
        if seen != declared:
            first = next((s, d) for s, d in zip(seen + [None] * len(declared), declared + [None] * len(seen))
                         if s != d)
            raise DFlashError(f"polygraphy inspect: {graph.name} {kind} differ from the manifest "
                              f"(graph has {first[0]}, manifest says {first[1]})")
    ops = Counter(f"{n.domain}::{n.op_type}" if n.domain else n.op_type for n in model.graph.node)
    return {"nodes": sum(ops.values()), "custom_ops": sorted(op for op in ops if "::" in op)}

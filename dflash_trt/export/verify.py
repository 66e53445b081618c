"""Check exported graphs with polygraphy: onnxruntime outputs against PyTorch goldens.

For each graph, polygraphy's `OnnxrtRunner` (what `polygraphy run --onnxrt` uses) runs the graph on
seeded random inputs — with the dflash op library loaded for the plugin flavour, which the CLI
cannot do — and `Comparator.compare_accuracy` checks it against the PyTorch module's outputs.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from dflash_trt.errors import DFlashError
from dflash_trt.export.op_library import session_options

if TYPE_CHECKING:
    import onnx

# How close onnxruntime must come to PyTorch, by bundle dtype: an element passes within `rtol` of
# its own value, or within `atol` plus `atol_rms` x the RMS of its output.
# float32: reduction-order round-off; measured at most 1e-4 on SmolLM2-135M.
# float16: rounding error follows the magnitudes summed into an element, not the element (a logit
# near 0 is a sum of terms of the RMS's size), so the absolute part follows the output's RMS. On
# SmolLM2-135M onnxruntime (which computes float16 ops lacking a CPU kernel in float32) differed from
# PyTorch by up to 0.016 x RMS (target features) and 0.009 x RMS (draft logits) beyond 1% of the value.
# No bfloat16 entry: onnxruntime cannot run those graphs (op_library.onnxruntime_refusal).
TOLERANCES = {"float32": {"atol": 1e-3, "rtol": 1e-3}, "float16": {"atol_rms": 5e-2, "rtol": 1e-2}}


def _atol(golden: np.ndarray, tolerance: dict) -> float:
    if golden.dtype.kind != "f" and "atol_rms" in tolerance:
        # token ids, the argmax of logits compared beside them: in half precision a near tie may
        # flip between two correct implementations
        return math.inf
    rms = float(np.sqrt(np.mean(np.square(golden, dtype=np.float64))))
    return tolerance.get("atol", 0.0) + tolerance.get("atol_rms", 0.0) * rms


def check_graph(graph: Path, module: torch.nn.Module, inputs: tuple[torch.Tensor, ...], input_names: list[str],
                output_names: list[str], tolerance: dict, plugin: bool = False,
                aliases: dict[str, str] | None = None) -> str:
    """Returns "passed"; raises DFlashError naming the graph when any output is out of `tolerance`
    (a TOLERANCES entry). `aliases` (output -> input) runs the graph as contract 2's runtime does,
    each such output bound to its input's buffer: onnxruntime's GroupQueryAttention writes only the
    new rows there, and leaves a separate output's rows past the lengths unspecified."""
    import onnx
    import onnxruntime as ort
    from polygraphy.backend.onnxrt import OnnxrtRunner
    from polygraphy.comparator import Comparator, IterationResult
    from polygraphy.comparator.compare import SimpleCompareFunc
    from polygraphy.logger import G_LOGGER

    G_LOGGER.module_severity = G_LOGGER.ERROR  # its per-output report would bury our progress bar
    # a draft block pass that exports its logits is compared on them as it stands
    block_pass = hasattr(module, "keep_logits") and not module.export_logits
    with torch.no_grad(), _logits_kept(module):
        outputs = module.eval()(*inputs)
    if isinstance(outputs, torch.Tensor):
        outputs = (outputs,)
    source = str(graph)
    if block_pass:  # compare the logits the graph's ArgMax picks from, not only its ids
        model, logits = with_block_logits(onnx.load(str(graph)))
        source, output_names = model.SerializeToString(), [*output_names, logits]
    goldens = IterationResult({n: t.numpy() for n, t in zip(output_names, outputs, strict=True)}, runner_name="pytorch")
    compare = SimpleCompareFunc(atol={n: _atol(g, tolerance) for n, g in goldens.items()}, rtol=tolerance["rtol"])
    session = ort.InferenceSession(source, session_options(plugin), providers=["CPUExecutionProvider"])
    feed = {n: t.numpy() for n, t in zip(input_names, inputs, strict=True)}
    if aliases:
        from polygraphy.comparator import RunResults

        results = RunResults()
        results.append(("onnxruntime", [IterationResult(_run_in_place(session, feed, aliases), runner_name="onnxruntime")]))
    else:
        results = Comparator.run([OnnxrtRunner(session, name="onnxruntime")], data_loader=[feed])
    results.append(("pytorch", [goldens]))
    # Relative differences divide by the goldens: a draft token id 0 makes 0/0, which polygraphy
    # already passes on the absolute difference; numpy's warning about it is noise in the export.
    with np.errstate(invalid="ignore"):
        verdict = Comparator.compare_accuracy(results, compare_func=compare)
    if not bool(verdict):
        beyond = ", ".join(f"{k}={v}" for k, v in tolerance.items())
        raise DFlashError(f"polygraphy: {graph.name} on onnxruntime differs from PyTorch beyond {beyond}")
    return "passed"


@contextmanager
def _logits_kept(module: torch.nn.Module) -> Iterator[None]:
    """A draft block module returns (tokens, logits) inside, tokens only outside (as exported)."""
    if not hasattr(module, "keep_logits"):
        yield
        return
    module.keep_logits = True
    try:
        yield
    finally:
        module.keep_logits = False


def with_block_logits(model: onnx.ModelProto) -> tuple[onnx.ModelProto, str]:
    """The draft block graph returns token ids only; this adds the logits its head picks from (the
    input of its one ArgMax, or for a DFlash2 drafter of the selector's one TopK) as a second output
    (in place) -> (model, that output's name). For checks of its numerics."""
    import onnx

    picks = [n for n in model.graph.node if n.op_type == "TopK"] or [n for n in model.graph.node if n.op_type == "ArgMax"]
    (pick,) = picks
    dtype = next(i.type.tensor_type.elem_type for i in model.graph.input if i.name.startswith("context_key"))
    model.graph.output.append(onnx.helper.make_tensor_value_info(pick.input[0], dtype, None))
    return model, pick.input[0]


def _run_in_place(session, feed: dict[str, np.ndarray], aliases: dict[str, str]) -> dict[str, np.ndarray]:
    """One run with each aliased output bound to its input's buffer (IOBinding) -> every output."""
    import onnxruntime as ort

    binding = session.io_binding()
    # copies of the aliased inputs, so the caller's feed stays as given
    shared = {name: ort.OrtValue.ortvalue_from_numpy(np.array(feed[name])) for name in aliases.values()}
    for name, value in feed.items():
        if name in shared:
            binding.bind_ortvalue_input(name, shared[name])
        else:
            binding.bind_cpu_input(name, value)
    names = [o.name for o in session.get_outputs()]
    for name in names:
        if name in aliases:
            binding.bind_ortvalue_output(name, shared[aliases[name]])
        else:
            binding.bind_output(name)
    session.run_with_iobinding(binding)
    return dict(zip(names, binding.copy_outputs_to_cpu(), strict=True))


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

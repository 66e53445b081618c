"""The CPU engine: each graph optimized once by ONNX Runtime and saved with the options to load it.

ORT's EXTENDED level fuses what a CPU run benefits from (RMSNorm -> SimplifiedLayerNormalization,
MatMul+scale -> FusedMatMul, SiLU gates) and stays portable across CPUs; the ALL level adds layout
transforms tied to the machine that ran them, which a bundle copied elsewhere could not use. The
saved graph loads with optimizations off: they are already applied, and a session starts faster.
"""

from __future__ import annotations

import time
from pathlib import Path

OPTIMIZATION = "ORT_ENABLE_EXTENDED"
SESSION_OPTIONS = {"graph_optimization_level": OPTIMIZATION, "load_with": "ORT_DISABLE_ALL"}


def build_ort_graph(source: Path, out: Path, plugin: bool) -> dict:
    """Optimize `source` (.onnx with external data) into `out` (+ `out`.data); returns what was built."""
    import onnxruntime as ort

    from dflash_trt.export.op_library import session_options

    options = session_options(plugin)
    options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, OPTIMIZATION)
    options.optimized_model_filepath = str(out)
    options.add_session_config_entry("session.optimized_model_external_initializers_file_name", out.name + ".data")
    options.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes", "1024")
    start = time.perf_counter()
    ort.InferenceSession(str(source), options, providers=["CPUExecutionProvider"])
    return {"file": out.name, "build_s": round(time.perf_counter() - start, 3),
            "bytes": out.stat().st_size + (out.parent / (out.name + ".data")).stat().st_size}

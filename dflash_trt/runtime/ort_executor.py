"""The C++ onnxruntime executor (csrc/ort_executor.h) over a `slots` bundle (graph contract 2).

`SlotBundle(bundle)` reads and checks bundle.json once, finds the onnxruntime shared library
that the onnxruntime wheel ships (the core loads it at run time), and returns a `_core.OrtExecutor`
to hand to `_core.Scheduler`. Every phase then runs in C++: no Python per step.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from dflash_trt.errors import DFlashError
from dflash_trt.runtime.core_engine import _core
from dflash_trt.runtime.engine_bundles import open_bundle

CONTRACT = 2


def onnxruntime_library() -> Path:
    """libonnxruntime.so.<version> inside the installed onnxruntime wheel (found without importing it)."""
    spec = importlib.util.find_spec("onnxruntime")
    if spec is None or not spec.submodule_search_locations:
        raise DFlashError("the onnxruntime executor needs onnxruntime: pip install onnxruntime")
    found = sorted(Path(spec.submodule_search_locations[0], "capi").glob("libonnxruntime.so*"))
    if not found:
        raise DFlashError(
            f"no libonnxruntime.so in {spec.submodule_search_locations[0]}/capi: reinstall onnxruntime"
        )
    return found[-1]


def ort_executor(bundle_root: str | Path, max_batch: int, capacity: int, threads: int | None = None):
    """A `_core.OrtExecutor` with `max_batch` KV slots of `capacity` tokens over the bundle's graphs."""
    return SlotBundle(bundle_root).executor(max_batch, capacity, threads)


def executor_config(bundle_root: str | Path, max_batch: int, capacity: int, threads: int | None = None):
    """The `_core.OrtExecutorConfig` of a slots bundle (one line for a bundle it cannot run)."""
    return SlotBundle(bundle_root).config(max_batch, capacity, threads)


class SlotBundle:
    """A slots bundle as `LLM` holds it: its manifest, read and checked once (every refusal here, before
    any request); each engine makes its executor, which allocates the KV slots, from that manifest."""

    batched_only = True

    def __init__(self, root: str | Path):
        if not _core().HAS_ORT_EXECUTOR:
            raise DFlashError(
                "dflash_trt._core was built without the onnxruntime executor (no onnxruntime headers): "
                "run bash scripts/fetch_headers.sh ort, then reinstall (bash scripts/setup.sh)"
            )
        self.root = Path(root)
        # an exported slots bundle, or an onnxruntime engine bundle built from one
        kind, self.manifest = open_bundle(self.root)
        if kind not in ("onnx", "onnxruntime"):
            raise DFlashError(f"{self.root} holds {kind} engines; the onnxruntime executor runs ONNX graphs")
        contract = self.manifest.get("contract", 1)
        if contract != CONTRACT:
            raise DFlashError(
                f"{self.root}: a graph contract {contract} bundle; the C++ onnxruntime executor needs "
                f"contract {CONTRACT}: re-export with --flavour slots"
            )
        self.library = onnxruntime_library()

    def config(self, max_batch: int, capacity: int, threads: int | None = None):
        """The `_core.OrtExecutorConfig` for `max_batch` slots of `capacity` tokens."""
        manifest = self.manifest
        graphs, target, draft = manifest["graphs"], manifest["target"], manifest["draft"]
        config = _core().OrtExecutorConfig()
        config.target_path, config.draft_context_path, config.draft_block_path = (
            str(self.root / graphs[name]["file"]) for name in ("target", "draft_context", "draft_block")
        )
        config.library_path = str(self.library)
        config.dtype = manifest["dtype"]
        config.threads = threads or 0
        config.max_batch, config.capacity = max_batch, capacity
        config.target_layers = target["num_layers"]
        # hybrid targets: Gated DeltaNet layers keep conv / recurrent states, the others a K/V cache
        types = target.get("layer_types") or ["full_attention"] * target["num_layers"]
        config.attention_layers = [i for i, t in enumerate(types) if t != "linear_attention"]
        config.linear_layers = [i for i, t in enumerate(types) if t == "linear_attention"]
        if config.linear_layers:
            linear = target["linear_attention"]
            config.conv_dim, config.conv_kernel = linear["conv_dim"], linear["conv_kernel"]
            config.linear_value_heads = linear["num_value_heads"]
            config.linear_key_head_dim = linear["key_head_dim"]
            config.linear_value_head_dim = linear["value_head_dim"]
        config.target_kv_heads = target["num_key_value_heads"]
        config.target_head_dim = target["head_dim"]
        outputs = {o["name"]: o for o in graphs["target"]["outputs"]}
        config.feature_width = outputs["features"]["shape"][-1]
        config.vocab = target["vocab_size"]
        config.draft_layers = draft["num_layers"]
        config.draft_kv_heads = draft["num_key_value_heads"]
        config.draft_head_dim = draft["head_dim"]
        config.mask_token_id = draft["mask_token_id"]
        return config

    def executor(self, max_batch: int, capacity: int, threads: int | None = None):
        return _core().OrtExecutor(self.config(max_batch, capacity, threads))

"""The onnxruntime backend: per-request sessions over an exported bundle (no model code imported).

Caches live on the host as numpy arrays and grow by concatenation, exactly as the graphs expect
(present = past ++ new); rolling back is slicing to the committed length.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch

from dflash_trt.errors import DFlashError
from dflash_trt.export.manifest import GRAPHS
from dflash_trt.export.op_library import check_library_version, onnxruntime_refusal, session_options
from dflash_trt.runtime.concat_cache import ConcatCacheTarget, cache_layout
from dflash_trt.runtime.engine_bundles import open_bundle


def _names(spec: dict, key: str) -> list[str]:
    return [io["name"] for io in spec[key]]


class OrtBundle:
    """The three onnxruntime sessions of one bundle, loaded once and shared by every request: an
    exported bundle as it is, or an onnxruntime engine bundle (graphs `build` optimized already)."""

    def __init__(self, root: str | Path, threads: int | None = None):
        try:
            import onnxruntime as ort
        except ImportError as err:
            raise DFlashError("backend 'onnxruntime' needs onnxruntime: pip install onnxruntime") from err
        self.root = Path(root)
        kind, self.manifest = open_bundle(self.root)
        if kind not in ("onnx", "onnxruntime"):
            raise DFlashError(f"{self.root} holds {kind} engines: run it with backend 'tensorrt'")
        if self.manifest.get("contract", 1) != 1:  # these sessions grow caches by concatenation (contract 1)
            raise DFlashError(f"{self.root}: this bundle uses graph contract {self.manifest['contract']} (slot caches); "
                              f"run it through the batched engine (LLM(..., max_batch) / the core engine), or "
                              f"re-export with --flavour portable for this backend")
        plugin = self.manifest["flavour"] == "plugin"
        self.dtype = self.manifest.get("dtype", "float32")
        refusal = onnxruntime_refusal(self.manifest["flavour"], self.dtype)
        if refusal:
            raise DFlashError(f"{self.root}: onnxruntime cannot run this {self.dtype} {self.manifest['flavour']} bundle "
                              f"({refusal}); build TensorRT engines from it, or re-export with --dtype fp32")
        options = session_options(plugin, threads)
        if kind == "onnxruntime":  # optimized at build time: loading skips the optimizer
            options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        if plugin:
            check_library_version(self.manifest["custom_ops"]["version"], str(self.root))
        self.sessions = {
            name: ort.InferenceSession(str(self.root / self.manifest["graphs"][name]["file"]), options,
                                       providers=["CPUExecutionProvider"])
            for name in GRAPHS
        }
        self.graphs = self.manifest["graphs"]

    def empty_cache(self, who: str) -> tuple[list[np.ndarray], list[str]]:
        """`who`'s ("target" or "draft") caches before a prompt (K/V, and a hybrid's zero states) and their kinds."""
        layout = cache_layout(self.manifest[who], self.dtype)
        return [np.zeros(shape, dtype) for _, shape, dtype in layout], [kind for kind, _, _ in layout]


class OrtTargetSession(ConcatCacheTarget):
    def __init__(self, bundle: OrtBundle):
        super().__init__(*bundle.empty_cache("target"))
        self.session = bundle.sessions["target"]
        self.past_names = _names(bundle.graphs["target"], "inputs")[3:]

    def _step(self, ids: list[int], logits_from: int) -> tuple[torch.Tensor, torch.Tensor, list[np.ndarray]]:
        feed = {"input_ids": np.array([ids], np.int64), "past_lengths": np.array([self.length], np.int64),
                "logits_from": np.array(logits_from, np.int64)}
        feed.update(zip(self.past_names, self.past, strict=True))
        logits, features, *present = self.session.run(None, feed)
        return torch.from_numpy(logits[0]), torch.from_numpy(features[0]), present

    def _keep(self, present: np.ndarray, length: int) -> np.ndarray:
        return np.ascontiguousarray(present[:, :, :length])

    def _own(self, view: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(view)


class OrtDraftSession:
    def __init__(self, bundle: OrtBundle):
        self.inject = bundle.sessions["draft_context"]
        self.block = bundle.sessions["draft_block"]
        self.context_names = _names(bundle.graphs["draft_block"], "inputs")[2:]
        self.mask_token_id = bundle.manifest["draft"]["mask_token_id"]
        self.context, _ = bundle.empty_cache("draft")
        self.length = 0

    def draft(self, features: torch.Tensor, bonus: int, block_size: int) -> list[int]:
        n = features.shape[0]
        positions = np.arange(self.length, self.length + n, dtype=np.int64)[None]
        new = self.inject.run(None, {"features": features.numpy()[None], "positions": positions})
        self.context = [np.concatenate([c, x], axis=2) for c, x in zip(self.context, new, strict=True)]
        self.length += n
        feed = {
            "block_ids": np.array([[bonus] + [self.mask_token_id] * (block_size - 1)], np.int64),
            "context_lengths": np.array([self.length], np.int64),
        }
        feed.update(zip(self.context_names, self.context, strict=True))
        (tokens,) = self.block.run(["draft_tokens"], feed)
        return tokens[0].tolist()


@contextmanager
def _one_torch_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def lean_steps(steps: Iterator) -> Iterator:
    """Advance decode steps with torch on one thread. The loop's own torch work between Runs
    (argmax or sampling over [B, vocab] logits) is small, and torch's OpenMP workers spin after it,
    taking cores from onnxruntime's next Run (measured: 14.6 -> 10.0 ms per B=16 draft, 2 cores).
    Only the step itself is scoped: the caller's code between steps keeps its thread count."""
    while True:
        with _one_torch_thread():
            step = next(steps, None)
        if step is None:
            return
        yield step

"""Runs a graph-contract-1 bundle (portable / plugin flavour) with onnxruntime, one request at a time:
what the export tests use to check the graphs those flavours write for engine builds. The product
runs contract 2 (slot caches) only, on the C++ executors.

Caches live on the host as numpy arrays and grow by concatenation, as the graphs expect
(present = past ++ new); rolling back is slicing to the committed length. Hybrid targets also carry
each linear-attention layer's conv and recurrent state: the graph returns them for every position
from `logits_from` on (export/hybrid_graphs.py), and commit picks the ones after the last kept
token, so a rollback after a partial acceptance is exact without re-feeding tokens.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch

from dflash_trt import SamplingParams
from dflash_trt.export.manifest import GRAPHS
from dflash_trt.export.op_library import check_library_version, session_options
from dflash_trt.runtime.engine_bundles import open_bundle
from dflash_trt.spec.loop import autoregressive_decode, speculative_decode
from dflash_trt.spec.sampling import Sampler
from dflash_trt.spec.stopping import StopChecker


def _names(spec: dict, key: str) -> list[str]:
    return [io["name"] for io in spec[key]]


def cache_layout(info: dict, dtype: str) -> list[tuple[str, tuple[int, ...], str]]:
    """bundle.json's `target` or `draft` entry -> (kind, empty shape for one row, dtype) per cache
    input of its graph, in order: "kv" per full-attention layer's K and V, then "conv" and
    "recurrent" per linear-attention layer of a hybrid target (the recurrent state is float32
    whatever the bundle's dtype)."""
    linear = info.get("linear_attention")
    types = info.get("layer_types") or ["full_attention"] * info["num_layers"]
    kv = ("kv", (1, info["num_key_value_heads"], 0, info["head_dim"]), dtype)
    layout = [kv, kv] * types.count("full_attention")
    if linear:
        conv = ("conv", (1, linear["conv_dim"], linear["conv_kernel"] - 1), dtype)
        state = (1, linear["num_value_heads"], linear["key_head_dim"], linear["value_head_dim"])
        layout += [conv, ("recurrent", state, "float32")] * types.count("linear_attention")
    return layout


class OrtBundle:
    """The three onnxruntime sessions of one contract-1 bundle (exported, or onnxruntime engines)."""

    def __init__(self, root: str | Path):
        self.root = Path(root)
        kind, self.manifest = open_bundle(self.root)
        assert kind in ("onnx", "onnxruntime") and self.manifest.get("contract", 1) == 1, (kind, self.manifest)
        plugin = self.manifest["flavour"] == "plugin"
        self.dtype = self.manifest.get("dtype", "float32")
        options = session_options(plugin, None)
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


class OrtTargetSession:
    def __init__(self, bundle: OrtBundle):
        self.past, self.kinds = bundle.empty_cache("target")
        self.session = bundle.sessions["target"]
        self.past_names = _names(bundle.graphs["target"], "inputs")[3:]
        self.length = 0  # committed tokens
        self.pending: list[np.ndarray] | None = None  # the last forward's present caches, until commit
        self.pending_from = 0  # the last forward's logits_from: where its per-position states start

    def _run(self, ids: list[int], last_only: bool = False):
        assert self.pending is None, "commit() the previous forward first"
        self.pending_from = len(ids) - 1 if last_only else 0
        feed = {"input_ids": np.array([ids], np.int64), "past_lengths": np.array([self.length], np.int64),
                "logits_from": np.array(self.pending_from, np.int64)}
        feed.update(zip(self.past_names, self.past, strict=True))
        logits, features, *self.pending = self.session.run(None, feed)
        return torch.from_numpy(logits[0]), torch.from_numpy(features[0])

    def prefill(self, prompt: list[int]):
        logits, features = self._run(prompt, last_only=True)
        self.commit(len(prompt))
        return logits[-1], features

    def forward(self, ids: list[int]):
        return self._run(ids)

    def commit(self, keep: int) -> None:
        present, self.pending = self.pending, None
        self.length += keep
        kept = keep - self.pending_from  # positions kept from logits_from on: they index the states
        self.past = [self._cut(kind, new, old, kept)
                     for kind, new, old in zip(self.kinds, present, self.past, strict=True)]

    def _cut(self, kind: str, new: np.ndarray, old: np.ndarray, kept: int) -> np.ndarray:
        if kind == "kv":  # rollback: drop what was not kept
            return np.ascontiguousarray(new[:, :, :self.length])
        assert kept >= 0, "a prefill keeps all its tokens"
        if kind == "conv":  # the conv window's K-1 columns that end at the last kept token
            return np.ascontiguousarray(new[:, :, kept: kept + old.shape[2]])
        return old if kept == 0 else np.ascontiguousarray(new[:, kept - 1])  # "recurrent": the state after it


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


def generate(bundle: str | Path | OrtBundle, prompt: list[int], params: SamplingParams | None = None,
             block_size: int | None = None, eos_token_ids=()) -> tuple[list[int], list[int]]:
    """The reference loop over a contract-1 bundle -> (token ids, acceptance length per verify step);
    `block_size` None decodes plainly."""
    bundle = bundle if isinstance(bundle, OrtBundle) else OrtBundle(bundle)
    params = params or SamplingParams()
    sampler = Sampler(params)
    target = OrtTargetSession(bundle)
    if block_size is None:
        steps = autoregressive_decode(target, prompt, sampler)
    else:
        steps = speculative_decode(target, OrtDraftSession(bundle), prompt, block_size, sampler)
    stop = StopChecker(params, tuple(eos_token_ids), None)
    taus = []
    for step in steps:
        if step.accepted is not None:
            taus.append(step.accepted + 1)
        if stop.add(step.tokens):
            break
    return list(stop.token_ids), taus

"""The C++ slot executors (csrc/slot_executor.h) over a graph-contract-2 bundle: onnxruntime over a
`slots` (or `slots-trt`) export or an onnxruntime engine bundle built from one, TensorRT over
engines built from a `slots-trt` export.

`SlotBundle(bundle)` reads and checks the manifest once, finds the shared library the executor
loads at run time (onnxruntime's from its wheel, libnvinfer for TensorRT), and makes a
`_core.OrtExecutor` or `_core.TrtExecutor` to hand to `_core.Scheduler`. Every phase then runs in
C++: no Python per step.
"""

from __future__ import annotations

import ctypes.util
import importlib.util
import json
from pathlib import Path

from dflash_trt.errors import DFlashError
from dflash_trt.export.manifest import bundle_quants
from dflash_trt.runtime.native import native_core
from dflash_trt.runtime.engine_bundles import open_bundle

CONTRACT = 2
# How an executor drafts for rows sampling at T>0 (LLM(draft_rule=...)): "point-mass" takes the drafter's
# argmax and keeps it by sample-then-compare (a seeded reply equals the plain sampled one); "drafter"
# draws drafts from the drafter's own distribution q (a DFlash2 drafter's: its selector's, walked from
# the anchor) and keeps them with min(1, p/q) (csrc/acceptance.h). Greedy requests draft the argmax (the
# selector's greedy path) either way.
DRAFT_RULES = ("point-mass", "drafter")


def draft_rule_refusal(rule: str, manifest: dict | None) -> str | None:
    """Why `rule` cannot run on the graphs `manifest` describes (bundle.json's sections; None: graphs built
    with what the rule draws from, the torch backend's), or None."""
    if rule not in DRAFT_RULES:
        return f"draft_rule must be one of {', '.join(DRAFT_RULES)}, got {rule!r}"
    if rule == "point-mass" or manifest is None:
        return None
    draft = manifest.get("draft")
    if draft is None:
        return "draft_rule 'drafter' needs a drafter"
    need = "selector_scores" if draft.get("method") == "dflash2" else "draft_logits"
    if not any(o["name"] == need for o in manifest["graphs"]["draft_block"]["outputs"]):
        return (f"draft_rule 'drafter' needs the draft block graph's {need}, which this bundle's does not return "
                f"(slots-trt exports it only with --draft-distribution; contract-1 flavours and bundles exported "
                f"before graphs revision 7 never): re-export with --draft-distribution, or use draft_rule 'point-mass'")
    return None


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


def tensorrt_library(major: str) -> str:
    """libnvinfer.so.<major>: from the tensorrt-cu*-libs wheel, else wherever the loader finds it."""
    spec = importlib.util.find_spec("tensorrt_libs")
    if spec is not None and spec.submodule_search_locations:
        found = sorted(Path(spec.submodule_search_locations[0]).glob(f"libnvinfer.so.{major}*"))
        if found:
            return str(found[0])
    name = ctypes.util.find_library("nvinfer")
    if name and name.startswith(f"libnvinfer.so.{major}"):
        return name
    raise DFlashError(f"the C++ TensorRT executor needs libnvinfer.so.{major} (TensorRT {major}.x), which is not "
                      f"installed here")


def ort_executor(bundle_root: str | Path, max_batch: int, capacity: int, threads: int | None = None):
    """The C++ executor with `max_batch` KV slots of `capacity` tokens over the bundle's graphs."""
    return SlotBundle(bundle_root).executor(max_batch, capacity, threads)


def executor_config(bundle_root: str | Path, max_batch: int, capacity: int, threads: int | None = None):
    """The `_core.ExecutorConfig` of a contract-2 bundle (one line for a bundle it cannot run)."""
    return SlotBundle(bundle_root).config(max_batch, capacity, threads)


def slot_config(manifest: dict, paths: dict[str, str], library: str, max_batch: int, capacity: int,
                threads: int | None = None, driver: str = "libcuda.so.1", draft_rule: str = "point-mass",
                draft_vocab: list[int] | None = None):
    """The `_core.ExecutorConfig` of contract-2 graphs from their manifest (bundle.json's "dtype",
    "graphs", "target" and "draft"; no "draft": a target for plain decoding) and where each graph is;
    `draft_rule` one of DRAFT_RULES, `draft_vocab` the draft_logits columns' target ids (None: the
    target's own ids)."""
    graphs, target, draft = manifest["graphs"], manifest["target"], manifest.get("draft")
    config = native_core().ExecutorConfig()
    config.target_path = paths["target"]
    config.library_path, config.driver_path = library, driver
    config.dtype = manifest["dtype"]
    config.threads = threads or 0
    config.max_batch, config.capacity = max_batch, capacity
    # a bundle with quantized activations (export/quantize.py): every step feeds two query rows, so a
    # verify equals decoding one token at a time bit for bit
    config.min_query_tokens = manifest.get("min_query_tokens", 1)
    config.target_layers = target["num_layers"]
    # hybrid targets: Gated DeltaNet layers keep conv / recurrent states, the others a K/V cache
    types = target.get("layer_types") or ["full_attention"] * target["num_layers"]
    config.attention_layers = [i for i, t in enumerate(types) if t != "linear_attention"]
    config.linear_layers = [i for i, t in enumerate(types) if t == "linear_attention"]
    if config.linear_layers:
        linear = target["linear_attention"]
        produced = {o["name"] for o in graphs["target"]["outputs"]}
        if f"delta_inputs_{config.linear_layers[0]}" not in produced or "num_key_heads" not in linear:
            raise DFlashError("this hybrid slot bundle has no delta_inputs outputs (exported before graphs revision 6, "
                              "it returns a state per verified position): re-export it with dflash-trt export")
        config.conv_dim, config.conv_kernel = linear["conv_dim"], linear["conv_kernel"]
        config.linear_key_heads = linear["num_key_heads"]
        config.linear_value_heads = linear["num_value_heads"]
        config.linear_key_head_dim = linear["key_head_dim"]
        config.linear_value_head_dim = linear["value_head_dim"]
    config.target_kv_heads = target["num_key_value_heads"]
    config.target_head_dim = target["head_dim"]
    config.vocab = target["vocab_size"]
    if draft is not None:
        config.draft_context_path, config.draft_block_path = paths["draft_context"], paths["draft_block"]
        outputs = {o["name"]: o for o in graphs["target"]["outputs"]}
        config.feature_width = outputs["features"]["shape"][-1]
        config.draft_layers = draft["num_layers"]
        config.draft_kv_heads = draft["num_key_value_heads"]
        config.draft_head_dim = draft["head_dim"]
        config.mask_token_id = draft["mask_token_id"]
    refusal = draft_rule_refusal(draft_rule, manifest)
    if refusal:
        raise DFlashError(refusal)
    if draft_rule == "drafter":
        config.sample_drafts = True
        config.draft_vocab_size = draft["draft_vocab_size"]
        config.draft_vocab = list(draft_vocab or [])
        outputs = {o["name"]: o for o in graphs["draft_block"]["outputs"]}
        if "selector_scores" in outputs:  # DFlash2: drafts walked through the selector's distribution
            config.selector_top_k = outputs["selector_scores"]["shape"][-1]
    return config


class SlotBundle:
    """A contract-2 bundle as `LLM` holds it: its manifest, read and checked once (every refusal here,
    before any request); each engine makes its executor, which allocates the KV slots, from that
    manifest."""

    cuda_driver = "libcuda.so.1"  # the CUDA driver library the TensorRT executor loads

    def __init__(self, root: str | Path):
        self.root = Path(root)
        # an exported slots bundle, an onnxruntime engine bundle built from one, or TensorRT engines
        self.kind, self.manifest = open_bundle(self.root)
        contract = self.manifest.get("contract", 1)
        if contract != CONTRACT:
            raise DFlashError(
                f"{self.root}: a graph contract {contract} bundle; the C++ executors need contract {CONTRACT}: "
                f"re-export with --flavour slots (onnxruntime) or slots-trt (TensorRT)"
            )
        quants = dict(zip(("target", "drafter"), bundle_quants(self.manifest), strict=True))
        if self.kind in ("onnx", "onnxruntime") and "nvfp4" in quants.values():
            which = " and ".join(k for k, v in quants.items() if v == "nvfp4")
            raise DFlashError(f"{self.root}: its {which} weights are NVFP4, which onnxruntime cannot run (no float4 "
                              f"DequantizeLinear kernel): build TensorRT engines for a Blackwell GPU (dflash-trt build "
                              f"--bundle ... --engine tensorrt-rtx --compute-capability 12.0)")
        if self.kind in ("onnx", "onnxruntime"):
            self._need("HAS_ORT_EXECUTOR", "onnxruntime", "ort")
            self.library = str(onnxruntime_library())
        elif self.kind == "tensorrt":
            self._need("HAS_TRT_EXECUTOR", "TensorRT", "trt")
            self._check_tensorrt_major()
            self.library = tensorrt_library(native_core().TRT_HEADERS_VERSION.split(".")[0])
        else:
            raise DFlashError(f"{self.root} holds {self.kind} engines; the C++ executors run ONNX graphs "
                              f"(onnxruntime) and full TensorRT engines (TensorRT-RTX publishes no C++ headers "
                              f"to build against): build with --engine tensorrt or onnxruntime")
        capacity = self.manifest.get("capacity")  # slots-trt: C is baked into the graphs
        self.capacity = None if capacity is None else int(capacity)
        # TensorRT engines take the rows and prefill tokens their optimization profiles were built for
        self.max_rows = self.max_chunk = None
        if self.kind == "tensorrt":
            self.max_rows = int(self.manifest["max_batch"])
            self.max_chunk = int(self.manifest["profiles"]["target"]["prefill"]["new"][2])

    def _need(self, flag: str, name: str, headers: str) -> None:
        if not getattr(native_core(), flag, False):
            raise DFlashError(
                f"dflash_trt._core was built without the {name} executor (no {name} headers): run bash "
                f"scripts/fetch_headers.sh {headers}, then reinstall (bash scripts/setup.sh)"
            )

    def _check_tensorrt_major(self) -> None:
        built, headers = self.manifest["engine"]["version"], native_core().TRT_HEADERS_VERSION
        if built.split(".")[0] != headers.split(".")[0]:
            raise DFlashError(f"{self.root} holds TensorRT {built} engines; the core's TensorRT executor is built "
                              f"against TensorRT {headers} headers: use TensorRT {headers.split('.')[0]}.x")

    def check_limits(self, max_batch: int, capacity: int) -> None:
        """One line for more rows than the engines take or a capacity other than the graphs' own."""
        if self.max_rows is not None and max_batch > self.max_rows:
            raise DFlashError(f"{self.root}: its engines take at most {self.max_rows} rows per step; run it with "
                              f"max_batch <= {self.max_rows}, or rebuild with --max-batch {max_batch}")
        if self.capacity is not None and capacity != self.capacity:
            raise DFlashError(f"{self.root} was exported with --capacity {self.capacity} (a static cache size in "
                              f"its graphs): run it with capacity {self.capacity}, or re-export")

    def config(self, max_batch: int, capacity: int, threads: int | None = None, draft_rule: str = "point-mass",
               cuda_graphs: bool = True):
        """The `_core.ExecutorConfig` for `max_batch` slots of `capacity` tokens; `cuda_graphs`: the
        TensorRT executor replays decode-sized runs as CUDA graphs (off: LLM's enforce_eager)."""
        self.check_limits(max_batch, capacity)
        paths = {name: str(self.root / graph["file"]) for name, graph in self.manifest["graphs"].items()}
        config = slot_config(self.manifest, paths, self.library, max_batch, capacity, threads, self.cuda_driver,
                             draft_rule, self.draft_vocab() if draft_rule != "point-mass" else None)
        config.cuda_graphs = cuda_graphs
        return config

    def draft_vocab(self) -> list[int] | None:
        """The target ids of the draft_logits columns (the bundle's draft_vocab.json), None: the target's ids."""
        path = self.root / "draft_vocab.json"
        return json.loads(path.read_text())["token_ids"] if path.is_file() else None

    def executor(self, max_batch: int, capacity: int, threads: int | None = None, draft_rule: str = "point-mass",
                 cuda_graphs: bool = True):
        config = self.config(max_batch, capacity, threads, draft_rule, cuda_graphs)
        return (native_core().TrtExecutor if self.kind == "tensorrt" else native_core().OrtExecutor)(config)

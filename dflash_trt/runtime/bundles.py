"""`LLM(..., backend="onnxruntime" | "tensorrt")` from checkpoints: export (and build) once into the
user cache, then reuse.

The cache key covers what changes the graphs: both checkpoints' configs and weight files (name,
size, modification time), the bundle format, the flavour and a slots-trt bundle's capacity, so
editing a checkpoint triggers a fresh export, and the exporter's graphs revision: a release that
writes other graphs exports afresh and removes the pair's export of the old revision (and its engines).
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

from dflash_trt.export.manifest import FORMAT_VERSION, GRAPHS_REVISION
from dflash_trt.models import embedded
from dflash_trt.models.checkpoints import resolve_target


def _fingerprint(path: Path) -> list:
    files = sorted(p for p in path.iterdir() if p.is_file() and p.suffix in (".json", ".safetensors"))
    return [[p.name, p.stat().st_size, p.stat().st_mtime_ns] for p in files]


def bundle_key(target: str, draft: str, flavour: str = "slots", capacity: int | None = None,
               quant: str | None = None, draft_quant: str | None = None, draft_distribution: bool | None = None) -> str:
    """`<pair>-g<graphs revision>`: the pair's files and the export's settings, then what the exporter
    writes for them (a new revision exports afresh; `forget_other_revisions` removes the old export)."""
    target_dir = Path(resolve_target(target))
    identity = {
        "format": FORMAT_VERSION,
        "flavour": flavour,
        "capacity": capacity,
        **({"quant": quant} if quant else {}),
        **({"draft_quant": draft_quant} if draft_quant else {}),
        **({"draft_distribution": draft_distribution} if draft_distribution is not None else {}),
        "target": _fingerprint(target_dir) if target_dir.is_dir() else target,
        "draft": _fingerprint(Path(draft)),
    }
    pair = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]
    return f"{pair}-g{GRAPHS_REVISION}"


def forget_other_revisions(root: Path, key: str) -> None:
    """Remove what `root` caches for `key`'s pair under another graphs revision (`key` itself, and
    entries named `key-...` such as its engines, stay): each revision would otherwise leave a full
    export behind in the user cache."""
    pair = key.rsplit("-g", 1)[0]
    for path in root.glob(f"{pair}-g*"):
        if path.name != key and not path.name.startswith(key + "-"):
            shutil.rmtree(path, ignore_errors=True)


def cached_bundle(target: str, draft: str, flavour: str = "slots", capacity: int | None = None,
                  quant: str | None = None, draft_quant: str | None = None,
                  draft_distribution: bool | None = None) -> Path:
    """The pair's bundle of `flavour` (slots: for the C++ onnxruntime executor; slots-trt, with its
    static `capacity`: for TensorRT engines), its target's and drafter's weights quantized as `quant`
    and `draft_quant` name (export/quantize.py), its draft block graph returning the drafter's
    distribution as `draft_distribution` says (None: the flavour's default), exported at first use."""
    key = bundle_key(target, draft, flavour, capacity, quant, draft_quant, draft_distribution)
    out = embedded.cache_root() / "bundles" / key
    if (out / "bundle.json").is_file():
        return out
    from dflash_trt.export.bundle import export_bundle
    from dflash_trt.models.checkpoints import check_pair, load_drafter, load_target, load_tokenizer
    from dflash_trt.models.pairing import validate_pair

    check_pair(target, draft)
    target_model, tokenizer = load_target(target)
    drafter = load_drafter(draft)
    validate_pair(target_model, drafter.config, tokenizer, load_tokenizer(draft))
    bundle = export_bundle(target_model, drafter, tokenizer, out, flavour=flavour, force=True, capacity=capacity,
                           quant=quant, draft_quant=draft_quant, draft_distribution=draft_distribution)
    forget_other_revisions(out.parent, out.name)
    return bundle


def cached_engines(target: str, draft: str, capacity: int, max_batch: int, quant: str | None = None,
                   draft_quant: str | None = None, draft_distribution: bool | None = None) -> Path:
    """`LLM(..., backend="tensorrt")` from checkpoints: TensorRT engines for this GPU and the C++
    TensorRT executor, built once from a cached slots-trt bundle of KV slots of `capacity` tokens, for
    up to `max_batch` rows, into the user cache (keyed by the bundle, the rows and the GPU's compute
    capability); `draft_distribution`: as cached_bundle's (the drafter rule needs it)."""
    from dflash_trt.engines.machine import gpu_compute_capability
    from dflash_trt.errors import DFlashError

    gpu = gpu_compute_capability()
    if gpu is None:
        raise DFlashError("backend 'tensorrt' runs TensorRT engines on an NVIDIA GPU, and none is visible here: "
                          "use backend 'onnxruntime' or 'torch'")
    key = bundle_key(target, draft, "slots-trt", capacity, quant, draft_quant, draft_distribution)
    out = embedded.cache_root() / "engines" / f"{key}-b{max_batch}-sm{gpu.replace('.', '')}"
    if (out / "engine.json").is_file():
        return out
    from dflash_trt.engines.build import build_engines
    from dflash_trt.engines.config import BuildConfig

    source = cached_bundle(target, draft, "slots-trt", capacity, quant, draft_quant, draft_distribution)
    build_engines(source, out, BuildConfig(engine="tensorrt", max_batch=max_batch, max_seq_len=capacity,
                                                 force=True))
    forget_other_revisions(out.parent, key)
    return out

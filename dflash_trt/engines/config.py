"""What `dflash-trt build` is asked to build: one frozen config, checked before any work starts."""

from __future__ import annotations

from dataclasses import dataclass

from dflash_trt.errors import DFlashError
from dflash_trt.export.manifest import DTYPES

ENGINES = ("tensorrt-rtx", "tensorrt", "onnxruntime")
# TensorRT-RTX's ComputeCapability enum (1.7): consumer GPUs only, no Hopper (SM90).
RTX_COMPUTE_CAPABILITIES = ("7.5", "8.0", "8.6", "8.9", "12.0", "12.1")


@dataclass(frozen=True)
class BuildConfig:
    engine: str = "tensorrt-rtx"
    compute_capabilities: tuple[str, ...] = ()  # tensorrt-rtx: targets; tensorrt: must be the GPU's own
    dtype: str | None = None  # None: the source bundle's (fp32 when build exports)
    max_batch: int = 1
    max_seq_len: int = 2048
    block_size: int | None = None  # None: the drafter's
    force: bool = False

    def __post_init__(self):
        if self.engine not in ENGINES:
            raise DFlashError(f"--engine '{self.engine}' is unknown; choose one of {', '.join(ENGINES)}")
        if self.dtype is not None and self.dtype not in DTYPES.values():
            raise DFlashError(f"--dtype '{self.dtype}' is unknown; choose one of {', '.join(DTYPES)}")
        if self.max_batch < 1:
            raise DFlashError(f"--max-batch must be >= 1, got {self.max_batch}")
        if self.max_seq_len < 16:
            raise DFlashError(f"--max-seq-len must be >= 16, got {self.max_seq_len}")
        if self.block_size is not None and not 2 <= self.block_size <= self.max_seq_len // 2:
            raise DFlashError(f"--block-size must be between 2 and --max-seq-len / 2, got {self.block_size}")
        if self.engine == "tensorrt-rtx":
            if not self.compute_capabilities:
                raise DFlashError("--engine tensorrt-rtx builds ahead of time: name the GPUs with "
                                  "--compute-capability, e.g. 12.0 (RTX 50xx) or 8.9 (RTX 40xx, L4, L40S)")
            for cc in self.compute_capabilities:
                if cc == "9.0":
                    raise DFlashError("--compute-capability 9.0 (H100/H200): TensorRT-RTX has no Hopper target; "
                                      "use --engine tensorrt on the GPU itself")
                if cc not in RTX_COMPUTE_CAPABILITIES:
                    raise DFlashError(f"--compute-capability {cc}: TensorRT-RTX targets "
                                      f"{', '.join(RTX_COMPUTE_CAPABILITIES)}")
        elif self.engine == "onnxruntime" and self.compute_capabilities:
            raise DFlashError("--compute-capability applies to TensorRT engines, not --engine onnxruntime")


def parse_compute_capabilities(text: str | None) -> tuple[str, ...]:
    """"12.0,8.9" -> ("12.0", "8.9"); "120" and "sm_120" are accepted too."""
    if not text:
        return ()
    found = []
    for item in (part.strip().lower().removeprefix("sm_").removeprefix("sm") for part in text.split(",")):
        if not item:
            continue
        if "." not in item and item.isdigit() and len(item) >= 2:
            item = f"{item[:-1]}.{item[-1]}"
        major, _, minor = item.partition(".")
        if not (major.isdigit() and minor.isdigit()):
            raise DFlashError(f"--compute-capability: '{item}' is not MAJOR.MINOR (e.g. 12.0, 8.9)")
        found.append(f"{int(major)}.{int(minor)}")
    return tuple(dict.fromkeys(found))

"""The C++ runtime core, dflash_trt._core, loaded on first use with one line for a build that is missing."""

from __future__ import annotations

from dflash_trt.errors import DFlashError


def native_core():
    try:
        from dflash_trt import _core
    except ImportError as err:  # never built: say how
        raise DFlashError(
            "dflash_trt._core is not built: run `bash scripts/setup.sh` (needs a C++17 compiler)"
        ) from err
    return _core

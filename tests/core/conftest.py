"""The C++ core's tests. They skip (with the reason) only when dflash_trt._core was never built;
a module that is built but fails to import is a failure, not a skip. Test modules share one
namespace (no __init__.py), hence test_core_acceptance/test_core_sampling beside tests/spec's."""

import importlib
import importlib.util

import pytest


@pytest.fixture(scope="session")
def core():
    if importlib.util.find_spec("dflash_trt._core") is None:
        pytest.skip("dflash_trt._core is not built: run `bash scripts/setup.sh` (needs a C++17 compiler)")
    return importlib.import_module("dflash_trt._core")

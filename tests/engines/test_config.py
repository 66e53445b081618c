"""BuildConfig and --compute-capability: every bad build request is one line, before any work."""

import pytest

from dflash_trt.engines.config import BuildConfig, parse_compute_capabilities
from dflash_trt.errors import DFlashError


@pytest.mark.parametrize(("text", "expected"), [
    ("12.0", ("12.0",)), ("12.0,8.9", ("12.0", "8.9")), ("sm_120, 89", ("12.0", "8.9")), ("8.9,8.9", ("8.9",)),
    ("", ()), (None, ()),
])
def test_compute_capabilities_parse(text, expected):
    assert parse_compute_capabilities(text) == expected


def test_a_compute_capability_that_is_not_a_number_is_refused():
    with pytest.raises(DFlashError, match="'ampere' is not MAJOR.MINOR"):
        parse_compute_capabilities("ampere")


@pytest.mark.parametrize(("fields", "message"), [
    ({"engine": "tensorrt-llm"}, "--engine 'tensorrt-llm' is unknown"),
    ({"engine": "tensorrt-rtx"}, "name the GPUs with --compute-capability"),
    ({"engine": "tensorrt-rtx", "compute_capabilities": ("9.0",)}, "TensorRT-RTX has no Hopper target"),
    ({"engine": "tensorrt-rtx", "compute_capabilities": ("7.0",)}, "TensorRT-RTX targets 7.5"),
    ({"engine": "onnxruntime", "compute_capabilities": ("8.9",)}, "not --engine onnxruntime"),
    ({"engine": "onnxruntime", "dtype": "int8"}, "--dtype 'int8' is unknown"),
    ({"engine": "onnxruntime", "max_batch": 0}, "--max-batch must be >= 1"),
    ({"engine": "onnxruntime", "max_seq_len": 8}, "--max-seq-len must be >= 16"),
    ({"engine": "onnxruntime", "block_size": 1}, "--block-size must be between 2"),
])
def test_bad_build_configs_are_refused_in_one_line(fields, message):
    with pytest.raises(DFlashError, match=message) as err:
        BuildConfig(**fields)
    assert "\n" not in str(err.value)

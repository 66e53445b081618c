"""A fake TensorRT runtime on the CPU: the API subset runtime/trt_backend.py uses, onnxruntime underneath.

An "engine" is a JSON file naming an ONNX graph, its bundle.json I/O spec and its optimization
profiles (the boxes `input_ranges` gives the real builder). Like TensorRT, an execution context
holds one profile and refuses input shapes (and shape-tensor values) outside its box, computes
output shapes from the input shapes and shape-tensor values, reads inputs from the raw addresses
it was given (shape tensors from host memory) with the shapes set and the engine's dtypes, and
writes outputs to theirs. A strided view or a wrong shape therefore reads the wrong numbers here
as it would on a GPU. Every execution is logged (graph, profile phase, sizes) in `module().runs`.
"""

from __future__ import annotations

import ctypes
import enum
import functools
import json
import math
import types
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort

from dflash_trt.engines.profiles import input_ranges
from dflash_trt.export.op_library import session_options

VERSION = "10.99.0-fake"
NUMPY = {"float32": np.float32, "float16": np.float16, "int64": np.int64}
TRT_NAMES = {"float32": "FLOAT", "float16": "HALF", "bfloat16": "BF16", "int64": "INT64"}


@dataclass(frozen=True)
class Run:
    graph: str
    phase: str  # the profile the context that ran it holds
    sizes: dict[str, int]  # symbolic dim or shape tensor -> value


def module() -> types.ModuleType:
    """A fresh fake `tensorrt` module, to put in sys.modules; its `runs` list logs every execution."""
    trt = types.ModuleType("fake_tensorrt")
    trt.__version__ = VERSION
    trt.runs = []
    trt.Logger = Logger
    trt.TensorIOMode = TensorIOMode
    trt.Runtime = functools.partial(Runtime, runs=trt.runs)
    return trt


def build_graph(kind: str, source: Path, out: Path, spec: dict, profiles: dict[str, dict],
                compute_capabilities: tuple[str, ...], plugin_library: Path | None = None) -> dict:
    """Stands in for engines.trt_engine.build_trt_graph: the engine file says what TensorRT would compile."""
    boxes = [{"phase": phase, "ranges": input_ranges(spec, dims)} for phase, dims in profiles.items()]
    out.write_text(json.dumps({"graph": out.stem, "onnx": str(Path(source).resolve()), "spec": spec, "profiles": boxes}))
    return {"file": out.name, "build_s": 0.0, "bytes": out.stat().st_size}


class Logger:
    WARNING = "WARNING"

    def __init__(self, severity):
        self.severity = severity


class TensorIOMode(enum.Enum):
    INPUT = "INPUT"
    OUTPUT = "OUTPUT"


class Runtime:
    def __init__(self, logger: Logger, runs: list[Run]):
        self.runs = runs

    def deserialize_cuda_engine(self, data: bytes) -> Engine:
        return Engine(json.loads(data), self.runs)


class Engine:
    def __init__(self, blob: dict, runs: list[Run]):
        self.graph, self.profiles, self.runs = blob["graph"], blob["profiles"], runs
        spec = blob["spec"]
        self.io = {io["name"]: io for io in spec["inputs"] + spec["outputs"]}
        self.modes = {io["name"]: TensorIOMode.INPUT for io in spec["inputs"]}
        self.modes.update({io["name"]: TensorIOMode.OUTPUT for io in spec["outputs"]})
        self.session = ort.InferenceSession(blob["onnx"], session_options(False), providers=["CPUExecutionProvider"])

    @property
    def num_io_tensors(self) -> int:
        return len(self.io)

    def get_tensor_name(self, index: int) -> str:
        return list(self.io)[index]

    def get_tensor_mode(self, name: str) -> TensorIOMode:
        return self.modes[name]

    def get_tensor_dtype(self, name: str):
        return types.SimpleNamespace(name=TRT_NAMES[self.io[name]["dtype"]])

    def create_execution_context(self) -> Context:
        return Context(self)


def _array(address: int, shape: tuple[int, ...], dtype: str) -> np.ndarray:
    """The memory at `address` as an array, as TensorRT sees it: contiguous, of the engine's dtype."""
    dtype = np.dtype(NUMPY[dtype])
    count = math.prod(shape)
    if count == 0:  # an empty tensor may be bound to a null address
        return np.empty(shape, dtype)
    assert address, "a non-empty tensor is bound to a null address"
    return np.frombuffer((ctypes.c_char * (count * dtype.itemsize)).from_address(address), dtype).reshape(shape)


class Context:
    def __init__(self, engine: Engine):
        self.engine = engine
        self.profile: dict | None = None
        self.shapes: dict[str, tuple[int, ...]] = {}
        self.addresses: dict[str, int] = {}

    def set_optimization_profile_async(self, index: int, stream: int) -> bool:
        assert self.profile is None and 0 <= index < len(self.engine.profiles)
        self.profile = self.engine.profiles[index]
        return True

    def set_input_shape(self, name: str, shape: tuple[int, ...]) -> bool:
        assert self.profile is not None, "set an optimization profile first"
        assert self.engine.modes[name] is TensorIOMode.INPUT
        low, _, high = self.profile["ranges"][name]
        declared = self.engine.io[name]["shape"]
        assert len(shape) == len(declared), f"{name}: rank {len(shape)}, the engine's is {len(declared)}"
        if declared:  # a shape tensor's box bounds its value, checked when it is read
            assert all(lo <= s <= hi for lo, s, hi in zip(low, shape, high, strict=True)), (
                f"{self.engine.graph}: {name} {tuple(shape)} is outside profile '{self.profile['phase']}' ({low}..{high})")
        self.shapes[name] = tuple(shape)
        return True

    def set_tensor_address(self, name: str, address: int) -> bool:
        self.addresses[name] = address
        return True

    def _shape_value(self, name: str) -> int:
        value = ctypes.c_int64.from_address(self.addresses[name]).value  # shape tensors live on the host
        (low,), _, (high,) = self.profile["ranges"][name]
        assert low <= value <= high, (
            f"{self.engine.graph}: shape input {name}={value} is outside profile '{self.profile['phase']}' ({low}..{high})")
        return value

    def _sizes(self) -> dict[str, int]:
        """Symbolic dim -> value, bound from the input shapes set; shape tensors by their values."""
        sizes = {}
        for name, io in self.engine.io.items():
            if self.engine.modes[name] is TensorIOMode.OUTPUT:
                continue
            if not io["shape"]:
                sizes[name] = self._shape_value(name)
            for dim, value in zip(io["shape"], self.shapes[name], strict=True):
                want = sizes.setdefault(dim, value) if isinstance(dim, str) else dim
                assert want == value, f"{self.engine.graph}: {name} {self.shapes[name]} disagrees with {io['shape']}"
        return sizes

    def get_tensor_shape(self, name: str) -> tuple[int, ...]:
        if self.engine.modes[name] is TensorIOMode.INPUT:
            return self.shapes[name]
        sizes = self._sizes()
        return tuple(eval(d, {"__builtins__": {}}, sizes) if isinstance(d, str) else d  # "past+new", "block-1"
                     for d in self.engine.io[name]["shape"])

    def execute_async_v3(self, stream: int) -> bool:
        engine = self.engine
        inputs = [n for n, mode in engine.modes.items() if mode is TensorIOMode.INPUT]
        outputs = [n for n, mode in engine.modes.items() if mode is TensorIOMode.OUTPUT]
        missing = [n for n in engine.io if n not in self.addresses or (n in inputs and n not in self.shapes)]
        assert not missing, f"{engine.graph}: no shape or address for {missing}"
        sizes = self._sizes()
        feeds = {n: np.array(sizes[n], np.int64) if not engine.io[n]["shape"]
                 else _array(self.addresses[n], self.shapes[n], engine.io[n]["dtype"]).copy() for n in inputs}
        for name, value in zip(outputs, engine.session.run(outputs, feeds), strict=True):
            shape = self.get_tensor_shape(name)
            assert value.shape == shape, f"{engine.graph}: {name} came out {value.shape}, TensorRT said {shape}"
            _array(self.addresses[name], shape, engine.io[name]["dtype"])[...] = value
        engine.runs.append(Run(engine.graph, self.profile["phase"], sizes))
        return True

"""The TensorRT backend: per-request sessions over an engine bundle (TensorRT or TensorRT-RTX), on a GPU.

Caches, features and logits stay on the device as torch CUDA tensors; the verify loop's argmax
(or its sampling) runs on them there, and only token ids cross to the host. The graphs follow
bundle contract v1 (present = past ++ new), so a step's shapes change with the context: each
graph has one execution context per optimization profile (prefill, verify / step, draft), and a
step runs on the first whose box holds its shapes. CUDA graphs need fixed shapes, which arrive
with the slot-buffer contract (v2); until then steps are launched one by one.

Never construct a TensorRT Runtime without a CUDA device (the library crashes the process):
`open_bundle` refuses a machine without a GPU before this module touches TensorRT. A bundle on
device "cpu" exists for the tests, which stand a fake TensorRT module (onnxruntime underneath) in
for the library, so that this module's own logic is tested on machines without a GPU.
"""

from __future__ import annotations

from pathlib import Path

import torch

from dflash_trt.engines.machine import library_module
from dflash_trt.engines.profiles import covers
from dflash_trt.errors import DFlashError
from dflash_trt.runtime.concat_cache import ConcatCacheTarget, cache_layout
from dflash_trt.runtime.engine_bundles import open_bundle

TORCH_DTYPES = {"FLOAT": torch.float32, "HALF": torch.float16, "BF16": torch.bfloat16, "INT64": torch.int64,
                "INT32": torch.int32, "BOOL": torch.bool}


class _Graph:
    """One engine and an execution context per profile, sharing the bundle's stream."""

    def __init__(self, trt, runtime, path: Path, phases: dict[str, dict], device: torch.device, stream: int):
        self.trt = trt
        self.engine = runtime.deserialize_cuda_engine(path.read_bytes())
        if self.engine is None:
            raise DFlashError(f"{path}: TensorRT could not deserialize the engine (built for another version or GPU?)")
        self.phases = phases
        self.device = device
        self.stream = stream  # a CUDA stream handle; 0 off CUDA
        self.contexts = []
        for index in range(len(phases)):
            context = self.engine.create_execution_context()
            context.set_optimization_profile_async(index, stream)
            self.contexts.append(context)
        names = [self.engine.get_tensor_name(i) for i in range(self.engine.num_io_tensors)]
        self.inputs = [n for n in names if self.engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT]
        self.outputs = [n for n in names if self.engine.get_tensor_mode(n) == trt.TensorIOMode.OUTPUT]

    def run(self, sizes: dict[str, int], feeds: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Run on a profile holding `sizes` (symbolic dim -> value), the last listed first: profiles
        go from the prefill's wide box to the decode step's tight one, which TensorRT tuned for
        exactly these shapes. Feeds are on the bundle's device, except shape inputs (0-d, on the host,
        as TensorRT reads them before launching)."""
        boxes = list(enumerate(self.phases.values()))[::-1]
        index = next((i for i, dims in boxes if covers(dims, sizes)), None)
        if index is None:
            raise DFlashError(f"a step of {sizes} is outside every optimization profile of this engine: "
                              f"rebuild with a larger --max-seq-len / --max-batch / --block-size")
        context = self.contexts[index]
        for name in self.inputs:
            tensor = feeds[name]
            if not context.set_input_shape(name, tuple(tensor.shape)):  # outside the profile: say so now
                raise DFlashError(f"{name}{tuple(tensor.shape)} is outside the engine's profile {list(self.phases)[index]}")
            context.set_tensor_address(name, tensor.data_ptr())
        outputs = {}
        for name in self.outputs:
            shape = tuple(context.get_tensor_shape(name))
            dtype = TORCH_DTYPES[self.engine.get_tensor_dtype(name).name]
            outputs[name] = torch.empty(shape, dtype=dtype, device=self.device)
            context.set_tensor_address(name, outputs[name].data_ptr())
        if not context.execute_async_v3(self.stream):
            raise DFlashError("TensorRT failed to launch the engine (see its log above)")
        return outputs


class TrtBundle:
    """The three engines of one bundle, deserialized once and shared by every request."""

    def __init__(self, root: str | Path, device: str = "cuda"):
        self.root = Path(root)
        self.device = torch.device(device)
        kind, self.manifest = open_bundle(self.root)  # refuses before TensorRT is touched
        if kind not in ("tensorrt", "tensorrt-rtx"):
            raise DFlashError(f"{self.root} is not a TensorRT engine bundle ({kind}): run it with backend 'onnxruntime'")
        if self.manifest.get("contract", 1) != 1:  # these sessions grow caches by concatenation (contract 1)
            raise DFlashError(f"{self.root}: these engines use graph contract {self.manifest['contract']} (slot "
                              f"caches), which the per-request TensorRT sessions cannot run: build from a "
                              f"--flavour portable bundle for them")
        trt = library_module(kind)
        self.logger = trt.Logger(trt.Logger.WARNING)
        self.runtime = trt.Runtime(self.logger)
        plugin = self.manifest.get("plugin_library")
        if plugin is not None:
            self.runtime.get_plugin_registry().load_library(str(self.root / plugin["file"]))
        self.stream = torch.cuda.Stream() if self.device.type == "cuda" else None
        handle = 0 if self.stream is None else self.stream.cuda_stream
        self.graphs = {name: _Graph(trt, self.runtime, self.root / spec["file"], self.manifest["profiles"][name],
                                    self.device, handle)
                       for name, spec in self.manifest["graphs"].items()}
        self.dtype = TORCH_DTYPES[{"float32": "FLOAT", "float16": "HALF", "bfloat16": "BF16"}[self.manifest["dtype"]]]
        self.max_seq_len = self.manifest["max_seq_len"]

    def empty_cache(self, who: str) -> tuple[list[torch.Tensor], list[str]]:
        """`who`'s ("target" or "draft") caches before a prompt (K/V, and a hybrid's zero states) and their kinds."""
        layout = cache_layout(self.manifest[who], self.manifest["dtype"])
        caches = [torch.zeros(shape, dtype=getattr(torch, dtype), device=self.device) for _, shape, dtype in layout]
        return caches, [kind for kind, _, _ in layout]

    def run(self, graph: str, sizes: dict[str, int], feeds: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        if self.stream is None:
            return self.graphs[graph].run(sizes, feeds)
        # The engine's stream waits for the caller's: for the feeds written there (a commit's copy,
        # the draft context's concatenation) and for its reads of earlier outputs, whose memory this
        # launch may reuse.
        self.stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.stream):
            outputs = self.graphs[graph].run(sizes, feeds)
        torch.cuda.current_stream().wait_stream(self.stream)  # the loop's torch ops read the outputs
        return outputs


def _ids(ids: list[int], device: torch.device) -> torch.Tensor:
    return torch.tensor([ids], dtype=torch.int64, device=device)


class TrtTargetSession(ConcatCacheTarget):
    def __init__(self, bundle: TrtBundle):
        super().__init__(*bundle.empty_cache("target"))
        self.bundle = bundle
        spec = bundle.manifest["graphs"]["target"]
        self.past_names = [io["name"] for io in spec["inputs"]][3:]
        self.present_names = [io["name"] for io in spec["outputs"]][2:]

    def _step(self, ids: list[int], logits_from: int) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
        if self.length + len(ids) > self.bundle.max_seq_len:
            raise DFlashError(f"the sequence would reach {self.length + len(ids)} tokens, beyond the engine's "
                              f"--max-seq-len {self.bundle.max_seq_len}: rebuild with a larger one")
        device = self.bundle.device
        feeds = {"input_ids": _ids(ids, device), "past_lengths": torch.tensor([self.length], device=device),
                 "logits_from": torch.tensor(logits_from, dtype=torch.int64)}  # a shape input: host memory
        feeds.update(zip(self.past_names, self.past, strict=True))
        sizes = {"batch": 1, "new": len(ids), "past": self.length, "logits_from": logits_from}
        out = self.bundle.run("target", sizes, feeds)
        return out["logits"][0], out["features"][0], [out[name] for name in self.present_names]

    def _keep(self, present: torch.Tensor, length: int) -> torch.Tensor:
        return present[:, :, :length].contiguous()  # a device copy in contract v1

    def _own(self, view: torch.Tensor) -> torch.Tensor:
        return view.contiguous()  # TensorRT reads inputs at raw addresses: no strided views


class TrtDraftSession:
    def __init__(self, bundle: TrtBundle):
        self.bundle = bundle
        self.context_names = [io["name"] for io in bundle.manifest["graphs"]["draft_block"]["inputs"]][2:]
        self.mask_token_id = bundle.manifest["draft"]["mask_token_id"]
        self.context, _ = bundle.empty_cache("draft")
        self.length = 0

    def draft(self, features: torch.Tensor, bonus: int, block_size: int) -> list[int]:
        n = features.shape[0]
        device = self.bundle.device
        positions = torch.arange(self.length, self.length + n, device=device)[None]
        new = self.bundle.run("draft_context", {"batch": 1, "new": n},
                              {"features": features[None].to(self.bundle.dtype).contiguous(), "positions": positions})
        self.context = [torch.cat([c, new[name]], dim=2) for c, name in zip(self.context, self.context_names, strict=True)]
        self.length += n
        feeds = {"block_ids": _ids([bonus] + [self.mask_token_id] * (block_size - 1), device),
                 "context_lengths": torch.tensor([self.length], device=device)}
        feeds.update(zip(self.context_names, self.context, strict=True))
        out = self.bundle.run("draft_block", {"batch": 1, "block": block_size, "context": self.length}, feeds)
        return out["draft_tokens"][0].tolist()  # the only device -> host copy of a draft step

"""The torch backend: the export's contract-2 modules, run in PyTorch behind the C++ slot executor.

`torch_executor(llm, max_batch, capacity)` makes a `_core.PyGraphExecutor`: the slot executor that
onnxruntime and TensorRT run under (csrc/slot_executor.h: slot buffers, phases, staging, acceptance),
whose three graphs are the modules `export` traces (SlotTargetGraph or HybridSlotTargetGraph,
DraftContextGraph, DraftBlockGraph) over the LLM's own models. The executor allocates every buffer
on its device (the host, or GPU 0 through the CUDA driver) and hands each run the addresses; a graph
here views them as tensors, runs its module and writes the outputs the executor bound. Requests
share every matrix multiply of a phase, as on the other executors.

Two parts run as a runtime runs them, not as the exporters trace them: slot attention in place
(`InPlaceSlotAttention`: the new K/V rows are written into the executor's cache buffers themselves
and each run attends over the keys its rows hold, not the whole capacity; the exported graphs'
reference op returns new caches, which would copy them every step), and, on the CPU, sparse MoE blocks
as the model defines them (each token through its own top-k experts; on a GPU the export's fixed-shape
form, which CUDA graphs can capture: ROUTED_MOE).
"""

from __future__ import annotations

import contextlib
import ctypes
import math
from collections import Counter

import torch
from torch.nn import functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from dflash_trt.errors import DFlashError
from dflash_trt.runtime.native import native_core

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16, "int64": torch.int64}
# __cuda_array_interface__ has no bfloat16: such buffers are viewed as 16-bit integers, then reinterpreted
_TYPESTR = {torch.float32: "<f4", torch.float16: "<f2", torch.bfloat16: "<i2", torch.int64: "<i8"}
_VIEWS_KEPT = 512  # views made from addresses, reused across runs (the buffers are reused every step)
GRAPHED_TOKENS = 16  # runs of at most this many new tokens per row are CUDA-graphed (not prefill chunks)
SHAPES_KEPT = 4096  # an ungraphed graph's input shapes remembered (csrc/graph.h's FirstRuns: as many)
GRAPHS_KEPT = 256  # captured graphs per graph (one a rows x tokens shape: adaptive blocks make many)
# The draft graphs as the plugin flavour writes them (dflash:: ops for KV injection and block attention):
# "auto" on a GPU where our CUDA kernels register (runtime/cuda_ops.py), so decoding runs them; True
# also elsewhere, on the ops' PyTorch reference bodies (tests); False never.
DRAFT_KERNELS: bool | str = "auto"
# A target's own dflash ops on a GPU, where the plugin library is built (registered for the whole
# process: runtime/cuda_ops.py): a hybrid's Gated DeltaNet recurrence through our GatedDeltaRule kernel
# (False: the op's PyTorch body, a loop of small kernels per token), and routed MoE layers through our
# MoE kernel (each picked expert's weights read once per call; False: ROUTED_MOE's standard-op form).
TARGET_KERNELS = True
# A target's attention in decode-sized runs (at most GRAPHED_TOKENS new tokens a row) through
# dflash::block_attention (InPlaceSlotAttention), which reads the keys each row holds (a captured SDPA step
# reads the whole capacity, masked): "auto" on a GPU where our CUDA kernels register and TARGET_KERNELS
# holds, for the shapes its tensor-core form takes (16-bit, head_dim 128: BlockAttention's README; its
# float32 CUDA-core form is 3-4x slower); True for every shape it takes, and elsewhere on the op's PyTorch
# reference body (tests); False never.
TARGET_ATTENTION_KERNEL: bool | str = "auto"
BLOCK_ATTENTION_HEAD_DIM = 256  # the widest head BlockAttention's kernels take (plugins/block_attention)
BLOCK_ATTENTION_MMA = (128, (torch.float16, torch.bfloat16))  # its tensor-core form's head_dim and dtypes
# A sparse MoE block as the export writes it (export/moe.py: the experts the call's tokens picked, every
# token through each, in fixed shapes): "auto" on a GPU, where HF's own block (a loop over the picked
# experts, decided on the host) would stop every step at a host sync and keep its target out of CUDA
# graphs, and where the extra compute is cheap beside the weights read; True also elsewhere (tests);
# False never. On the CPU HF's block computes only each token's own top-k.
ROUTED_MOE: bool | str = "auto"


SPAN_BUCKET = 128  # on a GPU, eager attention spans a multiple of this many keys
# The attention kernels an eager run on a GPU may take: not cuDNN's, which builds an execution plan for
# every new shape (about 9 ms each on an H200): a prefill chunk's length is its prompt's, so every new
# length paid it. Memory-efficient attention takes the mask with no plan; it has no grouped-query
# form, so the kv heads are repeated for it (MATH remains for shapes it refuses).
EAGER_ATTENTION = [SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float,
           eager_gpu: bool) -> torch.Tensor:
    """Softmax attention of q [b, heads, s, d] over k, v [b, kv_heads, span, d] under a boolean mask
    [b, 1, s, span]; grouped-query heads read kv head h // (heads // kv_heads). `eager_gpu`: an eager
    run on a GPU, kept off cuDNN's attention (EAGER_ATTENTION)."""
    if not eager_gpu:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=True)
    groups = q.shape[1] // k.shape[1]
    if groups > 1:
        k, v = (t.repeat_interleave(groups, dim=1) for t in (k, v))
    with sdpa_kernel(EAGER_ATTENTION):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)


def attention_span(longest: int, capacity: int, cuda: bool) -> int:
    """How many cache slots an eager run attends over: the longest row's, rounded up on a GPU to a
    multiple of SPAN_BUCKET (masked), so that the attention's shapes recur from step to step (a kernel
    that prepares per shape, as cuDNN's plans did at about 9 ms each on an H200, pays once a bucket)."""
    if cuda:
        longest = -(-longest // SPAN_BUCKET) * SPAN_BUCKET
    return max(1, min(longest, capacity))


class InPlaceSlotAttention:
    """dflash::slot_attention (export/slot_ops.py, the reference) for running, not exporting: the
    valid new K/V rows go into `key_cache` / `value_cache` in place and are returned as those same
    tensors, and queries attend over the first max(cache_lengths + query_lengths) slots only (over
    the whole capacity while a CUDA graph is captured: the span is not known until replay).

    With `kernel`, runs of at most GRAPHED_TOKENS new tokens per row (decode, verify: the captured
    ones) attend through dflash::block_attention instead (on a GPU our BlockAttention kernel, which
    reads each row's length on the device and so reads the keys a row holds, captured or not): the
    cache's first cache_lengths[b] slots are its context, the run's own keys its block, causal.

    The executor guarantees cache_lengths[b] + s <= capacity for every row of a run (idle ones too),
    so every row's write window is inside its slot; padding rows write back what the cache held."""

    def __init__(self, kernel: bool = False):
        self.kernel = kernel
        if kernel:
            from dflash_trt.export.plugin_ops import block_attention  # defines the op

            self._block_attention = block_attention

    def __call__(self, query, key, value, key_cache, value_cache, cache_lengths, query_lengths, num_heads: int,
                 kv_heads: int, scale: float, window: int):
        b, s, _ = query.shape
        d = key_cache.shape[3]
        steps = torch.arange(s, device=query.device)
        at = cache_lengths[:, None] + steps[None]  # [b, s]: the slot (and position) of each query row
        valid = steps[None] < query_lengths[:, None]  # [b, s]
        index = at[:, None, :, None].expand(b, kv_heads, s, d)
        block = []  # the run's own K/V, [b, kv_heads, s, d]
        for new, cache in ((key, key_cache), (value, value_cache)):
            new = new.view(b, s, kv_heads, d).transpose(1, 2).to(cache.dtype)
            cache.scatter_(2, index, torch.where(valid[:, None, :, None], new, cache.gather(2, index)))
            block.append(new)
        q = query.view(b, s, num_heads, d).transpose(1, 2)
        if self.kernel and s <= GRAPHED_TOKENS:
            # the cache past cache_lengths is not read: the block's keys come from `block`, padding
            # queries (past query_lengths) come after every valid one, so no valid query sees their keys
            out = self._block_attention(q, key_cache, value_cache, *block, cache_lengths, scale, 1, window)
            out = torch.where(valid[:, None, :, None], out, 0.0)
            return out.transpose(1, 2).reshape(b, s, -1), key_cache, value_cache
        capturing = query.is_cuda and torch.cuda.is_current_stream_capturing()
        if capturing:
            span = key_cache.shape[2]  # a CUDA graph replays with other lengths: the whole capacity, masked
        else:
            span = attention_span(int((cache_lengths + query_lengths).max()), key_cache.shape[2], query.is_cuda)
        slot = torch.arange(span, device=query.device)
        diff = at[:, :, None] - slot[None, None]  # [b, s, span]
        visible = diff >= 0
        if window > 0:
            visible = visible & (diff < window)
        # a padding row sees slot 0 (a fully masked row would be NaN); its output is zeroed below
        visible = (visible & valid[:, :, None]) | ((slot == 0)[None, None] & ~valid[:, :, None])
        k, v = (c[:, :, :span].to(q.dtype) for c in (key_cache, value_cache))
        out = attend(q, k, v, visible[:, None], scale, eager_gpu=query.is_cuda and not capturing)
        out = torch.where(valid[:, None, :, None], out, 0.0)
        return out.transpose(1, 2).reshape(b, s, -1), key_cache, value_cache


class GraphMemory:
    """One memory pool for every CUDA graph an executor captures. Its graphs replay one after another on
    its stream, and none keeps anything in its scratch from one replay to the next (each copies its
    outputs into the executor's buffers inside the graph), so they share it: the pool holds about the
    largest capture's scratch, not the sum of all (a 32-row verify's logits alone are 0.3 GB at Qwen3's
    vocabulary)."""

    def __init__(self):
        self._handle = None

    def handle(self):
        if self._handle is None:
            self._handle = torch.cuda.graph_pool_handle()
        return self._handle


class TorchGraph:
    """One module as the slot executor's graph: `run(what, inputs, outputs, bindings)` with each binding
    name -> (address, dtype name, shape tuple) in the executor's device memory, and the executor's number
    for that set of bindings (csrc/py_graph.h).

    On a GPU (`graphed`), a run of at most GRAPHED_TOKENS new tokens per row (decode, verify, draft
    steps) is captured as a CUDA graph the second time its bindings (addresses, dtypes, shapes) recur,
    and replayed from then on: the launches of a whole forward pass become one, where TensorRT's
    executor would capture around its enqueue. A run that cannot be captured (a host sync inside)
    stays eager for those bindings."""

    def __init__(self, module: torch.nn.Module, inputs: list[str], outputs: list[str], device: torch.device,
                 stream, graphed: bool = False, stats: Counter | None = None, memory: GraphMemory | None = None):
        self.module, self.inputs, self.outputs = module, inputs, outputs
        self.device, self.stream, self.graphed = device, stream, graphed
        self.stats = Counter() if stats is None else stats
        self.memory = GraphMemory() if memory is None else memory
        self._views: dict[tuple, torch.Tensor] = {}
        self._graphs: dict[tuple | int, torch.cuda.CUDAGraph | None] = {}  # None: eager (could not capture)
        self._seen: Counter = Counter()
        self._shapes: set[tuple] = set()  # an ungraphed run's token and index input shapes, run at least once

    def _view(self, address: int, dtype: str, shape: tuple[int, ...]) -> torch.Tensor:
        key = (address, dtype, shape)
        found = self._views.get(key)
        if found is not None:
            return found
        torch_dtype = DTYPES[dtype]
        count = math.prod(shape)
        if count == 0:
            view = torch.empty(shape, dtype=torch_dtype, device=self.device)
        elif self.device.type == "cpu":
            memory = (ctypes.c_byte * (count * torch_dtype.itemsize)).from_address(address)
            view = torch.frombuffer(memory, dtype=torch_dtype, count=count).view(shape)
        else:
            view = _cuda_view(address, torch_dtype, shape)
        if len(self._views) >= _VIEWS_KEPT:
            self._views.clear()
        self._views[key] = view
        return view

    def run(self, what: str, inputs: dict, outputs: dict, bindings: int | None = None) -> bool:
        """Run over the bound memory -> whether this run paid one-time set-up: a graphed run's first (eager)
        and its capture; an ungraphed one, the first run of its token and index inputs' shapes (rank <= 2,
        as onnxruntime's: the allocator grows for them; not the draft context's, which grows each step on
        the host). Its time is no measure of the next run's (csrc/graph.h)."""
        missing = [name for name in self.inputs if name not in inputs]
        if missing:
            raise DFlashError(f"{what}: the executor bound no {missing[0]}")
        stream = torch.cuda.stream(self.stream) if self.stream is not None else contextlib.nullcontext()
        with torch.inference_mode(), stream:
            key = self._graph_key(inputs, outputs, bindings)
            graph = self._graphs.get(key) if key is not None else None
            if graph is not None:
                graph.replay()
                self.stats["replayed"] += 1
                return False
            capturing = key is not None and key not in self._graphs and self._seen[key] >= 1
            if capturing and self._capture(key, what, inputs, outputs):
                self._graphs[key].replay()
                self.stats["replayed"] += 1
                return True
            if key is not None:
                first = self._seen[key] == 0  # its kernels' first launch (cuBLAS's choice)
                self._seen[key] += 1
            else:
                shapes = tuple((name, shape) for name, (_, _, shape) in inputs.items() if len(shape) <= 2)
                first = len(self._shapes) < SHAPES_KEPT and shapes not in self._shapes
                if first:
                    self._shapes.add(shapes)
            self._forward(what, inputs, outputs)
            self.stats["eager"] += 1
            return first or capturing

    def _forward(self, what: str, inputs: dict, outputs: dict) -> None:
        results = self.module(*(self._view(*inputs[name]) for name in self.inputs))
        if isinstance(results, torch.Tensor):  # a draft block module returning its tokens only
            results = (results,)
        unreturned = [name for name in self.outputs[len(results):] if name in outputs]
        if unreturned or len(results) > len(self.outputs):
            raise DFlashError(f"{what}: the module returned {len(results)} outputs of {self.outputs}, the executor "
                              f"bound {sorted(outputs)}")
        for name, result in zip(self.outputs, results):
            if name not in outputs:
                continue  # an output the executor does not read
            out = self._view(*outputs[name])
            if tuple(out.shape) != tuple(result.shape):
                raise DFlashError(f"{what}: {name} came out {list(result.shape)}, the executor bound "
                                  f"{list(out.shape)}")
            if out.data_ptr() != result.data_ptr():  # a slot cache written in place is already there
                out.copy_(result)

    def _graph_key(self, inputs: dict, outputs: dict, bindings: int | None = None) -> tuple | int | None:
        """The bindings a captured graph is valid for: the executor's number for them (csrc/py_graph.h), else
        the bindings themselves; None: this run is not graphed."""
        if not self.graphed:
            return None
        first = inputs[self.inputs[0]][2]  # input_ids / features / block_ids: [rows, tokens, ...]
        if len(first) < 2 or first[1] > GRAPHED_TOKENS:
            return None
        if bindings is not None:
            return bindings if bindings >= 0 else None  # -1: the executor numbers no more sets: eager
        return tuple(inputs.items()), tuple(outputs.items())  # (address, dtype, shape tuple) per name, in name order

    def _capture(self, key: tuple | int, what: str, inputs: dict, outputs: dict) -> bool:
        if sum(graph is not None for graph in self._graphs.values()) >= GRAPHS_KEPT:
            self._graphs[key] = None
            return False
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph, pool=self.memory.handle(), stream=self.stream):
                self._forward(what, inputs, outputs)
        except RuntimeError:  # a host sync inside (e.g. HF's MoE block, ROUTED_MOE off): eager from now on
            self._graphs[key] = None
            self.stats["uncapturable"] += 1
            return False
        self._graphs[key] = graph
        self.stats["captured"] += 1
        return True


def _draft_kernels(drafter, device: torch.device) -> bool:
    """Whether the draft graphs run as dflash:: ops (DRAFT_KERNELS): only for a drafter the ops cover."""
    from dflash_trt.export.plugin_graphs import check_plugin_drafter

    if DRAFT_KERNELS is False:
        return False
    try:
        check_plugin_drafter(drafter)  # biased projections have no dflash:: op yet
    except DFlashError:
        return False
    if DRAFT_KERNELS is True:
        return True
    from dflash_trt.runtime.cuda_ops import register_cuda_kernels

    return device.type == "cuda" and register_cuda_kernels()


def _target_attention_kernel(target, device: torch.device) -> bool:
    """Whether the target's decode-sized runs attend through dflash::block_attention (TARGET_ATTENTION_KERNEL)."""
    from dflash_trt.export.bundle import _head_dim

    head_dim = _head_dim(target.config)
    if TARGET_ATTENTION_KERNEL is False or head_dim > BLOCK_ATTENTION_HEAD_DIM:
        return False
    if TARGET_ATTENTION_KERNEL is True:
        return True
    from dflash_trt.runtime.cuda_ops import register_cuda_kernels

    dtype = next(target.model.parameters()).dtype
    mma = head_dim == BLOCK_ATTENTION_MMA[0] and dtype in BLOCK_ATTENTION_MMA[1]
    return mma and TARGET_KERNELS and device.type == "cuda" and register_cuda_kernels()


def _cuda_view(address: int, dtype: torch.dtype, shape: list[int]) -> torch.Tensor:
    class Memory:  # the CUDA array interface (v3) of executor memory; no stream: the caller orders it
        __cuda_array_interface__ = {"shape": tuple(shape), "typestr": _TYPESTR[dtype], "data": (address, False),
                                    "version": 3, "strides": None, "stream": None}

    view = torch.as_tensor(Memory(), device="cuda")
    return view.view(dtype) if view.dtype != dtype else view


class TorchGraphs:
    """The graphs of a torch-backend LLM by name ("target", "draft_context", "draft_block"), as the
    C++ side opens them (csrc/py_graph.h)."""

    def __init__(self, llm, specs: dict[str, dict], device: torch.device, stats: Counter | None = None):
        from dflash_trt.export.graphs import DraftBlockGraph, DraftContextGraph
        from dflash_trt.export.hybrid_slot_graphs import HybridSlotTargetGraph
        from dflash_trt.export.moe import RoutedMoE, export_mlp, fused_moe_refusal, is_sparse_moe, use_moe_op
        from dflash_trt.export.slot_graphs import SlotTargetGraph

        taps = tuple(llm.drafter.config.target_layer_ids) if llm.has_drafter else ()
        target = (HybridSlotTargetGraph if llm.target.is_stateful else SlotTargetGraph)(llm.target, taps)
        attention_kernel = _target_attention_kernel(llm.target, device)
        target.attend = InPlaceSlotAttention(kernel=attention_kernel)
        routed = ROUTED_MOE is True or (ROUTED_MOE == "auto" and device.type == "cuda")
        target.mlps = torch.nn.ModuleList(export_mlp(layer.mlp) if routed else layer.mlp
                                          for layer in target.model.layers)
        self.modules = {"target": target}
        self.draft_kernels: tuple[str, ...] = ()  # the dflash:: ops the draft graphs run
        self.target_kernels: tuple[str, ...] = ("BlockAttention",) if attention_kernel else ()  # and the target's
        routed_layers = [m for m in target.mlps if isinstance(m, RoutedMoE)]
        if TARGET_KERNELS and device.type == "cuda" and (llm.target.is_stateful or routed_layers):
            from dflash_trt.runtime.cuda_ops import moe_kernel_refusal, register_target_kernels

            if register_target_kernels():
                # experts our kernel cannot run (another gate, widths past its limits) stay in standard ops
                fused_moe = bool(routed_layers) and fused_moe_refusal(target) is None and not any(
                    moe_kernel_refusal(m.block.experts.gate_up_proj.shape, m.top_k) for m in routed_layers)
                self.target_kernels += (("GatedDeltaRule",) if llm.target.is_stateful else ()) + \
                    (("MoE",) if fused_moe else ())
                if fused_moe:
                    use_moe_op(target, "dflash")
        if llm.has_drafter:
            if _draft_kernels(llm.drafter, device):
                from dflash_trt.export.plugin_graphs import PluginDraftBlockGraph, PluginDraftContextGraph
                from dflash_trt.runtime.cuda_ops import KERNEL_OPS

                self.modules["draft_context"] = PluginDraftContextGraph(llm.drafter)
                self.modules["draft_block"] = PluginDraftBlockGraph(llm.drafter, llm.target, llm.draft_head)
                self.draft_kernels = KERNEL_OPS
            else:
                self.modules["draft_context"] = DraftContextGraph(llm.drafter)
                self.modules["draft_block"] = DraftBlockGraph(llm.drafter, llm.target, llm.draft_head)
            self.modules["draft_block"].export_logits = draws_drafts(llm)  # as graph_specs lists its outputs
        self.specs, self.device, self.stream = specs, device, None
        self.stats = Counter() if stats is None else stats  # CUDA graphs: captured, replayed, eager runs
        self.memory = GraphMemory()  # every graph's captures share it
        graphed = device.type == "cuda" and not getattr(llm, "enforce_eager", False)  # LLM's enforce_eager
        # HF's sparse MoE block routes on the host (which experts to run): such a target is not captured
        self.graphed = {"target": graphed and not any(is_sparse_moe(m) for m in target.mlps),
                        "draft_context": graphed, "draft_block": graphed}

    def version(self) -> str:
        return torch.__version__

    def use_stream(self, handle: int) -> None:
        self.stream = torch.cuda.ExternalStream(handle, device=self.device)

    def open(self, name: str) -> TorchGraph:
        spec = self.specs[name]
        return TorchGraph(self.modules[name].eval(), [io["name"] for io in spec["inputs"]],
                          [io["name"] for io in spec["outputs"]], self.device, self.stream, self.graphed[name],
                          self.stats, self.memory)


def draws_drafts(llm) -> bool:
    """Whether the LLM's executor draws drafts from the drafter's distribution (draft_rule "drafter"):
    only then does its block pass return what they are drawn from (a GPU's float32 copy of a block's
    logits is no small read at a 152k vocabulary)."""
    return getattr(llm, "draft_rule", "point-mass") != "point-mass"


def graph_specs(llm, dtype: str) -> dict[str, dict]:
    """Each graph's I/O as a slots bundle declares it (a target without a drafter taps no features),
    the block pass's drafts alone unless the executor draws drafts."""
    from dflash_trt.export.bundle import _graph_specs, slot_target_io

    if not llm.has_drafter:
        return {"target": slot_target_io(llm.target, 0, dtype)}
    specs = _graph_specs(llm.target, llm.drafter, dtype, "slots")
    if not draws_drafts(llm):
        specs["draft_block"]["outputs"] = specs["draft_block"]["outputs"][:1]  # draft_tokens
    return specs


def torch_executor(llm, max_batch: int, capacity: int):
    """The core executor of a torch-backend LLM: `max_batch` KV slots of `capacity` tokens on its device."""
    from dflash_trt.export.bundle import model_sections
    from dflash_trt.runtime.ort_executor import slot_config

    device = llm.target.device
    dtype = str(next(llm.target.model.parameters()).dtype).removeprefix("torch.")
    specs = graph_specs(llm, dtype)
    manifest = {"dtype": dtype, "graphs": specs,
                **model_sections(llm.target, llm.drafter if llm.has_drafter else None, llm.tokenizer)}
    draft_rule = getattr(llm, "draft_rule", "point-mass")
    vocab = llm.drafter.draft_vocab if llm.has_drafter and draws_drafts(llm) else None
    config = slot_config(manifest, {name: name for name in specs}, torch.__file__, max_batch, capacity,
                         draft_rule=draft_rule, draft_vocab=None if vocab is None else vocab.tolist())
    core = native_core()
    if device.type == "cuda" and not core.HAS_CUDA_DEVICE:
        raise DFlashError("dflash_trt._core was built without the CUDA headers: reinstall where the CUDA toolkit "
                          "is (bash scripts/setup.sh) to run the torch backend on a GPU")
    graphs = TorchGraphs(llm, specs, device, getattr(llm, "graph_stats", None))
    llm.draft_kernels = graphs.draft_kernels  # which dflash:: ops the draft graphs run (none: standard ops)
    llm.target_kernels = graphs.target_kernels
    return core.PyGraphExecutor(config, graphs, device.type)

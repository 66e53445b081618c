"""`dflash-trt export`: (target, drafter) -> an ONNX bundle directory (DESIGN §4).

The bundle is written into a hidden sibling directory and renamed into place only after every
graph passed `onnx.checker` and bundle.json (with file hashes) was written last, so an interrupted
or failed export never leaves a directory that looks complete.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from importlib import metadata
from pathlib import Path

import onnx
import torch

from dflash_trt.errors import DFlashError
from dflash_trt.export.delta_rule import register_delta_rule_symbolic
from dflash_trt.export.delta_rule_loop import lower_gated_delta_rule
from dflash_trt.export.graphs import DraftBlockGraph, DraftContextGraph, TargetGraph, export_refusal, kv_names
from dflash_trt.export.half_attention import register_half_attention
from dflash_trt.export.hybrid_graphs import (
    HybridTargetGraph,
    hybrid_target_spec,
    linear_attention_shapes,
)
from dflash_trt.export.hybrid_slot_graphs import HybridSlotTargetGraph, hybrid_slot_target_spec
from dflash_trt.export.manifest import DTYPES, FLAVOURS, FORMAT_VERSION, MANIFEST, file_hashes
from dflash_trt.export.moe import is_sparse_moe, use_moe_op
from dflash_trt.export.moe_ops import register_moe_symbolic
from dflash_trt.export.op_library import onnxruntime_refusal, op_library
from dflash_trt.export.plugin_graphs import PluginDraftBlockGraph, PluginDraftContextGraph
from dflash_trt.export.plugin_ops import DOMAIN, OP_VERSION, register_symbolics
from dflash_trt.export.quantize import draft_quant_refusal, min_query_tokens, quant_refusal, quantize_graph
from dflash_trt.export.slot_graphs import CONTRACT, SlotTargetGraph, slot_example_inputs, slot_target_spec
from dflash_trt.export.slot_ops import ORT_DOMAIN, ORT_DOMAIN_VERSION, register_slot_symbolics
from dflash_trt.export.slot_trt_ops import OPSET as TRT_OPSET
from dflash_trt.export.slot_trt_ops import finish_opset24, register_slot_trt_symbolics
from dflash_trt.export.staging import staged_directory
from dflash_trt.export.verify import TOLERANCES, check_graph, inspect_graph
from dflash_trt.export.weights import WeightsAsInputs, attach_weights, module_weights
from dflash_trt.models.draft_vocab import write_draft_vocab
from dflash_trt.models.drafter import DFlashDrafter
from dflash_trt.models.generation_defaults import FILE as GENERATION_FILE
from dflash_trt.models.target import TargetModel, eos_token_ids

OPSET = 17
# slots-trt: the trace writes 13 tokens (slot_example_inputs) into a cache of the static capacity
MIN_CAPACITY = 16
SLOT_FLAVOURS = ("slots", "slots-trt")  # graph contract 2
EXTERNAL_DATA_THRESHOLD = 1024  # bytes: every weight tensor goes to <graph>.onnx.data
VERSIONED = ("dflash-trt", "torch", "transformers", "onnx", "onnxruntime")


def _head_dim(config) -> int:
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def _io(name: str, dtype: str, shape: list) -> dict:
    return {"name": name, "dtype": dtype, "shape": shape}


def _draft_vocab_size(target: TargetModel, drafter: DFlashDrafter) -> int:
    """Rows of the draft head: the draft vocabulary's, or the target's whole vocabulary."""
    return target.vocab_size if drafter.draft_vocab is None else int(drafter.draft_vocab.shape[0])


def _graph_specs(target: TargetModel, drafter: DFlashDrafter, dtype: str = "float32",
                 flavour: str = "portable", capacity: int | None = None,
                 draft_distribution: bool | None = None) -> dict[str, dict]:
    """Names, dtypes and shapes (symbolic dims as strings) of every graph's inputs and outputs.
    K/V caches and features are in the bundle's `dtype`; logits stay float32, ids int64. The slots
    flavours' target has contract 2's I/O (slot_graphs.py), with `capacity` static for slots-trt;
    their draft graphs are the portable ones (`draft_distribution`: exports_draft_distribution's)."""
    t, d = target.config, drafter.config
    tl, dl = target.num_layers, d.num_layers
    t_kv = [target.config.num_key_value_heads, _head_dim(t)]
    d_kv = [d.arch.num_key_value_heads, d.arch.head_dim or d.hidden_size // d.arch.num_attention_heads]
    features = len(d.target_layer_ids) * target.hidden_size
    vocab = target.vocab_size
    hybrid = target.is_stateful
    if flavour in SLOT_FLAVOURS:
        own = slot_target_io(target, features, dtype, capacity)
    else:
        own = hybrid_target_spec(t, vocab, features, dtype) if hybrid else None
    return {
        "target": own or {
            "inputs": [_io("input_ids", "int64", ["batch", "new"]), _io("past_lengths", "int64", ["batch"]),
                       _io("logits_from", "int64", [])]
            + [_io(n, dtype, ["batch", t_kv[0], "past", t_kv[1]]) for n in kv_names("past", tl)],
            "outputs": [_io("logits", "float32", ["batch", "new-logits_from", vocab]), _io("features", dtype, ["batch", "new", features])]
            + [_io(n, dtype, ["batch", t_kv[0], "past+new", t_kv[1]]) for n in kv_names("present", tl)],
        },
        "draft_context": {
            "inputs": [_io("features", dtype, ["batch", "new", features]), _io("positions", "int64", ["batch", "new"])],
            "outputs": [_io(n, dtype, ["batch", d_kv[0], "new", d_kv[1]]) for n in kv_names("context", dl)],
        },
        "draft_block": {
            "inputs": [_io("block_ids", "int64", ["batch", "block"]), _io("context_lengths", "int64", ["batch"])]
            + [_io(n, dtype, ["batch", d_kv[0], "context", d_kv[1]]) for n in kv_names("context", dl)],
            "outputs": [_io("draft_tokens", "int64", ["batch", "block-1"])]
            + (_draft_distribution_io(target, drafter) if exports_draft_distribution(flavour, draft_distribution)
               else []),
        },
    }


def exports_draft_distribution(flavour: str, asked: bool | None = None) -> bool:
    """Whether the draft block graph also returns what the drafter-distribution rule draws from: as
    `asked` (export --draft-distribution; check_flavour refuses it for contract-1 flavours), else by
    flavour: the onnxruntime one does (its cost measured nil on the CPU), slots-trt only when asked, since
    a TensorRT engine writes every output it has at every draft step (float32 logits over the draft
    vocabulary per drafted position) whether the rule runs or not."""
    return flavour == "slots" if asked is None else asked


def _draft_distribution_io(target: TargetModel, drafter: DFlashDrafter) -> list[dict]:
    """A DFlash drafter's logits over its draft vocabulary; a DFlash2 drafter's selector tables: each
    position's score of candidate j after candidate i of the position before, and the candidates'
    draft vocabulary columns (models/dflash2.py)."""
    d = drafter.config
    if d.method != "dflash2":
        return [_io("draft_logits", "float32", ["batch", "block-1", _draft_vocab_size(target, drafter)])]
    k = d.selector_top_k
    return [_io("selector_scores", "float32", ["batch", "block-1", k, k]),
            _io("selector_columns", "int64", ["batch", "block-1", k])]


def slot_target_io(target: TargetModel, features: int, dtype: str, capacity: int | None = None) -> dict:
    """Graph contract 2's target I/O for `target` tapping `features` columns (0: no drafter, for the
    torch runtime only); `capacity` static where given (slots-trt)."""
    capacity = capacity or "capacity"
    if target.is_stateful:
        return hybrid_slot_target_spec(target.config, target.vocab_size, features, dtype, capacity)
    return slot_target_spec(target.num_layers, target.config.num_key_value_heads, _head_dim(target.config),
                            target.vocab_size, features, dtype, capacity)


def model_sections(target: TargetModel, drafter: DFlashDrafter | None, tokenizer) -> dict:
    """bundle.json's "target" and "draft" sections: what an executor knows of the two models (no
    "draft" without a drafter: the torch runtime's plain target)."""
    sections = {
        "target": {
            "model_type": target.model_type, "num_layers": target.num_layers, "hidden_size": target.hidden_size,
            "vocab_size": target.vocab_size, "num_key_value_heads": target.config.num_key_value_heads,
            "head_dim": _head_dim(target.config), "eos_token_ids": list(eos_token_ids(target, tokenizer)),
            **({"layer_types": list(target.config.layer_types),
                "linear_attention": linear_attention_shapes(target.config)} if target.is_stateful else {}),
        },
    }
    if drafter is not None:
        d = drafter.config
        sections["draft"] = {
            "num_layers": d.num_layers, "block_size": d.block_size, "mask_token_id": d.mask_token_id,
            "target_layer_ids": list(d.target_layer_ids),
            "num_key_value_heads": d.arch.num_key_value_heads,
            "head_dim": d.arch.head_dim or d.hidden_size // d.arch.num_attention_heads,
            "draft_vocab_size": _draft_vocab_size(target, drafter),
            # DFlash2's block pass walks its selector over at most block_size - 1 drafts (models/dflash2.py)
            "method": d.method,
        }
    return sections


def _dynamic_axes(spec: dict) -> dict[str, dict[int, str]]:
    return {io["name"]: {i: dim for i, dim in enumerate(io["shape"]) if isinstance(dim, str)}
            for io in spec["inputs"] + spec["outputs"]}


def _example_inputs(spec: dict, vocab_size: int, module: torch.nn.Module) -> tuple[torch.Tensor, ...]:
    """Small random inputs with distinct symbolic sizes, so the trace cannot confuse two axes."""
    if isinstance(module, HybridSlotTargetGraph):
        return module.example_inputs(spec, vocab_size)
    if spec["inputs"][1]["name"] == "cache_lengths":  # the slots target: contract 2
        return slot_example_inputs(module, spec, vocab_size)
    sizes = {"batch": 2, "new": 3, "past": 5, "block": 4, "context": 6}
    generator = torch.Generator().manual_seed(0)
    tensors = []
    for io in spec["inputs"]:
        shape = [sizes[d] if isinstance(d, str) else d for d in io["shape"]]
        if io["name"] == "past_lengths":  # rows of different lengths: the masks are traced too
            tensors.append(torch.tensor([sizes["past"], 2]))
        elif io["name"] == "context_lengths":
            tensors.append(torch.tensor([sizes["context"], 2]))
        elif io["name"] == "logits_from":
            tensors.append(torch.tensor(1))
        elif io["name"] in ("input_ids", "block_ids"):  # valid ids, however small the vocabulary
            tensors.append(torch.randint(0, vocab_size, shape, generator=generator))
        elif io["dtype"] == "int64":
            tensors.append(torch.randint(0, 8, shape, generator=generator))
        else:
            tensors.append(torch.randn(shape, generator=generator).to(getattr(torch, io["dtype"])))
    if spec["inputs"][1]["name"] == "past_lengths":  # the target graph
        tensors[3:] = _own_cache(module, tensors[3:], vocab_size, generator)
    return tuple(tensors)


def _own_cache(target: torch.nn.Module, like: list[torch.Tensor], vocab_size: int, generator) -> list[torch.Tensor]:
    """K/V the target graph computed itself for random tokens (a prefill), shaped like the random `like`.
    Random K/V put the queries where no real cache does: with them, on SmolLM2-135M, float16 PyTorch
    and onnxruntime differed by up to 2 on logits and float32 ones by 1.5e-3 (measured), so the check
    could not tell rounding from a wrong graph; with its own cache, 0.07 and 1e-4."""
    batch, _, past, _ = like[0].shape
    ids = torch.randint(0, vocab_size, (batch, past), generator=generator)
    if isinstance(target, HybridTargetGraph):  # its linear layers' states come from the same prefill
        with torch.no_grad():
            return target.prefill_caches(ids)
    empty = (t[:, :, :0] for t in like)
    with torch.no_grad():
        _, _, *cache = target(ids, torch.zeros(batch, dtype=torch.long), torch.tensor(past - 1), *empty)
    return cache


def _export_graph(module: torch.nn.Module, spec: dict, path: Path, check: bool, plugin: bool, vocab_size: int,
                  dtype: str = "float32", slots: str | None = None) -> dict:
    """Export, move weights to external data, run onnx.checker; then polygraphy when `check` and
    onnxruntime can run the graph (else the summary says why it was skipped). `slots` (a contract-2
    target) is its flavour: "slots" holds com.microsoft::GroupQueryAttention, "slots-trt" standard
    TensorScatter + Attention at opset 24 (slot_trt_ops.py); both are checked with each cache output
    bound to its input."""
    inputs = _example_inputs(spec, vocab_size, module)
    register_half_attention(OPSET)
    register_delta_rule_symbolic(OPSET)
    hybrid = isinstance(module, HybridTargetGraph)
    if plugin:
        register_symbolics(OPSET)
    register_moe_symbolic(OPSET)
    if slots == "slots":
        register_slot_symbolics(OPSET)
    elif slots == "slots-trt":
        register_slot_trt_symbolics(OPSET, decomposed=hybrid)
    domains = {**({DOMAIN: OP_VERSION} if plugin or hybrid else {}),
               **({ORT_DOMAIN: ORT_DOMAIN_VERSION} if slots == "slots" else {})} or None
    with warnings.catch_warnings(), torch.no_grad():
        # The TorchScript exporter is deprecated in favour of torch.export, but it traces these
        # flat-I/O modules with symbolic dims reliably; revisit when the dynamo path handles HF RoPE.
        warnings.simplefilter("ignore")
        # the weights go in as graph inputs and are streamed to disk after (export/weights.py)
        weights = module_weights(module)
        torch.onnx.export(
            WeightsAsInputs(module.eval(), len(inputs)), (*inputs, *weights.values()), str(path),
            input_names=[i["name"] for i in spec["inputs"]] + list(weights),
            output_names=[o["name"] for o in spec["outputs"]], dynamic_axes=_dynamic_axes(spec),
            opset_version=OPSET, dynamo=False, custom_opsets=domains,
        )
    model = onnx.load(str(path))
    attach_weights(model, weights, path.with_name(path.name + ".data"), EXTERNAL_DATA_THRESHOLD)
    if hybrid and not plugin:  # the linear layers' recurrences as standard-op Loops (delta_rule_loop.py)
        lower_gated_delta_rule(model, DOMAIN)
    if slots == "slots-trt":
        model = finish_opset24(model)
    _declare_io_shapes(model, spec)
    onnx.save_model(model, str(path))  # the graph; its weights are already in <graph>.onnx.data
    # full_check runs ONNX shape inference, which knows nothing of the dflash ops (it passes
    # com.microsoft::GroupQueryAttention, whose outputs keep the declared shapes).
    onnx.checker.check_model(str(path), full_check=not plugin)
    summary = inspect_graph(path, spec)
    refusal = onnxruntime_refusal("plugin" if plugin else "portable", dtype)
    if check and refusal:
        summary["polygraphy_vs_pytorch"] = f"skipped: {refusal}"
    elif check:
        summary["polygraphy_vs_pytorch"] = check_graph(
            path, module, inputs, [i["name"] for i in spec["inputs"]], [o["name"] for o in spec["outputs"]],
            TOLERANCES[dtype], plugin=plugin, aliases=_cache_aliases(spec) if slots else None)
    return summary


def _cache_aliases(spec: dict) -> dict[str, str]:
    """Contract 2: each cache output -> the input the runtime binds to the same buffer."""
    return {o["name"]: o["name"].replace("_out_", "_") for o in spec["outputs"] if o["name"].startswith("cache_")}


@contextmanager
def _parameters_in(modules: list[torch.nn.Module], dtype: torch.dtype) -> Iterator[None]:
    """The graphs' weights in `dtype` while they are traced; the caller's models as they were after.
    Buffers keep their dtype: HF computes RoPE from float32 inverse frequencies and casts after."""
    saved = [(p, p.data) for p in {id(p): p for m in modules for p in m.parameters()}.values()]
    try:
        for parameter, data in saved:
            parameter.data = data.to(dtype)
        yield
    finally:
        for parameter, data in saved:
            parameter.data = data


def _declare_io_shapes(model, spec: dict) -> None:
    """Write the contract's shapes onto the graph I/O: where the tracer could not prove a dim static
    (e.g. head_dim after a reshape) it invents a symbol, and engine builders need the number."""
    for kind, values in (("inputs", model.graph.input), ("outputs", model.graph.output)):
        declared = {io["name"]: io["shape"] for io in spec[kind]}
        for value in values:
            dims = value.type.tensor_type.shape.dim
            assert len(dims) == len(declared[value.name]), f"{value.name}: rank differs from the contract"
            for dim, want in zip(dims, declared[value.name], strict=True):
                if isinstance(want, str):
                    dim.dim_param = want
                else:
                    dim.dim_value = int(want)


def _versions() -> dict[str, str | None]:
    found = {}
    for name in VERSIONED:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    return found


def check_flavour(flavour: str, check: bool = True, dtype: str = "float32", capacity: int | None = None,
                  draft_distribution: bool | None = None) -> None:
    if flavour not in FLAVOURS:
        raise DFlashError(f"unknown flavour '{flavour}'; choose one of {', '.join(FLAVOURS)}")
    if draft_distribution and flavour not in SLOT_FLAVOURS:
        raise DFlashError(f"--draft-distribution is for --flavour slots or slots-trt (the C++ executors run the "
                          f"drafter rule); {flavour}-flavour graphs return draft tokens only")
    if flavour == "slots-trt" and capacity is None:
        raise DFlashError("--flavour slots-trt needs --capacity N: the KV slots' size in tokens is static in "
                          "its graphs (TensorRT's KV-cache update requires it)")
    if flavour != "slots-trt" and capacity is not None:
        raise DFlashError(f"--capacity is for --flavour slots-trt only; {flavour}-flavour graphs size their "
                          f"caches at run time")
    if capacity is not None and (isinstance(capacity, bool) or not isinstance(capacity, int)
                                 or capacity < MIN_CAPACITY):
        raise DFlashError(f"--capacity must be a whole number of tokens >= {MIN_CAPACITY}, not {capacity!r}")
    if dtype not in DTYPES.values():
        raise DFlashError(f"unknown dtype '{dtype}'; choose one of {', '.join(DTYPES.values())}")
    if flavour == "plugin" and check and onnxruntime_refusal("plugin", dtype) is None:
        op_library()  # checking plugin graphs runs them: the op library must be built first


def export_bundle(target: TargetModel, drafter: DFlashDrafter, tokenizer, out: Path, flavour: str = "portable",
                  force: bool = False, check: bool = True, progress: Callable[[str], None] = lambda step: None,
                  dtype: str = "float32", capacity: int | None = None, quant: str | None = None,
                  draft_quant: str | None = None, draft_distribution: bool | None = None) -> Path:
    """Write the bundle with weights, K/V caches and features in `dtype` (float32, float16, bfloat16);
    `progress` is called after each of its steps (3 graphs, tokenizer, manifest). `capacity`: the
    static KV slot size in tokens of a slots-trt target (that flavour only, and required there).
    `quant` (int4, int4-awq, fp8, nvfp4): the target's weights quantized after its graph is checked
    (export/quantize.py; int4-awq first rescales them with ModelOpt's AWQ, export/awq.py);
    `draft_quant` (int4, fp8, nvfp4): the drafter's (its drafts are verified: lossless whatever their numerics).
    `draft_distribution`: see exports_draft_distribution (None: the flavour's default)."""
    check_flavour(flavour, check, dtype, capacity, draft_distribution)
    sparse = any(is_sparse_moe(m) for m in target.model.modules())
    refusal = (quant_refusal(quant, flavour, dtype, sparse, target.model_type)
               or draft_quant_refusal(draft_quant, flavour, dtype))
    if refusal:
        raise DFlashError(refusal)
    out = Path(out)
    if out.exists() and not force:
        raise DFlashError(f"{out} already exists; pass --force to replace it")
    d = drafter.config
    hybrid = target.is_stateful
    plugin, slots = flavour == "plugin", flavour in SLOT_FLAVOURS
    refusal = export_refusal(target.model_type)
    if refusal:
        raise DFlashError(refusal)
    rows = min_query_tokens(quant, flavour)  # quantized activations need two query rows per step
    specs = _graph_specs(target, drafter, dtype, flavour, capacity, draft_distribution)
    target_graph = {(False, False): TargetGraph, (False, True): HybridTargetGraph,
                    (True, False): SlotTargetGraph, (True, True): HybridSlotTargetGraph}[slots, hybrid]
    if quant == "int4-awq":  # the same function, weights rescaled to round better (drafts read the embeddings only)
        from dflash_trt.export.awq import awq_folded

        progress("awq scales")
        graph_target = awq_folded(target)
    else:
        graph_target = target
    modules = {
        "target": target_graph(graph_target, tuple(d.target_layer_ids)),
        "draft_context": PluginDraftContextGraph(drafter) if plugin else DraftContextGraph(drafter),
        "draft_block": PluginDraftBlockGraph(drafter, target) if plugin else DraftBlockGraph(drafter, target),
    }
    modules["draft_block"].export_logits = exports_draft_distribution(flavour, draft_distribution)
    if flavour == "slots":  # the onnxruntime flavour: its own MoE kernel (export/moe.py), RoPE inside GQA
        use_moe_op(modules["target"], "onnxruntime")
        modules["target"].rope_in_attention = not hybrid
    if plugin:  # our dflash::MoE (plugins/moe)
        use_moe_op(modules["target"], "dflash")
    # a plugin target graph holds dflash ops where its recurrences or routed experts are ops of ours
    target_ops = hybrid or sparse
    checks = {}
    with staged_directory(out) as tmp:
        with _parameters_in(list(modules.values()), getattr(torch, dtype)):
            for name, module in modules.items():
                checks[name] = _export_graph(module, specs[name], tmp / f"{name}.onnx", check,
                                             plugin and (name != "target" or target_ops), target.vocab_size, dtype,
                                             flavour if slots and name == "target" else None)
                progress(f"{name}.onnx")
        quantized = quantize_graph(tmp / "target.onnx", quant, flavour, EXTERNAL_DATA_THRESHOLD) if quant else None
        draft_quantized = None  # recorded: draft_block's (draft_context's is its few K/V projections)
        if draft_quant:
            quantize_graph(tmp / "draft_context.onnx", draft_quant, flavour, EXTERNAL_DATA_THRESHOLD)
            draft_quantized = quantize_graph(tmp / "draft_block.onnx", draft_quant, flavour, EXTERNAL_DATA_THRESHOLD)
        if drafter.draft_vocab is not None and modules["draft_block"].export_logits:
            write_draft_vocab(tmp, drafter.draft_vocab, "the drafter's draft vocabulary: draft vocabulary column "
                              "i (draft_logits, selector_columns) is target id token_ids[i]")
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
        # the sampling defaults the model's creator recommends (LLM.from_bundle and serve apply them, as vLLM
        # does): written as found, without transformers' checks, which may refuse a published config
        (tmp / GENERATION_FILE).write_text(target.model.generation_config.to_json_string(use_diff=True))
        progress("tokenizer")
        manifest = {
            "format_version": FORMAT_VERSION,
            "contract": CONTRACT if slots else 1,  # graph I/O contract; bundles without the key are 1
            "flavour": flavour,
            "dtype": dtype,
            **({"quant": quantized} if quantized else {}),  # the target's weights; absent: all in `dtype`
            **({"draft_quant": draft_quantized} if draft_quantized else {}),  # the drafter's
            **({"min_query_tokens": rows} if rows > 1 else {}),  # ExecutorConfig.min_query_tokens
            "opset": OPSET,
            # slots-trt: the target graph alone is at opset 24 (TensorScatter), with a static capacity
            **({"target_opset": TRT_OPSET, "capacity": capacity} if flavour == "slots-trt" else {}),
            "custom_ops": {"domain": DOMAIN, "version": OP_VERSION,
                           "ops": ["InjectKV", "BlockAttention"] + (["GatedDeltaRule"] if hybrid else [])
                           + (["MoE"] if sparse else [])} if plugin else None,
            "graphs": {name: {"file": f"{name}.onnx", **spec} for name, spec in specs.items()},
            **model_sections(target, drafter, tokenizer),
            "checks": {
                "onnx.checker": "passed" if not plugin else "passed (no shape inference through dflash ops)",
                # polygraphy inspect model: each graph's I/O names, dtypes and shapes equal the manifest's
                "polygraphy_inspect": {name: {k: v for k, v in c.items() if k != "polygraphy_vs_pytorch"}
                                       for name, c in checks.items()},
                "polygraphy_vs_pytorch": {**TOLERANCES.get(dtype, {}),
                                          **{name: c["polygraphy_vs_pytorch"] for name, c in checks.items()}}
                if check else None,
            },
            "versions": _versions(),
            "files": file_hashes(tmp),
        }
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")  # last: marks the bundle complete
        progress(MANIFEST)
    return out


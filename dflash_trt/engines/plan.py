"""`dflash-trt build --dry-run`: what a (target, drafter) pair will cost, from config.json alone.

Parameter counts follow each family's HF modules (embeddings, attention with Qwen3-Next/3.5's
gated query, Gated DeltaNet linear attention, dense MLP or MoE experts with router and shared
expert, norms) and equal sum(p.numel()) of the model HF builds from the same config; weights HF
does not load (Qwen3.5's vision tower, multi-token-prediction layers) are not counted.

Memory is what this runtime holds: the three graphs' weights (draft_block carries its own copy of
the target's embeddings and LM head), and per request the target's and drafter's K/V for
--max-seq-len tokens on every attention layer (slot caches are full length, sliding layers too),
the linear-attention layers' conv and recurrent states twice (the slot's, and a verify's result until
its commit), and what each of a verify block's positions fed those layers (a commit that keeps part
of the block rebuilds the states from them: exact rollback without re-feeding tokens or keeping a
state per position). A margin of 1 GiB plus 10 % covers activations, workspace and the CUDA context.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from dflash_trt.engines.config import BuildConfig
from dflash_trt.errors import DFlashError
from dflash_trt.export.graphs import export_refusal
from dflash_trt.export.hybrid_graphs import delta_input_width, linear_attention_shapes
from dflash_trt.models.draft_config import DraftConfig

GIB = 1024**3
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}
# export --quant: a matmul weight's bytes with its scales (int4: a float32 per 32; fp8: one float32 per
# output channel; nvfp4: a float8 per 16, export/float_formats.py)
QUANT_BYTES_PER_WEIGHT = {"int4": 0.5 + 4 / 32, "fp8": 1.0, "nvfp4": 0.5 + 1 / 16}  # int4-awq: int4's
# An export's peak RSS over the weights it holds (the target and drafter, in the bundle's dtype), and
# its seconds per GB of them on our 2-core VM: the larger of the two measured by scripts/real_width_bench.py
# at Qwen3.5-35B-A3B's and Qwen3-30B-A3B's widths (docs/bench/real-width-*.json; float16 taken as bfloat16).
EXPORT_PEAK_PER_WEIGHT_BYTE = {"float32": 1.27, "float16": 1.33, "bfloat16": 1.33}
EXPORT_SECONDS_PER_GB = {"float32": 2.9, "float16": 5.4, "bfloat16": 5.4}
# A TensorRT-RTX build's peak RSS over the same weights, and its seconds per GB of them: measured on a
# bfloat16 slots-trt bundle at Qwen3.5-35B-A3B's widths (docs/bench/real-width-qwen3.5-35b-a3b-engines.json:
# the parsed network's weights plus the builder's own copy; the plan streams into its file).
BUILD_PEAK_PER_WEIGHT_BYTE = 2.11
BUILD_SECONDS_PER_GB = 7.3
SHORT = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}
MARGIN_BYTES = GIB
MARGIN_FRACTION = 0.10
GATED_QUERY = frozenset({"qwen3_next", "qwen3_5_text", "qwen3_5_moe_text"})  # q_proj also yields a gate
QK_NORM = GATED_QUERY | {"qwen3", "qwen3_moe"}
GRAPHS = ("target", "draft_context", "draft_block")


def _head_dim(config) -> int:
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def layer_kinds(config) -> list[str]:
    """'attention' or 'linear' per layer (sliding-window layers hold K/V like full ones)."""
    types = getattr(config, "layer_types", None) or ["full_attention"] * config.num_hidden_layers
    return ["linear" if t == "linear_attention" else "attention" for t in types]


def _attention(config, model_type: str) -> int:
    h, heads, kv, d = config.hidden_size, config.num_attention_heads, config.num_key_value_heads, _head_dim(config)
    q = heads * d * (2 if model_type in GATED_QUERY else 1)
    count = h * q + 2 * h * kv * d + heads * d * h
    if model_type == "qwen2":  # q, k and v always carry a bias, o never
        count += heads * d + 2 * kv * d
    elif getattr(config, "attention_bias", False):
        count += q + 2 * kv * d + h
    return count + (2 * d if model_type in QK_NORM else 0)


def _linear_attention(config) -> int:
    """Gated DeltaNet: q/k/v/z and b/a projections, a depthwise causal conv, decay and norm, out."""
    h, v_heads = config.hidden_size, config.linear_num_value_heads
    k_dim = config.linear_num_key_heads * config.linear_key_head_dim
    v_dim = v_heads * config.linear_value_head_dim
    conv_channels = 2 * k_dim + v_dim
    return (h * (2 * k_dim + 2 * v_dim) + h * 2 * v_heads + conv_channels * config.linear_conv_kernel_dim
            + 2 * v_heads + config.linear_value_head_dim + v_dim * h)


def _sparse(config, layer: int) -> bool:
    """HF's rule: an MoE block unless the layer is listed dense or off the sparse step."""
    experts = getattr(config, "num_experts", 0) or 0
    return (experts > 0 and layer not in (getattr(config, "mlp_only_layers", None) or [])
            and (layer + 1) % (getattr(config, "decoder_sparse_step", 1) or 1) == 0)


def moe_layers(config) -> int:
    """How many of the target's layers hold a sparse MoE block (from its config)."""
    return sum(_sparse(config, i) for i in range(config.num_hidden_layers))


def _mlp(h: int, inner: int, bias: bool = False) -> int:
    return 3 * h * inner + (2 * inner + h if bias else 0)


def target_parameters(config) -> dict[str, int]:
    """Parameters by part, plus 'total' and 'active' (per token: top-k experts, not all)."""
    model_type, h, v = config.model_type, config.hidden_size, config.vocab_size
    parts = dict.fromkeys(("embeddings", "attention", "linear attention", "mlp", "moe experts", "moe routers",
                           "shared experts", "norms", "lm head"), 0)
    parts["embeddings"] = v * h
    parts["lm head"] = 0 if getattr(config, "tie_word_embeddings", False) else v * h
    parts["norms"] = h * (2 * config.num_hidden_layers + 1)
    idle_experts = 0
    for layer, kind in enumerate(layer_kinds(config)):
        if kind == "linear":
            parts["linear attention"] += _linear_attention(config)
        else:
            parts["attention"] += _attention(config, model_type)
        if not _sparse(config, layer):
            parts["mlp"] += _mlp(h, config.intermediate_size, getattr(config, "mlp_bias", False))
            continue
        experts, inner = config.num_experts, config.moe_intermediate_size
        parts["moe routers"] += experts * h
        parts["moe experts"] += experts * _mlp(h, inner)
        idle_experts += (experts - config.num_experts_per_tok) * _mlp(h, inner)
        shared = getattr(config, "shared_expert_intermediate_size", 0) or 0
        if shared:  # an always-on expert with a sigmoid gate
            parts["shared experts"] += _mlp(h, shared) + h
    parts["total"] = sum(parts.values())
    parts["active"] = parts["total"] - idle_experts
    return parts


def drafter_parameters(draft: DraftConfig) -> int:
    """The drafter's own weights (it borrows the target's embeddings and LM head)."""
    arch, h = draft.arch, draft.hidden_size
    layer = _attention(arch, "qwen3") + _mlp(h, arch.intermediate_size) + 2 * h
    if draft.method == "dflash2":  # two convolutions per layer: base kernels and their projection
        layer += 2 * (2 * draft.conv_kernel_size * h + h * 2 * draft.conv_kernel_size * (h // draft.conv_group_size))
    selector = 0 if draft.method == "dflash" else (2 * draft.vocab_size + h) * draft.selector_rank  # codebooks, projection
    return len(draft.target_layer_ids) * h * h + 2 * h + draft.num_layers * layer + selector  # fc, norms, layers


def kv_bytes_per_token(config, dtype: str) -> int:
    layers = layer_kinds(config).count("attention")
    return layers * 2 * config.num_key_value_heads * _head_dim(config) * DTYPE_BYTES[dtype]


def draft_kv_bytes_per_token(draft: DraftConfig, dtype: str) -> int:
    arch = draft.arch
    return draft.num_layers * 2 * arch.num_key_value_heads * _head_dim(arch) * DTYPE_BYTES[dtype]


def state_bytes_per_request(config, dtype: str) -> int:
    """Per linear-attention layer: the conv's last kernel-1 inputs in the graphs' dtype and the
    [v_heads, k_dim, v_dim] recurrent state in float32, as the exported graphs keep them
    (export/hybrid_graphs.py: a running recurrence is not rounded to half precision per token)."""
    layers = layer_kinds(config).count("linear")
    if not layers:
        return 0
    k_dim = config.linear_num_key_heads * config.linear_key_head_dim
    v_dim = config.linear_num_value_heads * config.linear_value_head_dim
    conv = (2 * k_dim + v_dim) * (config.linear_conv_kernel_dim - 1)
    recurrent = config.linear_num_value_heads * config.linear_key_head_dim * config.linear_value_head_dim
    return layers * (conv * DTYPE_BYTES[dtype] + recurrent * DTYPE_BYTES["float32"])


def position_input_bytes(config, dtype: str) -> int:
    """Per linear-attention layer, what one verified position fed it and a commit rebuilds the states
    from (csrc/state_rebuild.h): its conv input column in the graphs' dtype, and its raw key, value,
    decay and strength in float32."""
    layers = layer_kinds(config).count("linear")
    if not layers:
        return 0
    shapes = linear_attention_shapes(config)
    return layers * (shapes["conv_dim"] * DTYPE_BYTES[dtype] + delta_input_width(shapes) * DTYPE_BYTES["float32"])


@dataclass(frozen=True)
class Plan:
    target: str
    model_type: str
    draft: str | None
    draft_method: str | None  # DraftConfig.describe()
    engine: str
    flavour: str
    dtype: str
    max_batch: int
    max_seq_len: int
    block_size: int
    parameters: dict[str, int]
    draft_parameters: int
    borrowed: int  # the target's embeddings and LM head, copied into draft_block
    kv_per_token: int
    draft_kv_per_token: int
    states: int
    position_inputs: int
    layers: dict[str, int]
    export_refusal: str | None
    gpu_memory_gib: float | None

    def weight_bytes(self, dtype: str) -> int:
        return (self.parameters["total"] + self.draft_parameters + self.borrowed) * DTYPE_BYTES[dtype]

    def quantized_target_bytes(self, quant: str) -> tuple[int, int]:
        """target.onnx's weights (export --quant, float32) -> (bytes, float32 bytes): every matmul
        weight (a tied LM head is its own transposed copy in the graph) in `quant`'s bits and scales
        (export/quantize.py; fp8's per-channel scales are under 1 %); embeddings and norms stay float32."""
        p = self.parameters
        lm_head = p["lm head"] or p["embeddings"]
        matmuls = p["attention"] + p["linear attention"] + p["mlp"] + p["shared experts"] + lm_head
        floats = (p["total"] + lm_head - p["lm head"] - matmuls) * 4
        return int(matmuls * QUANT_BYTES_PER_WEIGHT[quant]) + floats, matmuls * 4 + floats

    @property
    def per_request(self) -> int:
        """K/V for max_seq_len tokens, states (the slot's and a verify's), each verify position's inputs."""
        return ((self.kv_per_token + self.draft_kv_per_token) * self.max_seq_len + 2 * self.states
                + self.position_inputs * self.block_size)

    @property
    def needed(self) -> tuple[int, int]:
        """(bytes for weights and max_batch requests, margin)."""
        total = self.weight_bytes(self.dtype) + self.max_batch * self.per_request
        return total, int(MARGIN_BYTES + MARGIN_FRACTION * total)


def export_peak_bytes(parameters: int, dtype: str) -> float:
    """The memory an export of `parameters` weights (target and drafter) in `dtype` peaks at."""
    return parameters * DTYPE_BYTES[dtype] * EXPORT_PEAK_PER_WEIGHT_BYTE[dtype]


def build_peak_bytes(weight_bytes: float) -> float:
    """The memory a TensorRT-RTX build of bundles holding `weight_bytes` of weights peaks at."""
    return weight_bytes * BUILD_PEAK_PER_WEIGHT_BYTE


def machine_memory() -> int:
    """This machine's physical memory, in bytes."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def pair_weight_bytes(config, draft: DraftConfig | None, dtype: str) -> int:
    """The weights of the target and the drafter in `dtype`, from their configs."""
    return (target_parameters(config)["total"] + (drafter_parameters(draft) if draft else 0)) * DTYPE_BYTES[dtype]


def export_memory_refusal(config, draft: DraftConfig | None, dtype: str) -> str | None:
    """One line when exporting this pair would need more memory than the machine has, else None:
    from the two configs, before any weights load."""
    parameters = target_parameters(config)["total"] + (drafter_parameters(draft) if draft else 0)
    need, have = export_peak_bytes(parameters, dtype), machine_memory()
    if need <= have:
        return None
    return (f"export: the {SHORT[dtype]} weights ({_bytes(parameters * DTYPE_BYTES[dtype])}) need about "
            f"{_bytes(need)} of memory to export, and this machine has {_bytes(have)}")


def build_memory_refusal(weight_bytes: float, engine: str) -> str | None:
    """One line when a TensorRT-RTX build of `weight_bytes` of weights would need more memory than the
    machine has, else None (other engines' builds are not measured: no refusal)."""
    need, have = build_peak_bytes(weight_bytes), machine_memory()
    if engine != "tensorrt-rtx" or need <= have:
        return None
    return (f"build: TensorRT-RTX engines of {_bytes(weight_bytes)} of weights need about {_bytes(need)} of memory "
            f"to build, and this machine has {_bytes(have)}")


def make_plan(target: str, config, draft: str | None, draft_config: DraftConfig | None, engine: str, flavour: str,
              dtype: str, max_batch: int, max_seq_len: int, block_size: int | None,
              export_refusal: str | None, gpu_memory_gib: float | None) -> Plan:
    kinds = layer_kinds(config)
    tied = getattr(config, "tie_word_embeddings", False)
    return Plan(
        target=target, model_type=config.model_type, draft=draft,
        draft_method=draft_config.describe() if draft_config else None, engine=engine, flavour=flavour, dtype=dtype,
        max_batch=max_batch, max_seq_len=max_seq_len,
        block_size=block_size or (draft_config.block_size if draft_config else 1),
        parameters=target_parameters(config),
        draft_parameters=drafter_parameters(draft_config) if draft_config else 0,
        borrowed=(1 if tied else 2) * config.vocab_size * config.hidden_size if draft_config else 0,
        kv_per_token=kv_bytes_per_token(config, dtype),
        draft_kv_per_token=draft_kv_bytes_per_token(draft_config, dtype) if draft_config else 0,
        states=state_bytes_per_request(config, dtype),
        position_inputs=position_input_bytes(config, dtype),
        layers={"attention": kinds.count("attention"), "linear": kinds.count("linear"),
                "moe": moe_layers(config)},
        export_refusal=export_refusal, gpu_memory_gib=gpu_memory_gib,
    )


def plan_pair(target: str, draft: str | None, config: BuildConfig, flavour: str,
              gpu_memory_gib: float | None) -> Plan:
    """Read the pair's config.json files (nothing else) and plan the build `config` describes."""
    from dflash_trt.models.checkpoints import check_pair_configs, read_target_config
    from dflash_trt.models.embedded import default_drafter

    if gpu_memory_gib is not None and gpu_memory_gib <= 0:
        raise DFlashError(f"--gpu-memory must be a positive number of GiB, got {gpu_memory_gib:g}")
    draft = draft or default_drafter(target)
    if draft:
        target_config, draft_config = check_pair_configs(target, draft)
    else:
        (_, target_config), draft_config = read_target_config(target), None
    dtype = config.dtype or "float32"
    return make_plan(target, target_config, None if draft is None else str(draft), draft_config, config.engine,
                     flavour, dtype, config.max_batch, config.max_seq_len, config.block_size,
                     export_refusal(target_config.model_type), gpu_memory_gib)


def _count(n: int) -> str:
    for unit, size in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= size:
            return f"{n / size:.2f} {unit}"
    return str(n)


def _bytes(n: float) -> str:
    for unit, size in (("GiB", GIB), ("MiB", 1024**2), ("KiB", 1024)):
        if n >= size:
            return f"{n / size:.2f} {unit}"
    return f"{int(n)} B"


def render(plan: Plan) -> str:
    """The table a user reads before downloading the weights."""
    p, d = plan.parameters, SHORT[plan.dtype]
    layers = plan.layers
    lines = [
        f"plan (dry run: nothing downloaded beyond config.json, nothing written): target {plan.target} "
        f"({plan.model_type}: {layers['attention']} attention + {layers['linear']} linear-attention layers, "
        f"{layers['moe']} MoE), drafter {plan.draft or 'none given'}"
        f"{f' ({plan.draft_method})' if plan.draft_method else ''}",
        f"graphs: {', '.join(g + '.onnx' for g in GRAPHS)} ({plan.flavour} flavour, {d}) -> "
        f"{len(GRAPHS)} {plan.engine} engines; max batch {plan.max_batch}, max seq len {plan.max_seq_len}, "
        f"block {plan.block_size}",
        plan.export_refusal or "export: supported",
        "parameters:",
    ]
    for part in ("embeddings", "attention", "linear attention", "mlp", "moe experts", "moe routers",
                 "shared experts", "norms", "lm head"):
        if p[part]:
            lines.append(f"  {part:<24}{_count(p[part]):>12}")
    lines.append(f"  {'target total':<24}{_count(p['total']):>12}  ({p['total']:,})")
    if p["active"] != p["total"]:
        lines.append(f"  {'target active per token':<24}{_count(p['active']):>12}")
    if plan.draft_parameters:
        lines.append(f"  {'drafter':<24}{_count(plan.draft_parameters):>12}  ({plan.draft_parameters:,}; "
                     f"draft_block also holds {_count(plan.borrowed)} of the target's embeddings and LM head)")
    lines.append("weights of the three graphs:  " + "  ".join(f"{SHORT[t]} {_bytes(plan.weight_bytes(t))}" for t in DTYPE_BYTES))
    if plan.flavour in ("slots", "slots-trt") and not p["moe experts"]:
        fp32 = plan.quantized_target_bytes("int4")[1]
        lines.append("target.onnx with export --quant (matmul weights quantized, embeddings and norms float32): "
                     + ", ".join(f"{quant} about {_bytes(plan.quantized_target_bytes(quant)[0])}"
                                 for quant in QUANT_BYTES_PER_WEIGHT)
                     + f" (float32: {_bytes(fp32)}; fp8 and nvfp4 for --flavour slots-trt)")
    lines.append(f"K/V per token ({d}): target {_bytes(plan.kv_per_token)}, drafter {_bytes(plan.draft_kv_per_token)}")
    lines.append(f"per request at {plan.max_seq_len} tokens: K/V "
                 f"{_bytes((plan.kv_per_token + plan.draft_kv_per_token) * plan.max_seq_len)}"
                 + (f", conv + recurrent states {_bytes(plan.states)} (twice: the slot's and a verify's), the inputs of "
                    f"{plan.block_size} verify positions {_bytes(plan.position_inputs * plan.block_size)}"
                    if plan.states else "")
                 + f"; total {_bytes(plan.per_request)}")
    held = (p["total"] + plan.draft_parameters) * DTYPE_BYTES[plan.dtype]
    peak, have = export_peak_bytes(p["total"] + plan.draft_parameters, plan.dtype), machine_memory()
    lines.append(f"export ({d}): peak memory about {_bytes(peak)} ({EXPORT_PEAK_PER_WEIGHT_BYTE[plan.dtype]:g}x the "
                 f"{_bytes(held)} of weights it holds, measured), about {held / 1e9 * EXPORT_SECONDS_PER_GB[plan.dtype]:.0f} s "
                 f"on a 2-core VM; this machine has {_bytes(have)}: "
                 + ("fits" if peak <= have else f"does NOT fit (short by {_bytes(peak - have)})"))
    if plan.engine == "tensorrt-rtx":
        peak = build_peak_bytes(held)
        lines.append(f"build (tensorrt-rtx): peak memory about {_bytes(peak)} ({BUILD_PEAK_PER_WEIGHT_BYTE:g}x the weights, "
                     f"measured), about {held / 1e9 * BUILD_SECONDS_PER_GB:.0f} s on a 2-core VM: "
                     + ("fits" if peak <= have else f"does NOT fit (short by {_bytes(peak - have)})"))
    total, margin = plan.needed
    need = f"needs {_bytes(total)} (weights + {plan.max_batch} x request) + margin {_bytes(margin)} = {_bytes(total + margin)}"
    if plan.gpu_memory_gib is None:
        lines.append(f"memory: {need}; pass --gpu-memory GiB to check a GPU")
    else:
        have = plan.gpu_memory_gib * GIB
        verdict = "fits" if total + margin <= have else f"does NOT fit (short by {_bytes(total + margin - have)})"
        lines.append(f"memory: {need}: {verdict} in {plan.gpu_memory_gib:g} GiB")
    return "\n".join(lines)

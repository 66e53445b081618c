"""Our CUDA kernels as the CUDA implementations of the `dflash::` torch custom ops (export/plugin_ops.py,
export/delta_rule.py, export/moe_ops.py), so that on a GPU the torch backend runs the kernels TensorRT runs
as plugins: InjectKV for the draft context, BlockAttention for the draft block, GatedDeltaRule for a hybrid
target's linear-attention layers, MoE for a sparse target's routed experts. The kernels come from the plugin
library (`dflash_trt/_ops/libdflash_trt_plugins.so`, scripts/build_plugins.sh) through its C entry points
(plugins/common/kernel_api.cpp); each call launches on PyTorch's current stream, so it is ordered with
the rest of the graph and captured into a CUDA graph like any other kernel.

Without a GPU or the library nothing is registered and the ops keep their PyTorch reference bodies.
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import torch

from dflash_trt.errors import DFlashError

LIBRARY = Path(__file__).resolve().parent.parent / "_ops" / "libdflash_trt_plugins.so"
KERNEL_OPS = ("InjectKV", "BlockAttention")  # the draft graphs'
# The fewest tokens a GatedDeltaRule call keeping only its last state runs in the kernel's chunked form
# (plugins/gated_delta_rule/gated_delta_chunks.h: kChunk)
CHUNK_TOKENS = 32
_DTYPES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}
_I64, _F32, _I32, _PTR = ctypes.c_int64, ctypes.c_float, ctypes.c_int32, ctypes.c_void_p


def _bind(library: ctypes.CDLL) -> None:
    library.dflash_block_attention_workspace.restype = ctypes.c_size_t
    library.dflash_block_attention_workspace.argtypes = [_I64] * 6
    library.dflash_block_attention.restype = ctypes.c_char_p
    library.dflash_block_attention.argtypes = [_I64] * 6 + [_I32] + [_PTR] * 6 + [_F32, _I32, _I64, _PTR, _PTR, _PTR]
    library.dflash_inject_kv_workspace.restype = ctypes.c_size_t
    library.dflash_inject_kv_workspace.argtypes = [_I64] * 5
    library.dflash_inject_kv.restype = ctypes.c_char_p
    library.dflash_inject_kv.argtypes = [_I64] * 5 + [_I32] + [_PTR] * 6 + [_F32, _PTR, _PTR, _PTR, _PTR]
    library.dflash_gated_delta_rule.restype = ctypes.c_char_p
    library.dflash_gated_delta_rule.argtypes = [_I64] * 6 + [_I32] + [_PTR] * 6 + [_I64, _PTR, _PTR, _PTR]
    library.dflash_moe_workspace.restype = ctypes.c_size_t
    library.dflash_moe_workspace.argtypes = [_I64] * 5
    library.dflash_moe.restype = ctypes.c_char_p
    library.dflash_moe.argtypes = [_I64] * 5 + [_I32, _I32] + [_PTR] * 7


def _check(what: str, failure: bytes | None) -> None:
    if failure is not None:
        raise DFlashError(f"dflash::{what} kernel: {failure.decode()}")


def _ptr(t: torch.Tensor) -> int:
    return t.data_ptr()


def scan_by_kept_position(scan, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, g: torch.Tensor,
                          beta: torch.Tensor, state: torch.Tensor, kept: list[int]):
    """dflash::delta_rule_at for a prefill, whose rows keep one state each, after position kept[b] (a
    ragged batch: each row's last real token), through `scan` (delta_rule_scan's contract: inputs, the
    state before them and states_from -> (out, the states from states_from on)). The rows keeping the
    same position p scan their first p + 1 tokens keeping the last state only (what the GatedDeltaRule
    kernel runs in its chunked form), then the tokens after p from that state, for their outputs alone.
    Returns (out [b, s, Hv, Dv], states [b, 1, Hv, Dk, Dv]), as delta_rule_scan_at does."""
    b, s = query.shape[:2]
    inputs = (query, key, value, g, beta)
    out = torch.empty_like(value)
    states = torch.empty(b, 1, *state.shape[1:], dtype=torch.float32, device=state.device)
    for p in sorted(set(kept)):
        rows = torch.tensor([i for i, at in enumerate(kept) if at == p], device=query.device)
        # every row at once keeps its tensors as they are (the common case: one prompt, or equal ones)
        mine = inputs if len(rows) == b else tuple(t.index_select(0, rows) for t in inputs)
        start = state if len(rows) == b else state.index_select(0, rows)
        head_out, head_states = scan(*(t[:, :p + 1] for t in mine), start, p)
        out[rows, :p + 1] = head_out
        states[rows, 0] = head_states[:, -1]
        if p + 1 < s:
            tail_out, _ = scan(*(t[:, p + 1:] for t in mine), head_states[:, -1], s - p - 2)
            out[rows, p + 1:] = tail_out
    return out, states


@functools.cache
def _library() -> ctypes.CDLL | None:
    """The plugin library with its entry points declared; None where there is no GPU or no library."""
    if not torch.cuda.is_available() or not LIBRARY.is_file():
        return None
    library = ctypes.CDLL(str(LIBRARY))
    _bind(library)
    return library


def moe_kernel_refusal(gate_up_shape: tuple[int, ...], top_k: int) -> str | None:
    """Why our MoE kernel cannot run experts of gate_up [E, 2I, H] at top_k (its limits: moe_kernel.h);
    None when it can. Asks the library itself: a call of no tokens checks the shape and launches nothing."""
    library = _library()
    return "no GPU or no plugin library" if library is None else _moe_refusal(library, gate_up_shape, top_k)


def _moe_refusal(library: ctypes.CDLL, gate_up_shape: tuple[int, ...], top_k: int) -> str | None:
    experts, two_inter, hidden = gate_up_shape
    failure = library.dflash_moe(0, hidden, experts, two_inter // 2, top_k, 1, 0, *([None] * 7))
    return None if failure is None else failure.decode()


@functools.cache
def register_target_kernels() -> bool:
    """Registers GatedDeltaRule for `dflash::delta_rule_at`'s CUDA dispatch (what a hybrid slot target
    graph calls) and MoE for `dflash::moe`'s (a sparse target's routed experts), once, for the whole
    process; False where there is no GPU or no library (the ops then run their reference bodies)."""
    library = _library()
    if library is None:
        return False
    import dflash_trt.export.moe_ops  # noqa: F401  defines dflash::moe

    def scan(query, key, value, g, beta, state, first: int):
        """The kernel over these rows: out, and the state after every position from `first` on."""
        b, s, hk, dk = query.shape
        hv, dv = value.shape[2], value.shape[3]
        query, key, beta = (t.to(value.dtype).contiguous() for t in (query, key, beta))
        value, g, state = value.contiguous(), g.float().contiguous(), state.float().contiguous()
        out = torch.empty_like(value)
        every = torch.empty(b, s - first, hv, dk, dv, dtype=torch.float32, device=value.device)
        _check("GatedDeltaRule", library.dflash_gated_delta_rule(
            b, s, hk, hv, dk, dv, _DTYPES[value.dtype], *map(_ptr, (query, key, value, g, beta, state)), first,
            _ptr(out), _ptr(every), torch.cuda.current_stream().cuda_stream))
        return out, every

    @torch.library.register_kernel("dflash::delta_rule_at", "cuda")
    def _(query, key, value, g, beta, state, positions):
        capturing = torch.cuda.is_current_stream_capturing()
        # A prefill (one kept state a row, outside a CUDA graph's capture) whose longest row reaches a
        # chunk keeps the last state of each row's own length: the kernel's chunked form, one state a
        # row. (Shorter ones all run the token loop anyway: one call serves them.)
        if positions.shape[1] == 1 and not capturing:
            kept = positions[:, 0].tolist()
            if max(kept) + 1 >= CHUNK_TOKENS:
                return scan_by_kept_position(scan, query, key, value, g, beta, state, kept)
        # Otherwise every position's state from the earliest kept one on (from 0 while captured: the
        # positions are not known until replay), then each row's kept ones.
        first = 0 if capturing else int(positions.min())
        out, every = scan(query, key, value, g, beta, state, first)
        index = (positions - first)[:, :, None, None, None].expand(-1, -1, *every.shape[2:])
        return out, every.gather(1, index)

    @torch.library.register_kernel("dflash::moe", "cuda")
    def _(x, router_logits, gate_up, down, top_k: int, normalize: bool):
        tokens, width = x.shape
        experts, inter = gate_up.shape[0], gate_up.shape[1] // 2
        x = x.contiguous()
        router_logits, gate_up, down = (t.to(x.dtype).contiguous() for t in (router_logits, gate_up, down))
        out = torch.empty_like(x)
        workspace = torch.empty(library.dflash_moe_workspace(tokens, width, experts, inter, top_k),
                                dtype=torch.uint8, device=x.device)
        _check("MoE", library.dflash_moe(
            tokens, width, experts, inter, top_k, int(normalize), _DTYPES[x.dtype],
            *map(_ptr, (x, router_logits, gate_up, down, workspace, out)),
            torch.cuda.current_stream().cuda_stream))
        return out

    return True


@functools.cache
def register_cuda_kernels() -> bool:
    """Registers the draft graphs' kernels for the ops' CUDA dispatch, once; False where there is no GPU
    or no library (the ops then run their reference bodies)."""
    library = _library()
    if library is None:
        return False

    @torch.library.register_kernel("dflash::inject_kv", "cuda")
    def _(hidden, k_weight, v_weight, k_norm_weight, cos, sin, num_kv_heads: int, eps: float):
        b, n, width = hidden.shape
        d = cos.shape[-1]
        args = [hidden, k_weight, v_weight, k_norm_weight, cos.expand(b, n, d), sin.expand(b, n, d)]
        hidden, k_weight, v_weight, k_norm_weight, cos, sin = (t.to(hidden.dtype).contiguous() for t in args)
        k_out = hidden.new_empty(b, num_kv_heads, n, d)
        v_out = torch.empty_like(k_out)
        workspace = torch.empty(library.dflash_inject_kv_workspace(b, n, width, num_kv_heads, d), dtype=torch.uint8,
                                device=hidden.device)
        _check("InjectKV", library.dflash_inject_kv(
            b, n, width, num_kv_heads, d, _DTYPES[hidden.dtype], *map(_ptr, (hidden, k_weight, v_weight,
                                                                            k_norm_weight, cos, sin)),
            eps, _ptr(workspace), _ptr(k_out), _ptr(v_out), torch.cuda.current_stream().cuda_stream))
        return k_out, v_out

    @torch.library.register_kernel("dflash::block_attention", "cuda")
    def _(q, k_context, v_context, k_block, v_block, context_lengths, scale: float, causal: int, window: int):
        b, heads, n, d = q.shape
        kv, c = k_block.shape[1], k_context.shape[2]
        q, k_context, v_context, k_block, v_block = (t.to(q.dtype).contiguous()
                                                     for t in (q, k_context, v_context, k_block, v_block))
        lengths = context_lengths.to(torch.int64).contiguous()
        out = torch.empty_like(q)
        workspace = torch.empty(library.dflash_block_attention_workspace(b, heads, kv, n, c, d), dtype=torch.uint8,
                                device=q.device)
        _check("BlockAttention", library.dflash_block_attention(
            b, heads, kv, n, c, d, _DTYPES[q.dtype], *map(_ptr, (q, k_context, v_context, k_block, v_block,
                                                                 lengths)),
            scale, causal, window, _ptr(workspace), _ptr(out), torch.cuda.current_stream().cuda_stream))
        return out

    return True

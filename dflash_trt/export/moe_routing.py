"""The routed experts of a sparse MoE layer in standard ops (see moe.py): the router's top-k, the
experts the call's tokens picked, and every token through each of those, weighed by its routing."""

from __future__ import annotations

import torch


def route(router_logits: torch.Tensor, top_k: int, normalize: bool) -> torch.Tensor:
    """router logits [T, E] -> [T, E]: each token's top-k probabilities (renormalised if asked),
    zero elsewhere. The selection is a top-k scattered into place, never a `probs >= k-th value`
    threshold (which would take every expert tied at the k-th place): exactly k experts, and in
    PyTorch exactly torch.topk's, so this equals HF's block even on ties. In a graph it is ONNX TopK,
    which takes the lowest index among equal values (onnxruntime's MoE kernel, measured: the
    highest); torch.topk on CPU has no such rule (measured: top-2 of [.1, .3, .3, .3] is [2, 3]),
    so on a bit-exact tie at the k-th place a graph may route to another expert of equal weight
    than HF eager does."""
    probs = torch.softmax(router_logits, dim=-1, dtype=torch.float)
    top, index = torch.topk(probs, top_k, dim=-1)  # [T, k]
    if normalize:
        top = top / top.sum(dim=-1, keepdim=True)
    # scattered in float32 (ONNX opset 17's ConstantOfShape has no bfloat16), then cast as HF casts
    return torch.zeros_like(probs).scatter(1, index, top).to(router_logits.dtype)


def picked_experts(routing: torch.Tensor, top_k: int) -> torch.Tensor:
    """routing [T, E] (zero where a token did not pick an expert) -> U = min(T * top_k, E) expert
    ids holding every expert some token picked (more picks than that cannot happen), padded with
    unpicked ones where tokens share experts; their routing weights are zero, so they add nothing.
    A TopK over a [E] picked mask with K from the input's shape, not NonZero: TensorRT-RTX's ONNX
    parser has no NonZero (it asks for a plugin it does not ship). Run, not traced, K is a Python int:
    a tensor K would be read back to the host, a sync that a CUDA graph capture refuses."""
    if torch.jit.is_tracing():
        shape = torch._shape_as_tensor(routing)
        count = torch.minimum(shape[0] * top_k, shape[1])
    else:
        count = min(routing.shape[0] * top_k, routing.shape[1])
    _, used = torch.topk((routing != 0).any(dim=0).float(), count)
    return used


def routed_experts(x: torch.Tensor, router_logits: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor,
                   act_fn, top_k: int, normalize: bool) -> torch.Tensor:
    """x [T, H], router logits [T, E], gate_up [E, 2I, H] ([gate; up]), down [E, H, I] -> [T, H]:
    the routed experts' weighted sum, in standard ops over the experts the tokens picked."""
    routing = route(router_logits, top_k, normalize)  # [T, E]
    if not torch.jit.is_tracing() and routing.shape[0] * top_k >= routing.shape[1]:
        # run, with picks enough to reach every expert: all of them, their weights read where they
        # are (gathering U = E experts would copy every expert's weights on each call)
        weights = routing.t()[:, :, None]  # [E, T, 1]
    else:
        used = picked_experts(routing, top_k)  # [U]
        weights = routing.index_select(1, used).t()[:, :, None]  # [U, T, 1]
        gate_up, down = gate_up.index_select(0, used), down.index_select(0, used)
    projected = x[None] @ gate_up.transpose(1, 2)  # [U, T, 2I]
    gate, up = projected.chunk(2, dim=-1)
    act = act_fn(gate) * up  # [U, T, I]
    # Weigh before the down projection (linear, so equal to HF's weigh-after up to round-off).
    # `where`, not a product alone: an expert the token did not pick may overflow in half
    # precision, and inf * 0 would put NaN where HF never computed anything.
    act = torch.where(weights != 0, act * weights, 0.0)
    return (act @ down.transpose(1, 2)).sum(dim=0)  # [U, T, H] -> [T, H]

"""Optimization profiles: the (min, opt, max) of every dynamic input dim, per graph and phase.

The graphs' symbolic dims (bundle.json) are `batch`, `new` (tokens fed), `past` (cached target
tokens), `block` and `context` (cached draft context). A prefill feeds many tokens once; a decode
step feeds at most a block. Separate profiles let TensorRT tune kernels for each phase instead of
one range from 1 to max_seq_len; the runtime picks the profile whose box holds the step's shapes.
`logits_from` is a shape tensor (a slice start), so its profile gives values, not dims.

Graph contract 2's target (slot_graphs.py) has no `past`: its caches have the static capacity
(slots-trt), and `rows` (logits_index's width) is 1 for a prefill chunk, the block for a verify.
"""

from __future__ import annotations

Range = tuple[int, int, int]  # (min, opt, max)


def _prefill_tokens(max_seq_len: int) -> Range:
    return (1, min(256, max_seq_len), max_seq_len)


def profile_dims(graph: str, max_batch: int, max_seq_len: int, block_size: int, contract: int = 1,
                 capacity: int | None = None) -> dict[str, dict[str, Range]]:
    """phase -> {symbolic dim or shape input -> (min, opt, max)} for one graph of a bundle of graph
    `contract` (1 or 2); `capacity`: contract 2's static KV capacity, which bounds a prefill chunk."""
    batch = (1, 1, max_batch)
    prefill = _prefill_tokens(max_seq_len)
    if graph == "target" and contract == 2:
        chunk = _prefill_tokens(min(max_seq_len, capacity or max_seq_len))
        return {
            # a prefill chunk after any cached tokens; logits of its last valid row (rows 1), or more
            "prefill": {"batch": batch, "new": chunk, "rows": (1, 1, chunk[2])},
            # a verify of up to B tokens (B = 1: plain decoding); logits of every position
            "verify": {"batch": batch, "new": (1, block_size, block_size), "rows": (1, block_size, block_size)},
        }
    if graph == "target":
        return {
            # a chunked prefill may start after cached tokens; logits_from = new - 1 (last position only)
            "prefill": {"batch": batch, "new": prefill, "past": (0, 0, max_seq_len - 1),
                        "logits_from": (0, prefill[1] - 1, max_seq_len - 1)},
            # a verify of up to B tokens (B = 1: plain decoding) after the prompt; logits of every position
            "verify": {"batch": batch, "new": (1, block_size, block_size), "past": (1, max_seq_len // 2, max_seq_len - 1),
                       "logits_from": (0, 0, 0)},
        }
    if graph == "draft_context":
        return {
            "prefill": {"batch": batch, "new": prefill},
            "step": {"batch": batch, "new": (1, block_size, block_size)},  # the τ <= B positions a step kept
        }
    if graph == "draft_block":
        return {"draft": {"batch": batch, "block": (2, block_size, block_size), "context": (1, max_seq_len // 2, max_seq_len)}}
    raise AssertionError(f"unknown graph {graph}")


def input_ranges(spec: dict, dims: dict[str, Range]) -> dict[str, tuple[list[int], list[int], list[int]]]:
    """Per input of `spec`: (min shape, opt shape, max shape); shape inputs (rank 0) map to their values."""
    ranges = {}
    for io in spec["inputs"]:
        if io["shape"] == []:
            low, opt, high = dims[io["name"]]
            ranges[io["name"]] = ([low], [opt], [high])
            continue
        shapes = [[], [], []]
        for dim in io["shape"]:
            values = dims[dim] if isinstance(dim, str) else (dim, dim, dim)
            for shape, value in zip(shapes, values, strict=True):
                shape.append(value)
        ranges[io["name"]] = tuple(shapes)
    return ranges


def covers(dims: dict[str, Range], sizes: dict[str, int]) -> bool:
    """Whether a profile's box holds a step of these sizes (the runtime's profile choice)."""
    return all(dims[name][0] <= value <= dims[name][2] for name, value in sizes.items() if name in dims)

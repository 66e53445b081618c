"""dflash::slot_attention in standard ONNX (the `slots-trt` flavour): TensorScatter + Attention, for TensorRT.

Same op, same reference (slot_ops.py), a second ONNX form (docs/design/contract-v2.md §4 "portable"):
per layer, each cache is updated by opset-24 `TensorScatter` (mode linear, axis 2, at
cache_lengths[b]), whose output is the graph's cache output (the runtime binds it to its input's
buffer: onnxruntime then writes in place, TensorRT-RTX parses it into a KV-cache update layer), and
one ONNX `Attention` reads the whole capacity under a boolean mask built from the lengths.

- TensorScatter writes all s rows of a row. Padding rows (j >= query_lengths[b]) write back what the
  cache held there (gathered before the write), so the caches equal the reference's bit for bit and
  an idle row changes nothing; the runtime guarantees cache_lengths[b] + s <= C for every row.
- The mask is a boolean, not `nonpad_kv_seqlen`: TensorRT-RTX's parser drops that input (§3).
  Query j of row b sees slots c <= cache_lengths[b] + j (and > that - window when the layer slides).
  Padding rows are not masked off (a fully masked row is NaN): they attend like valid ones and are
  zeroed after, as the reference zeroes them.
- GQA is Attention's own: 4-D Q [b, heads, s, d] against K/V [b, kv_heads, C, d]. Repeating K/V to
  the query heads would copy the whole capacity every layer and step.
- Hybrid targets (Gated DeltaNet Loops) take the decomposed form: MatMul / Softmax with the query
  heads grouped per KV head. TensorRT-RTX 1.7.1's builder segfaults on a network holding both a Loop
  and an ONNX Attention (measured with the tiny qwen3_5_text, fp32 and fp16, attention before or
  after the Loop; either alone builds).
- Masked slots still enter the P @ V product with weight 0, so memory past a length must be finite:
  the runtime zero-fills fresh slots (every later write is a real K/V). GQA never reads them.

The TorchScript exporter stops at opset 20, so the symbolic emits both ops in a placeholder domain;
`finish_opset24` converts the exported model to opset 24 (onnx.version_converter: every standard op
keeps its meaning) and moves them to the standard domain.
"""

from __future__ import annotations

import onnx
import torch

OPSET = 24
PLACEHOLDER = "dflash.opset24"  # exists only between the export and finish_opset24


def _symbolic_slot_attention(g, query, key, value, key_cache, value_cache, cache_lengths, query_lengths,
                             num_heads, kv_heads, scale, window, decomposed: bool = False):
    from torch.onnx import symbolic_helper

    heads = symbolic_helper._maybe_get_const(num_heads, "i")
    kv = symbolic_helper._maybe_get_const(kv_heads, "i")
    window = symbolic_helper._maybe_get_const(window, "i")
    scale = symbolic_helper._maybe_get_const(scale, "f")

    def const(values):
        return g.op("Constant", value_t=torch.tensor(values, dtype=torch.long))

    def unsqueeze(x, axes):
        return g.op("Unsqueeze", x, const(axes))

    head_dim = g.op("Shape", key_cache, start_i=3, end_i=4)  # [1]
    new = g.op("Shape", query, start_i=1, end_i=2)  # [1]: s
    capacity = g.op("Shape", key_cache, start_i=2, end_i=3)  # [1]: C

    def heads_first(x, n):  # [b, s, n*d] -> [b, n, s, d]
        return g.op("Transpose", g.op("Reshape", x, g.op("Concat", const([0, 0, n]), head_dim, axis_i=0)),
                    perm_i=[0, 2, 1, 3])

    zero, one = const(0), const(1)
    step = g.op("Range", zero, g.op("Squeeze", new, const([0])), one)  # [s]
    valid = g.op("Less", unsqueeze(step, [0]), unsqueeze(query_lengths, [1]))  # [b, s]
    positions = g.op("Add", unsqueeze(cache_lengths, [1]), unsqueeze(step, [0]))  # [b, s]
    valid4 = unsqueeze(valid, [1, 3])  # [b, 1, s, 1]
    # the cache rows TensorScatter overwrites, as they were: padding rows write these back
    index = g.op("Expand", unsqueeze(positions, [1, 3]),
                 g.op("Concat", g.op("Shape", key_cache, end_i=2), new, head_dim, axis_i=0))  # [b, kv, s, d]
    caches = []
    for x, cache in ((key, key_cache), (value, value_cache)):
        update = g.op("Where", valid4, heads_first(x, kv), g.op("GatherElements", cache, index, axis_i=2))
        written = g.op(f"{PLACEHOLDER}::TensorScatter", cache, update, cache_lengths, axis_i=2, mode_s="linear")
        written.setType(cache.type())
        caches.append(written)
    slot = g.op("Range", zero, g.op("Squeeze", capacity, const([0])), one)  # [C]
    diff = g.op("Sub", unsqueeze(positions, [2]), unsqueeze(slot, [0, 1]))  # [b, s, C]
    visible = g.op("GreaterOrEqual", diff, zero)
    if window > 0:  # HF's sliding window: diff < window
        visible = g.op("And", visible, g.op("Less", diff, const(window)))
    if decomposed:
        out = _decomposed_attention(g, const, heads_first(query, heads), caches, visible, heads // kv, scale)
    else:
        # an additive mask in the query's dtype (0 where visible, -inf elsewhere; a row always sees its own
        # slot): TensorRT-RTX 1.7 fails to compile half-precision Attentions that share one bool mask
        # (duplicate op names in its IR) where the batch dimension is static, as a max_batch 1 build has it
        q = heads_first(query, heads)
        mask = g.op("Where", unsqueeze(visible, [1]), g.op("CastLike", g.op("Constant", value_t=torch.tensor(0.0)), q),
                    g.op("CastLike", g.op("Constant", value_t=torch.tensor(float("-inf"))), q))
        out = g.op(f"{PLACEHOLDER}::Attention", q, caches[0], caches[1], mask, scale_f=scale)
    out = g.op("Where", valid4, out, g.op("CastLike", const(0), out))
    out = g.op("Reshape", g.op("Transpose", out, perm_i=[0, 2, 1, 3]), const([0, 0, -1]))
    out.setType(query.type())
    return out, caches[0], caches[1]


def _decomposed_attention(g, const, q, caches, visible, groups: int, scale: float):
    """Attention from MatMul / Softmax: q [b, heads, s, d] grouped per KV head as [b, kv, groups, s, d]
    (head h = kv * groups + g, the reference's repeat_interleave) against K/V [b, kv, 1, C, d], which
    broadcast: read, never repeated."""
    key, value = caches
    shape = g.op("Shape", q)  # [b, heads, s, d]
    grouped = g.op("Reshape", q, g.op("Concat", const([0, -1]), const([groups]), g.op("Shape", q, start_i=2),
                                      axis_i=0))  # [b, kv, groups, s, d]
    scores = g.op("MatMul", grouped, g.op("Unsqueeze", g.op("Transpose", key, perm_i=[0, 1, 3, 2]), const([2])))
    scores = g.op("Mul", scores, g.op("CastLike", g.op("Constant", value_t=torch.tensor(scale)), scores))
    low = g.op("CastLike", g.op("Constant", value_t=torch.tensor(float("-inf"))), scores)
    mask = g.op("Unsqueeze", visible, const([1, 2]))  # [b, 1, 1, s, C]
    weights = g.op("Softmax", g.op("Where", mask, scores, low), axis_i=-1)
    return g.op("Reshape", g.op("MatMul", weights, g.op("Unsqueeze", value, const([2]))), shape)


def register_slot_trt_symbolics(opset: int, decomposed: bool = False) -> None:
    """dflash::slot_attention -> the standard-op form (replaces slot_ops' GQA symbolic at `opset`);
    `decomposed`: attention from MatMul / Softmax instead of ONNX Attention."""
    def symbolic(g, query, key, value, key_cache, value_cache, cache_lengths, query_lengths, num_heads, kv_heads,
                 scale, window, rope_cos=None, rope_sin=None, rope_positions=None):
        from torch.onnx import symbolic_helper

        # RoPE inside the attention is the slots flavour's (GroupQueryAttention's do_rotary) alone
        assert symbolic_helper._is_none(rope_cos), "slots-trt graphs rotate Q and K before the attention"
        return _symbolic_slot_attention(g, query, key, value, key_cache, value_cache, cache_lengths, query_lengths,
                                        num_heads, kv_heads, scale, window, decomposed)

    torch.onnx.register_custom_op_symbolic("dflash::slot_attention", symbolic, opset)


def finish_opset24(model: onnx.ModelProto) -> onnx.ModelProto:
    """The exported model at opset 24 with the placeholder nodes as standard TensorScatter/Attention.
    The converter adapts every standard op (ReduceMean's axes become an input, ...) and passes the
    placeholder domain's nodes through untouched: it has no schema for them."""
    model = onnx.version_converter.convert_version(model, OPSET)
    for node in model.graph.node:
        if node.domain == PLACEHOLDER:
            node.domain = ""
    imports = [o for o in model.opset_import if o.domain != PLACEHOLDER]
    del model.opset_import[:]
    model.opset_import.extend(imports)
    # the converter keeps the IR version; opset 24 needs a newer one (onnxruntime and parsers check)
    model.ir_version = max(model.ir_version, onnx.helper.find_min_ir_version_for(list(imports)))
    return model

"""The portable lowering of `dflash::GatedDeltaRule`: the same contract in standard ONNX ops.

Graphs are traced with the op (one node per linear-attention layer); the portable flavour then
replaces each node by this subgraph, the plugin flavour keeps it for the kernels. The lowering is an
ONNX Loop over the tokens whose body is the recurrence of delta_rule.py, one token per iteration:

- outputs per token leave as the Loop's scan output, so every sequence length runs one graph;
- the states the host keeps for rollback (after each position >= states_from) go to a loop-carried
  buffer of s - states_from slots, written with ScatterND at slot clamp(t - states_from): positions
  before states_from write slot 0 and are overwritten later, so no If and no sequence ops (which
  TensorRT's ONNX parser refuses: SequenceEmpty, ConcatFromSequence), and a prefill keeps one state;
- `GatedDeltaRuleAt` (graph contract 2: ragged rows) keeps the states after per-row positions
  [b, r] instead: each token's state is blended into the slots whose position it is.

Built with onnx.helper rather than traced because the TorchScript exporter turns a scripted loop's
list appends into sequence ops.
"""

from __future__ import annotations

import onnx
from onnx import TensorProto, helper

OP_TYPE = "GatedDeltaRule"


class _Nodes:
    """Appends nodes with names unique to one lowering (`prefix`), returning output names."""

    def __init__(self, prefix: str):
        self.prefix = prefix
        self.nodes: list[onnx.NodeProto] = []
        self.count = 0

    def __call__(self, op: str, *inputs: str, outputs: int = 1, **attrs):
        self.count += 1
        names = [f"{self.prefix}/{op}_{self.count}_{i}" for i in range(outputs)]
        self.nodes.append(helper.make_node(op, list(inputs), names, name=f"{self.prefix}/{op}_{self.count}", **attrs))
        return names[0] if outputs == 1 else names

    def const(self, value, dtype=TensorProto.INT64) -> str:
        values = value if isinstance(value, list) else [value]
        shape = [len(values)] if isinstance(value, list) else []
        tensor = helper.make_tensor(f"{self.prefix}/c{self.count + 1}", dtype, shape, values)
        return self("Constant", value=tensor)


def _dim(n: _Nodes, tensor: str, axis: int) -> str:
    """A 1-element int64 tensor holding tensor.shape[axis]."""
    return n("Slice", n("Shape", tensor), n.const([axis]), n.const([axis + 1]))


def _keep_from(states_from: str, last_slot: str):
    """GatedDeltaRule: the state after token t goes to slot clamp(t - states_from, 0, n - 1)."""
    def keep(n: _Nodes, t: str, buffer: str, updated: str) -> str:
        slot = n("Max", n("Min", n("Sub", t, states_from), last_slot), n.const(0))
        return n("ScatterND", buffer, n("Reshape", slot, n.const([1, 1])), n("Unsqueeze", updated, n.const([0])))
    return keep


def _keep_at(positions: str):
    """GatedDeltaRuleAt: the state after token t goes to every slot j of row b with positions[b, j] == t."""
    def keep(n: _Nodes, t: str, buffer: str, updated: str) -> str:
        hit = n("Transpose", n("Equal", positions, t), perm=[1, 0])  # [r, b]
        hit = n("Unsqueeze", hit, n.const([2, 3, 4]))
        return n("Where", hit, n("Unsqueeze", updated, n.const([0])), buffer)
    return keep


def _body(prefix: str, qn: str, kn: str, v: str, g: str, beta: str, keep) -> onnx.GraphProto:
    """One token: (t, cond, S [b, Hv, Dk, Dv], buffer [n, b, Hv, Dk, Dv]) -> (cond, S', buffer', o_t)."""
    n = _Nodes(f"{prefix}/body")
    t, cond, state, buffer = (f"{prefix}/body/{name}" for name in ("t", "cond_in", "state_in", "buffer_in"))
    at = lambda x: n("Gather", x, t, axis=1)  # noqa: E731 - [b, s, ...] -> token t's [b, ...]
    decay = n("Unsqueeze", n("Exp", at(g)), n.const([2, 3]))  # [b, Hv, 1, 1]
    decayed = n("Mul", state, decay)
    k_col = n("Unsqueeze", at(kn), n.const([3]))  # [b, Hv, Dk, 1]
    memory = n("ReduceSum", n("Mul", decayed, k_col), n.const([2]), keepdims=0)  # S^T k: [b, Hv, Dv]
    delta = n("Mul", n("Sub", at(v), memory), n("Unsqueeze", at(beta), n.const([2])))
    updated = n("Add", decayed, n("Mul", k_col, n("Unsqueeze", delta, n.const([2]))))
    q_col = n("Unsqueeze", at(qn), n.const([3]))
    out = n("ReduceSum", n("Mul", updated, q_col), n.const([2]), keepdims=0)  # S^T q: [b, Hv, Dv]
    written = keep(n, t, buffer, updated)
    # a trip count alone ends the loop (TensorRT warns when a condition is set too)
    n.nodes.append(helper.make_node("Constant", [], [f"{prefix}/body/cond_out"],
                                    value=helper.make_tensor("true", TensorProto.BOOL, [], [True])))
    n.nodes.append(helper.make_node("Identity", [updated], [f"{prefix}/body/state_out"]))
    n.nodes.append(helper.make_node("Identity", [written], [f"{prefix}/body/buffer_out"]))
    n.nodes.append(helper.make_node("Identity", [out], [f"{prefix}/body/out_t"]))
    f32 = TensorProto.FLOAT
    return helper.make_graph(
        n.nodes, f"{prefix}/body",
        [helper.make_tensor_value_info(t, TensorProto.INT64, []),
         helper.make_tensor_value_info(cond, TensorProto.BOOL, []),
         helper.make_tensor_value_info(state, f32, [None] * 4), helper.make_tensor_value_info(buffer, f32, [None] * 5)],
        [helper.make_tensor_value_info(f"{prefix}/body/cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info(f"{prefix}/body/state_out", f32, [None] * 4),
         helper.make_tensor_value_info(f"{prefix}/body/buffer_out", f32, [None] * 5),
         helper.make_tensor_value_info(f"{prefix}/body/out_t", f32, [None] * 3)],
    )


def lower_node(node: onnx.NodeProto, value_dtype: int) -> list[onnx.NodeProto]:
    """The standard-op nodes computing one GatedDeltaRule(At) node's outputs under its output names."""
    query, key, value, g, beta, state, where = node.input  # where: states_from, or positions [b, r]
    out_name, states_name = node.output
    n = _Nodes(node.name or f"{OP_TYPE}_{out_name}")
    f32 = TensorProto.FLOAT

    # value head h reads key head h // (Hv / Hk): gather the key heads once, outside the loop
    heads_v, heads_k = _dim(n, value, 2), _dim(n, query, 2)
    group = n("Squeeze", n("Div", heads_v, heads_k))
    head_of = n("Div", n("Range", n.const(0), n("Squeeze", heads_v), n.const(1)), group)

    def normalised(x: str) -> str:  # L2 over the head dim, in float32, eps 1e-6 (HF's l2norm)
        x = n("Cast", n("Gather", x, head_of, axis=2), to=f32)
        square_sum = n("ReduceSum", n("Mul", x, x), n.const([-1]), keepdims=1)
        return n("Mul", x, n("Reciprocal", n("Sqrt", n("Add", square_sum, n.const(1e-6, f32)))))

    head_dim = n("Cast", _dim(n, query, 3), to=f32)
    qn = n("Div", normalised(query), n("Sqrt", head_dim))
    kn = normalised(key)
    v, gf, bf = (n("Cast", x, to=f32) for x in (value, g, beta))

    tokens = _dim(n, query, 1)
    if node.op_type == OP_TYPE:
        slots = n("Sub", tokens, n("Reshape", where, n.const([1])))  # s - states_from
        keep = _keep_from(where, n("Sub", n("Squeeze", slots), n.const(1)))
    else:
        slots, keep = _dim(n, where, 1), _keep_at(where)  # r
    buffer_shape = n("Concat", slots, n("Shape", state), axis=0)  # [n, b, Hv, Dk, Dv]
    buffer = n("ConstantOfShape", buffer_shape, value=helper.make_tensor("zero", f32, [1], [0.0]))
    body = _body(n.prefix, qn, kn, v, gf, bf, keep)
    # the Loop's outputs: the final state (unused), the final buffer, the scanned outputs [s, b, Hv, Dv]
    _, final_buffer, scanned = n("Loop", n("Squeeze", tokens), "", n("Cast", state, to=f32), buffer, outputs=3,
                                 body=body)
    n.nodes.append(helper.make_node("Cast", [n("Transpose", scanned, perm=[1, 0, 2, 3])], [out_name], to=value_dtype))
    n.nodes.append(helper.make_node("Transpose", [final_buffer], [states_name], perm=[1, 0, 2, 3, 4]))
    return n.nodes


def lower_gated_delta_rule(model: onnx.ModelProto, domain: str) -> int:
    """Replace every `domain::GatedDeltaRule` and `GatedDeltaRuleAt` node of the main graph in place;
    returns how many."""
    dtypes = {v.name: v.type.tensor_type.elem_type
              for v in [*model.graph.value_info, *model.graph.input, *model.graph.output]}
    nodes, lowered, outputs = [], 0, set()
    for node in model.graph.node:
        if node.domain == domain and node.op_type in (OP_TYPE, OP_TYPE + "At"):
            nodes += lower_node(node, dtypes.get(node.output[0]) or dtypes.get(node.input[2], TensorProto.FLOAT))
            lowered += 1
            outputs.update(node.output)
        else:
            nodes.append(node)
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    # the exporter typed the op's outputs with the trace's own sizes (batch included): drop them
    kept_info = [v for v in model.graph.value_info if v.name not in outputs]
    del model.graph.value_info[:]
    model.graph.value_info.extend(kept_info)
    if lowered and not any(node.domain == domain for node in model.graph.node):
        kept = [o for o in model.opset_import if o.domain != domain]
        del model.opset_import[:]
        model.opset_import.extend(kept)
    return lowered

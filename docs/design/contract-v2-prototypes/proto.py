"""Contract-v2 prototypes: in-place KV writes in onnxruntime CPU (tiny 2-layer model)."""
import sys, time, numpy as np, onnx, onnxruntime as ort
from onnx import helper as h, TensorProto as TP, numpy_helper as nh_
L, HID, NH, NKV, D, FF = 2, 256, 8, 2, 32, 512
rng = np.random.default_rng(0)
W = {f"{n}{i}": (rng.standard_normal(s) * 0.05).astype(np.float32) for i in range(L)
     for n, s in (("wq", (HID, NH*D)), ("wk", (HID, NKV*D)), ("wv", (HID, NKV*D)), ("wo", (NH*D, HID)), ("w1", (HID, FF)), ("w2", (FF, HID)))}
import os as _os
FP16 = _os.environ.get("DT") == "fp16"
inits = [nh_.from_array(v.astype(np.float16) if FP16 else v, k) for k, v in W.items()]
F = TP.FLOAT16 if FP16 else TP.FLOAT

import os
CAP = int(os.environ["CAP"]) if os.environ.get("CAP") else "C"
def cache_vi(name): return h.make_tensor_value_info(name, F, ["b", NKV, CAP, D])

def model_gqa():
    nodes = []; x = "x"
    ins = [h.make_tensor_value_info("x", F, ["b", "s", HID]), h.make_tensor_value_info("seqlens_k", TP.INT32, ["b"]),
           h.make_tensor_value_info("total_len", TP.INT32, []), h.make_tensor_value_info("query_seqlens", TP.INT32, ["b"])]
    outs = []
    for i in range(L):
        ins += [cache_vi(f"past_key_{i}"), cache_vi(f"past_value_{i}")]
        outs += [cache_vi(f"present_key_{i}"), cache_vi(f"present_value_{i}")]
        nodes += [h.make_node("MatMul", [x, f"wq{i}"], [f"q{i}"]), h.make_node("MatMul", [x, f"wk{i}"], [f"k{i}"]),
                  h.make_node("MatMul", [x, f"wv{i}"], [f"v{i}"]),
                  h.make_node("GroupQueryAttention", [f"q{i}", f"k{i}", f"v{i}", f"past_key_{i}", f"past_value_{i}", "seqlens_k", "total_len",
                              "", "", "", "", "", "", "", "", "", "query_seqlens"],
                              [f"a{i}", f"present_key_{i}", f"present_value_{i}"], domain="com.microsoft", num_heads=NH, kv_num_heads=NKV, scale=float(D ** -0.5))]
        x = mlp(nodes, x, i)
    nodes.append(h.make_node("Identity", [x], ["y"]))
    return finish(nodes, ins, outs, [("com.microsoft", 1)])

def mlp(nodes, x, i):
    nodes += [h.make_node("MatMul", [f"a{i}", f"wo{i}"], [f"o{i}"]), h.make_node("Add", [x, f"o{i}"], [f"r{i}"]),
              h.make_node("MatMul", [f"r{i}", f"w1{i}"], [f"f{i}"]), h.make_node("Relu", [f"f{i}"], [f"g{i}"]),
              h.make_node("MatMul", [f"g{i}", f"w2{i}"], [f"m{i}"]), h.make_node("Add", [f"r{i}", f"m{i}"], [f"x{i+1}"])]
    return f"x{i+1}"

def finish(nodes, ins, outs, extra, opset=24):
    outs = [h.make_tensor_value_info("y", F, ["b", "s", HID])] + outs
    g = h.make_graph(nodes, "m", ins, outs, inits)
    return h.make_model(g, opset_imports=[h.make_opsetid("", opset)] + [h.make_opsetid(d, v) for d, v in extra]).SerializeToString()

def std_attn(nodes, i, kc, vc, mask):
    # q [b,s,NH*D] -> [b,NH,s,D]; kc/vc [b,NKV,C,D]
    nodes += [h.make_node("Reshape", [f"q{i}", "qshape"], [f"q4{i}"]), h.make_node("Transpose", [f"q4{i}"], [f"qt{i}"], perm=[0, 2, 1, 3]),
              h.make_node("Attention", [f"qt{i}", kc, vc, mask], [f"at{i}"], scale=1.0 / np.sqrt(D)),
              h.make_node("Transpose", [f"at{i}"], [f"atb{i}"], perm=[0, 2, 1, 3]), h.make_node("Reshape", [f"atb{i}", "ashape"], [f"a{i}"])]

def kv_new(nodes, i, x):
    for n in "kv":
        nodes += [h.make_node("MatMul", [x, f"w{n}{i}"], [f"{n}{i}"]), h.make_node("Reshape", [f"{n}{i}", "kvshape"], [f"{n}4{i}"]),
                  h.make_node("Transpose", [f"{n}4{i}"], [f"{n}t{i}"], perm=[0, 2, 1, 3])]

def consts():
    return [h.make_node("Constant", [], ["qshape"], value=nh_.from_array(np.array([0, 0, NH, D], np.int64))),
            h.make_node("Constant", [], ["kvshape"], value=nh_.from_array(np.array([0, 0, NKV, D], np.int64))),
            h.make_node("Constant", [], ["ashape"], value=nh_.from_array(np.array([0, 0, NH*D], np.int64)))]

def model_scatter(kind):
    """kind='tensorscatter' (opset 24 TensorScatter) or 'scatternd'; attention over the whole capacity with a bool mask."""
    nodes = consts(); x = "x"
    ins = [h.make_tensor_value_info("x", F, ["b", "s", HID]), h.make_tensor_value_info("write_index", TP.INT64, ["b"]),
           h.make_tensor_value_info("mask", TP.BOOL, ["b", 1, "s", "C"])]
    if kind == "scatternd": ins.append(h.make_tensor_value_info("nd_index", TP.INT64, ["b", NKV, "s", 3]))
    outs = []
    for i in range(L):
        ins += [cache_vi(f"past_key_{i}"), cache_vi(f"past_value_{i}")]
        outs += [cache_vi(f"present_key_{i}"), cache_vi(f"present_value_{i}")]
        nodes.append(h.make_node("MatMul", [x, f"wq{i}"], [f"q{i}"])); kv_new(nodes, i, x)
        for n, nm in (("k", "key"), ("v", "value")):
            if kind == "tensorscatter":
                nodes.append(h.make_node("TensorScatter", [f"past_{nm}_{i}", f"{n}t{i}", "write_index"], [f"present_{nm}_{i}"], axis=2))
            else:
                nodes.append(h.make_node("ScatterND", [f"past_{nm}_{i}", "nd_index", f"{n}t{i}"], [f"present_{nm}_{i}"]))
        std_attn(nodes, i, f"present_key_{i}", f"present_value_{i}", "mask")
        x = mlp(nodes, x, i)
    nodes.append(h.make_node("Identity", [x], ["y"]))
    return finish(nodes, ins, outs, [])

def model_concat():
    """Contract v1: present = past ++ new (past padded to the batch max), mask over p+s."""
    nodes = consts(); x = "x"
    ins = [h.make_tensor_value_info("x", F, ["b", "s", HID]), h.make_tensor_value_info("mask", TP.BOOL, ["b", 1, "s", "T"])]
    outs = []
    for i in range(L):
        ins += [cache_vi(f"past_key_{i}"), cache_vi(f"past_value_{i}")]
        outs += [cache_vi(f"present_key_{i}"), cache_vi(f"present_value_{i}")]
        nodes.append(h.make_node("MatMul", [x, f"wq{i}"], [f"q{i}"])); kv_new(nodes, i, x)
        for n, nm in (("k", "key"), ("v", "value")):
            nodes.append(h.make_node("Concat", [f"past_{nm}_{i}", f"{n}t{i}"], [f"present_{nm}_{i}"], axis=2))
        std_attn(nodes, i, f"present_key_{i}", f"present_value_{i}", "mask")
        x = mlp(nodes, x, i)
    nodes.append(h.make_node("Identity", [x], ["y"]))
    return finish(nodes, ins, outs, [])

def reference(x, caches, lengths, q_valid):
    """numpy oracle: per row, causal attention of the q_valid new tokens over cache[:len] ++ new."""
    b, s, _ = x.shape; caches = [c.copy() for c in caches]; y = x.copy()
    for i in range(L):
        q = (y @ W[f"wq{i}"]).reshape(b, s, NH, D); k = (y @ W[f"wk{i}"]).reshape(b, s, NKV, D); v = (y @ W[f"wv{i}"]).reshape(b, s, NKV, D)
        a = np.zeros((b, s, NH, D), np.float32)
        for r in range(b):
            P, Q = lengths[r], q_valid[r]
            caches[2*i][r, :, P:P+Q] = k[r, :Q].transpose(1, 0, 2); caches[2*i+1][r, :, P:P+Q] = v[r, :Q].transpose(1, 0, 2)
            K = caches[2*i][r, :, :P+Q]; V = caches[2*i+1][r, :, :P+Q]
            for hh in range(NH):
                sc = q[r, :Q, hh] @ K[hh // (NH // NKV)].T / np.sqrt(D)
                sc = sc + np.triu(np.full((Q, P+Q), -np.inf), P + 1)
                p = np.exp(sc - sc.max(-1, keepdims=True)); p /= p.sum(-1, keepdims=True)
                a[r, :Q, hh] = p @ V[hh // (NH // NKV)]
        r_ = y + a.reshape(b, s, -1) @ W[f"wo{i}"]
        y = r_ + np.maximum(r_ @ W[f"w1{i}"], 0) @ W[f"w2{i}"]
    return y, caches

def model_nonpad():
    """Portable ONNX-24: TensorScatter into the cache + Attention(is_causal=1, nonpad_kv_seqlen) over it, no mask."""
    nodes = consts(); x = "x"
    ins = [h.make_tensor_value_info("x", F, ["b", "s", HID]), h.make_tensor_value_info("write_index", TP.INT64, ["b"]),
           h.make_tensor_value_info("nonpad_kv_seqlen", TP.INT64, ["b"])]
    outs = []
    for i in range(L):
        ins += [cache_vi(f"past_key_{i}"), cache_vi(f"past_value_{i}")]
        outs += [cache_vi(f"present_key_{i}"), cache_vi(f"present_value_{i}")]
        nodes.append(h.make_node("MatMul", [x, f"wq{i}"], [f"q{i}"])); kv_new(nodes, i, x)
        for n, nm in (("k", "key"), ("v", "value")):
            nodes.append(h.make_node("TensorScatter", [f"past_{nm}_{i}", f"{n}t{i}", "write_index"], [f"present_{nm}_{i}"], axis=2))
        nodes += [h.make_node("Reshape", [f"q{i}", "qshape"], [f"q4{i}"]), h.make_node("Transpose", [f"q4{i}"], [f"qt{i}"], perm=[0, 2, 1, 3]),
                  h.make_node("Attention", [f"qt{i}", f"present_key_{i}", f"present_value_{i}", "", "", "", "nonpad_kv_seqlen"], [f"at{i}"],
                              scale=1.0 / np.sqrt(D), is_causal=1),
                  h.make_node("Transpose", [f"at{i}"], [f"atb{i}"], perm=[0, 2, 1, 3]), h.make_node("Reshape", [f"atb{i}", "ashape"], [f"a{i}"])]
        x = mlp(nodes, x, i)
    nodes.append(h.make_node("Identity", [x], ["y"]))
    return finish(nodes, ins, outs, [])

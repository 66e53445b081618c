"""Batched NON-causal draft block through GQA (CPU, causal=1, shared buffer): the block's K/V are first written in place
by TensorScatter at [P, P+S); then the S block queries ride as extra heads of ONE query token at position P+S-1
(num_heads = NH*S, head order (kv_head, group, slot)), so each sees context[:P] ++ the whole block."""
import numpy as np, onnxruntime as ort, time
from onnx import helper as h, TensorProto as TP, numpy_helper as nh_
NH, NKV, D, S, B = 8, 2, 32, 16, 4
G = NH // NKV
so = ort.SessionOptions(); so.intra_op_num_threads = 2; so.log_severity_level = 3
vi = h.make_tensor_value_info; F = TP.FLOAT
c = lambda n, v: h.make_node("Constant", [], [n], value=nh_.from_array(np.array(v, np.int64)))
nodes = [c("one", 1), c("qs", [0, S, NKV, G, D]), c("q1", [0, 1, NKV * G * S * D]), c("os", [0, NKV, G, S, D]), c("ob", [0, NH, S, D]),
         c("last", [S - 1]), c("end", [S]), c("ax", [2]), c("kvh", [0, 1, NKV * D]),
         h.make_node("Reshape", ["q", "qs"], ["q5"]), h.make_node("Transpose", ["q5"], ["qt"], perm=[0, 2, 3, 1, 4]),  # [b,NKV,G,S,D]
         h.make_node("Reshape", ["qt", "q1"], ["qh"]),                                                          # [b,1,NKV*G*S*D]
         h.make_node("TensorScatter", ["kc", "kb", "P"], ["kc1"], axis=2), h.make_node("TensorScatter", ["vc", "vb", "P"], ["vc1"], axis=2),
         h.make_node("Slice", ["kb", "last", "end", "ax"], ["kl"]), h.make_node("Slice", ["vb", "last", "end", "ax"], ["vl"]),  # [b,NKV,1,D]
         h.make_node("Transpose", ["kl"], ["klt"], perm=[0, 2, 1, 3]), h.make_node("Transpose", ["vl"], ["vlt"], perm=[0, 2, 1, 3]),
         h.make_node("Reshape", ["klt", "kvh"], ["k1"]), h.make_node("Reshape", ["vlt", "kvh"], ["v1"]),
         h.make_node("Add", ["P", "end"], ["T64"]), h.make_node("Sub", ["T64", "one"], ["sk64"]), h.make_node("Cast", ["sk64"], ["seqlens_k"], to=TP.INT32),
         h.make_node("Shape", ["kc"], ["cap64"], start=2, end=3), h.make_node("Squeeze", ["cap64"], ["capsq"]), h.make_node("Cast", ["capsq"], ["total"], to=TP.INT32),
         h.make_node("GroupQueryAttention", ["qh", "k1", "v1", "kc1", "vc1", "seqlens_k", "total"], ["oh", "kc2", "vc2"],
                     domain="com.microsoft", num_heads=NH * S, kv_num_heads=NKV, scale=float(D ** -0.5)),
         h.make_node("Reshape", ["oh", "os"], ["o5"]), h.make_node("Transpose", ["o5"], ["ot"], perm=[0, 1, 2, 3, 4]), h.make_node("Reshape", ["ot", "ob"], ["o"])]
g = h.make_graph(nodes, "g", [vi("q", F, ["b", S, NH * D]), vi("kb", F, ["b", NKV, S, D]), vi("vb", F, ["b", NKV, S, D]),
                              vi("kc", F, ["b", NKV, "C", D]), vi("vc", F, ["b", NKV, "C", D]), vi("P", TP.INT64, ["b"])],
                 [vi("o", F, ["b", NH, S, D]), vi("kc2", F, ["b", NKV, "C", D]), vi("vc2", F, ["b", NKV, "C", D])])
sess = ort.InferenceSession(h.make_model(g, opset_imports=[h.make_opsetid("", 24), h.make_opsetid("com.microsoft", 1)]).SerializeToString(), so,
                            providers=["CPUExecutionProvider"])
r = np.random.default_rng(0)
def bench(C, P):
    q = r.standard_normal((B, S, NH * D)).astype(np.float32); kb = r.standard_normal((B, NKV, S, D)).astype(np.float32); vb = r.standard_normal((B, NKV, S, D)).astype(np.float32)
    kc = r.standard_normal((B, NKV, C, D)).astype(np.float32); vc = r.standard_normal((B, NKV, C, D)).astype(np.float32)
    ctx_k, ctx_v = kc.copy(), vc.copy()
    io = sess.io_binding(); kv, vv = ort.OrtValue.ortvalue_from_numpy(kc), ort.OrtValue.ortvalue_from_numpy(vc)
    for n, a in (("q", q), ("kb", kb), ("vb", vb), ("P", P.astype(np.int64))): io.bind_cpu_input(n, a)
    io.bind_ortvalue_input("kc", kv); io.bind_ortvalue_input("vc", vv); io.bind_ortvalue_output("kc2", kv); io.bind_ortvalue_output("vc2", vv)
    out = np.empty((B, NH, S, D), np.float32); io.bind_output("o", "cpu", 0, np.float32, out.shape, out.ctypes.data)
    sess.run_with_iobinding(io); o = out.copy(); err = 0
    for b in range(B):
        K = np.concatenate([ctx_k[b, :, :P[b]], kb[b]], 1); V = np.concatenate([ctx_v[b, :, :P[b]], vb[b]], 1)
        for hh in range(NH):
            s_ = q[b].reshape(S, NH, D)[:, hh] @ K[hh // G].T / np.sqrt(D); p = np.exp(s_ - s_.max(-1, keepdims=True)); p /= p.sum(-1, keepdims=True)
            err = max(err, np.abs(o[b, hh] - p @ V[hh // G]).max())
    ts = []
    for _ in range(60): t0 = time.perf_counter(); sess.run_with_iobinding(io); ts.append(time.perf_counter() - t0)
    return err, 1e3 * np.median(ts)
for C in (2304, 8192):
    for base in (256, 2048):
        e, t = bench(C, np.array([base, base - 37, base - 100, base - 3]))
        print(f"C={C:5d} ctx~{base:5d}: GQA heads-as-block {t:6.3f} ms  max err vs non-causal reference {e:.1e}")

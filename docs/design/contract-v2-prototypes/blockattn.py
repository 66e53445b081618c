"""Batched draft-block attention over a fixed-capacity context cache: dflash::BlockAttention (custom op, loops to
context_lengths) vs ONNX Attention-24 (is_causal=0, nonpad_kv_seqlen) after TensorScatter of the block K/V."""
import numpy as np, onnxruntime as ort, time
from dflash_trt.export.op_library import op_library
from onnx import helper as h, TensorProto as TP
NH, NKV, D, S, B = 8, 2, 32, 16, 4
lib = str(op_library())  # bash scripts/build_plugins.sh builds it
so = ort.SessionOptions(); so.intra_op_num_threads = 2; so.log_severity_level = 3; so.register_custom_ops_library(lib)
vi = h.make_tensor_value_info; F = TP.FLOAT
ins = [vi("q", F, ["b", NH, "s", D]), vi("kc", F, ["b", NKV, "C", D]), vi("vc", F, ["b", NKV, "C", D]), vi("kb", F, ["b", NKV, "s", D]),
       vi("vb", F, ["b", NKV, "s", D]), vi("len", TP.INT64, ["b"])]
custom = h.make_graph([h.make_node("BlockAttention", ["q", "kc", "vc", "kb", "vb", "len"], ["o"], domain="dflash", scale=float(D**-0.5), causal=0, window=-1)],
                      "c", ins, [vi("o", F, ["b", NH, "s", D])])
std = h.make_graph([h.make_node("TensorScatter", ["kc", "kb", "len"], ["kc2"], axis=2), h.make_node("TensorScatter", ["vc", "vb", "len"], ["vc2"], axis=2),
                    h.make_node("Add", ["len", "sS"], ["nonpad"]), h.make_node("Constant", [], ["sS"], value=h.make_tensor("sS", TP.INT64, [], [S])),
                    h.make_node("Attention", ["q", "kc2", "vc2", "", "", "", "nonpad"], ["o"], scale=float(D**-0.5), is_causal=0)],
                   "s", ins, [vi("o", F, ["b", NH, "s", D]), vi("kc2", F, ["b", NKV, "C", D]), vi("vc2", F, ["b", NKV, "C", D])])
sc = ort.InferenceSession(h.make_model(custom, opset_imports=[h.make_opsetid("", 24), h.make_opsetid("dflash", 1)]).SerializeToString(), so, providers=["CPUExecutionProvider"])
ss = ort.InferenceSession(h.make_model(std, opset_imports=[h.make_opsetid("", 24)]).SerializeToString(), so, providers=["CPUExecutionProvider"])
r = np.random.default_rng(0)
def bench(sess, C, P, shared):
    q = r.standard_normal((B, NH, S, D)).astype(np.float32); kb = r.standard_normal((B, NKV, S, D)).astype(np.float32); vb = r.standard_normal((B, NKV, S, D)).astype(np.float32)
    kc = r.standard_normal((B, NKV, C, D)).astype(np.float32); vc = r.standard_normal((B, NKV, C, D)).astype(np.float32)
    io = sess.io_binding(); kv, vv = ort.OrtValue.ortvalue_from_numpy(kc), ort.OrtValue.ortvalue_from_numpy(vc)
    for n, a in (("q", q), ("kb", kb), ("vb", vb), ("len", P.astype(np.int64))): io.bind_cpu_input(n, a)
    io.bind_ortvalue_input("kc", kv); io.bind_ortvalue_input("vc", vv)
    if shared: io.bind_ortvalue_output("kc2", kv); io.bind_ortvalue_output("vc2", vv)
    out = np.empty((B, NH, S, D), np.float32); io.bind_output("o", "cpu", 0, np.float32, out.shape, out.ctypes.data)
    ctx_k, ctx_v = kc.copy(), vc.copy()
    sess.run_with_iobinding(io); o = out.copy()
    err = 0
    for b in range(B):
        K = np.concatenate([ctx_k[b, :, :P[b]], kb[b]], 1); V = np.concatenate([ctx_v[b, :, :P[b]], vb[b]], 1)
        for hh in range(NH):
            s_ = q[b, hh] @ K[hh // 4].T / np.sqrt(D); p = np.exp(s_ - s_.max(-1, keepdims=True)); p /= p.sum(-1, keepdims=True)
            err = max(err, np.abs(o[b, hh] - p @ V[hh // 4]).max())
    ts = []
    for _ in range(30): t0 = time.perf_counter(); sess.run_with_iobinding(io); ts.append(time.perf_counter() - t0)
    return err, 1e3 * np.median(ts)
for C in (2304, 8192):
    for base in (256, 2048):
        P = np.array([base, base - 37, base - 100, base - 3])
        e1, t1 = bench(sc, C, P, False); e2, t2 = bench(ss, C, P, True)
        print(f"C={C:5d} ctx~{base:5d}: dflash::BlockAttention {t1:6.3f} ms (err {e1:.1e})   TensorScatter+Attention(nonpad, is_causal=0) {t2:6.3f} ms (err {e2:.1e})")

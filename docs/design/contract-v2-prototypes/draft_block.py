"""Draft block with GQA causal=0 over the shared draft-context buffer: block K/V land at [P, P+S) (beyond the
committed context length, overwritten by the next context write); every block query sees context[:P] ++ block.
`--batch1`: one row without the per-row `qlen` input (the batched form is refused by ORT 1.32)."""
import sys
import numpy as np, onnxruntime as ort, time
from onnx import helper as h, TensorProto as TP
BATCH1 = "--batch1" in sys.argv
NH, NKV, D, S, B = 8, 2, 32, 16, 1 if BATCH1 else 4
QLEN = [] if BATCH1 else ["qlen"]  # GQA's per-row query lengths (input 16)
so = ort.SessionOptions(); so.intra_op_num_threads = 2; so.log_severity_level = 3
vi = h.make_tensor_value_info
n = h.make_node("GroupQueryAttention", ["q", "k", "v", "pk", "pv", "seqlens_k", "total"] + [""] * (9 if QLEN else 6) + QLEN,
                ["o", "ck", "cv"], domain="com.microsoft", num_heads=NH, kv_num_heads=NKV, causal=0)
g = h.make_graph([n], "g", [vi("q", TP.FLOAT, ["b", "s", NH*D]), vi("k", TP.FLOAT, ["b", "s", NKV*D]), vi("v", TP.FLOAT, ["b", "s", NKV*D]),
                            vi("pk", TP.FLOAT, ["b", NKV, "C", D]), vi("pv", TP.FLOAT, ["b", NKV, "C", D]), vi("seqlens_k", TP.INT32, ["b"]),
                            vi("total", TP.INT32, [])] + [vi(q, TP.INT32, ["b"]) for q in QLEN],
                 [vi("o", TP.FLOAT, ["b", "s", NH*D]), vi("ck", TP.FLOAT, ["b", NKV, "C", D]), vi("cv", TP.FLOAT, ["b", NKV, "C", D])])
s = ort.InferenceSession(h.make_model(g, opset_imports=[h.make_opsetid("", 21), h.make_opsetid("com.microsoft", 1)]).SerializeToString(), so,
                         providers=["CPUExecutionProvider"])
r = np.random.default_rng(0)
def run(C, P, n=1):
    P = P[:B]
    q = r.standard_normal((B, S, NH*D)).astype(np.float32); k = r.standard_normal((B, S, NKV*D)).astype(np.float32); v = r.standard_normal((B, S, NKV*D)).astype(np.float32)
    ck = r.standard_normal((B, NKV, C, D)).astype(np.float32); cv = r.standard_normal((B, NKV, C, D)).astype(np.float32)
    io = s.io_binding(); kov, vov = ort.OrtValue.ortvalue_from_numpy(ck), ort.OrtValue.ortvalue_from_numpy(cv)
    feeds = {"q": q, "k": k, "v": v, "seqlens_k": (P + S - 1).astype(np.int32), "total": np.array(C, np.int32)}
    feeds.update({nm: np.full(B, S, np.int32) for nm in QLEN})
    for nm, a in feeds.items():
        io.bind_cpu_input(nm, a)
    io.bind_ortvalue_input("pk", kov); io.bind_ortvalue_output("ck", kov); io.bind_ortvalue_input("pv", vov); io.bind_ortvalue_output("cv", vov)
    io.bind_output("o", "cpu")
    ctx_k, ctx_v = ck.copy(), cv.copy()
    s.run_with_iobinding(io); o = io.get_outputs()[-1].numpy()
    ts = []
    for _ in range(n): t0 = time.perf_counter(); s.run_with_iobinding(io); ts.append(time.perf_counter() - t0)
    err = 0
    for b in range(B):
        K = np.concatenate([ctx_k[b, :, :P[b]], k[b].reshape(S, NKV, D).transpose(1, 0, 2)], 1)
        V = np.concatenate([ctx_v[b, :, :P[b]], v[b].reshape(S, NKV, D).transpose(1, 0, 2)], 1)
        for hh in range(NH):
            sc = q[b].reshape(S, NH, D)[:, hh] @ K[hh // 4].T / np.sqrt(D); p = np.exp(sc - sc.max(-1, keepdims=True)); p /= p.sum(-1, keepdims=True)
            err = max(err, np.abs(o[b].reshape(S, NH, D)[:, hh] - p @ V[hh // 4]).max())
    return err, 1e3 * np.median(ts)
e, _ = run(512, np.array([100, 7, 300, 250]))
print(f"GQA causal=0 shared buffer, ragged context lengths, block {S}: max err vs non-causal reference {e:.2e}")
for C in (2304, 8192):
    for base in (256, 2048):
        print(f"  C={C} context~{base}: {run(C, np.array([base, base-37, base-100, base-3]), 100)[1]:.3f} ms (1 attention layer, batch {B})")

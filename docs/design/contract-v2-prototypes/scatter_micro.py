import time, numpy as np, onnxruntime as ort
from onnx import helper as h, TensorProto as TP
so = ort.SessionOptions(); so.intra_op_num_threads = 2; so.log_severity_level = 3
B, NKV, D, S = 4, 2, 32, 4
def model(op):
    cache = h.make_tensor_value_info("cache", TP.FLOAT, ["b", NKV, "C", D]); out = h.make_tensor_value_info("out", TP.FLOAT, ["b", NKV, "C", D])
    upd = h.make_tensor_value_info("upd", TP.FLOAT, ["b", NKV, "s", D])
    if op == "TensorScatter":
        n = h.make_node("TensorScatter", ["cache", "upd", "wi"], ["out"], axis=2); idx = h.make_tensor_value_info("wi", TP.INT64, ["b"])
    else:
        n = h.make_node("ScatterND", ["cache", "idx", "upd"], ["out"]); idx = h.make_tensor_value_info("idx", TP.INT64, ["b", NKV, "s", 3])
    return h.make_model(h.make_graph([n], "g", [cache, upd, idx], [out]), opset_imports=[h.make_opsetid("", 24)]).SerializeToString()
def t(fn, n=300):
    for _ in range(5): fn()
    ts = []
    for _ in range(n): t0 = time.perf_counter(); fn(); ts.append(time.perf_counter() - t0)
    return 1e6 * np.median(ts)
for op in ("TensorScatter", "ScatterND"):
    s = ort.InferenceSession(model(op), so, providers=["CPUExecutionProvider"])
    for C in (512, 4096, 32768):
        cache = np.zeros((B, NKV, C, D), np.float32); upd = np.ones((B, NKV, S, D), np.float32)
        wi = np.array([5, 100, 7, 300]); feeds = {"upd": upd}
        if op == "TensorScatter": feeds["wi"] = wi
        else:
            idx = np.zeros((B, NKV, S, 3), np.int64)
            for r in range(B):
                for hh in range(NKV):
                    for q in range(S): idx[r, hh, q] = (r, hh, wi[r] + q)
            feeds["idx"] = idx
        res = []
        for shared in (True, False):
            io = s.io_binding(); cv = ort.OrtValue.ortvalue_from_numpy(cache); io.bind_ortvalue_input("cache", cv)
            for k, v in feeds.items(): io.bind_cpu_input(k, v)
            other = np.empty_like(cache)
            io.bind_ortvalue_output("out", cv if shared else ort.OrtValue.ortvalue_from_numpy(other))
            s.run_with_iobinding(io)
            if shared: ok = cache[1, :, 100:104].min() == 1.0 and cache[1, :, 99].max() == 0
            res.append(t(lambda: s.run_with_iobinding(io)))
        print(f"{op:13s} C={C:6d} ({cache.nbytes/2**20:5.1f} MiB): same buffer {res[0]:8.1f} us (in place ok={ok})   separate output {res[1]:8.1f} us")

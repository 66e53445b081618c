import sys, time, numpy as np, onnxruntime as ort
sys.path.insert(0, __import__("os").path.dirname(__file__)); from proto import *
from run_common import *
def feeds2(kind, lengths, q_valid, C):
    if kind == "nonpad": return {"write_index": lengths.astype(np.int64), "nonpad_kv_seqlen": (lengths + S).astype(np.int64)}
    return feeds_for(kind, lengths, q_valid, C)
sessions = {"gqa": sess(model_gqa()), "tensorscatter": sess(model_scatter("tensorscatter")), "nonpad": sess(model_nonpad())}
C0 = 512
for kind in ("nonpad",):
    lengths, q_valid, caches, x = setup(C0, 300)
    ref_y, ref_c = reference(x, caches, lengths, q_valid)
    io, vals, y = bind_common(sessions[kind], caches, {"x": x, **feeds2(kind, lengths, q_valid, C0)})
    sessions[kind].run_with_iobinding(io)
    err_y = max(np.abs(y[r, :q_valid[r]] - ref_y[r, :q_valid[r]]).max() for r in range(B))
    err_c = max(np.abs(caches[j][r, :, :lengths[r] + q_valid[r]] - ref_c[j][r, :, :lengths[r] + q_valid[r]]).max() for j in range(2*L) for r in range(B))
    print(f"{kind}: max|y-ref| valid rows={err_y:.2e}  cache={err_c:.2e}; out ptr {io.get_outputs()[1].data_ptr():x} bound {vals[0].data_ptr():x} numpy {caches[0].ctypes.data:x}")
N = int(sys.argv[1])
configs = [(2304, 256), (8192, 256), (2304, 2048), (8192, 2048)]
prepared = {}
for C, base in configs:
    for kind in sessions:
        lengths, q_valid, caches, x = setup(C, base)
        prepared[(C, base, kind)] = bind_common(sessions[kind], caches, {"x": x, **feeds2(kind, lengths, q_valid, C)}) + (caches,)
res = {k: [] for k in prepared}
for rnd in range(int(__import__("os").environ.get("R", "3"))):
    for k, (io, vals, y, caches) in prepared.items():
        res[k].append(timeit(lambda: sessions[k[2]].run_with_iobinding(io), N))
print(f"per-step ms (min over 3 rounds of the median of {N}), batch {B}, {S} new/row")
for C, base in configs:
    print(f"C={C:5d} len~{base:5d}: " + "  ".join(f"{kind} {min(res[(C, base, kind)]):6.2f}" for kind in sessions))

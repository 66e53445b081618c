"""AOT-build (no GPU) the portable v2 forms with TensorRT-RTX 1.7: does the parser take TensorScatter + Attention(nonpad_kv_seqlen)?"""
import sys, time; sys.path.insert(0, __import__("os").path.dirname(__file__))
import numpy as np, tensorrt_rtx as trt
from proto import model_nonpad, model_scatter, model_gqa, NKV, D, HID
lg = trt.Logger(trt.Logger.WARNING)
def build(name, blob, shapes):
    b = trt.Builder(lg); net = b.create_network(0); p = trt.OnnxParser(net, lg)
    ok = p.parse(blob)
    if not ok:
        print(name, "PARSE FAILED:", [str(p.get_error(i)) for i in range(p.num_errors)][:3]); return
    layers = [net.get_layer(i) for i in range(net.num_layers)]
    kinds = sorted({str(l.type).split(".")[-1] for l in layers})
    cfg = b.create_builder_config(); cfg.num_compute_capabilities = 1; cfg.set_compute_capability(trt.ComputeCapability.SM120, 0)
    prof = b.create_optimization_profile()
    for i in range(net.num_inputs):
        t = net.get_input(i); mn, op, mx = shapes[t.name]; prof.set_shape(t.name, mn, op, mx)
    cfg.add_optimization_profile(prof)
    t0 = time.time(); eng = b.build_serialized_network(net, cfg)
    print(f"{name}: parsed ({len(layers)} layers; kinds {kinds}); build {'OK' if eng else 'FAILED'} in {time.time()-t0:.1f}s"
          + (f", {eng.nbytes/2**20:.1f} MiB" if eng else ""))
    for i in range(net.num_outputs): print("   output", net.get_output(i).name, net.get_output(i).shape)
C = 4096
cache = [(1, NKV, C, D), (4, NKV, C, D), (8, NKV, C, D)]
common = {"x": [(1, 1, HID), (4, 4, HID), (8, 16, HID)], "write_index": [(1,), (4,), (8,)], "nonpad_kv_seqlen": [(1,), (4,), (8,)]}
shapes = dict(common, **{f"past_{n}_{i}": cache for n in ("key", "value") for i in range(2)})
build("TensorScatter + Attention(nonpad_kv_seqlen, is_causal)", model_nonpad(), shapes)
shapes2 = dict(shapes, mask=[(1, 1, 1, C), (4, 1, 4, C), (8, 1, 16, C)])
build("TensorScatter + Attention(bool mask)", model_scatter("tensorscatter"), shapes2)
shapes3 = dict(shapes, seqlens_k=[(1,), (4,), (8,)], total_len=[(), (), ()], query_seqlens=[(1,), (4,), (8,)])
build("com.microsoft GroupQueryAttention (shared buffer)", model_gqa(), shapes3)
# does the parser wire nonpad_kv_seqlen into IAttention.key_value_lengths?
b = trt.Builder(lg); net = b.create_network(0); p = trt.OnnxParser(net, lg); p.parse(model_nonpad())
for i in range(net.num_layers):
    l = net.get_layer(i)
    if "ATTENTION_INPUT" in str(l.type) or "KV_CACHE" in str(l.type):
        print("  layer", l.name, l.type, "inputs:", [l.get_input(j).name if l.get_input(j) is not None else None for j in range(l.num_inputs)])

"""TensorRT-RTX 1.7 network API: KVCacheUpdate (in place into the bound cache) + IAttention with per-row key_value_lengths."""
import tensorrt_rtx as trt
NH, NKV, D, C = 8, 2, 32, 4096
lg = trt.Logger(trt.Logger.WARNING); b = trt.Builder(lg); net = b.create_network(1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED))
H = trt.DataType.HALF
q = net.add_input("q", H, (-1, NH, -1, D)); kn = net.add_input("k_new", H, (-1, NKV, -1, D)); vn = net.add_input("v_new", H, (-1, NKV, -1, D))
kc = net.add_input("k_cache", H, (-1, NKV, C, D)); vc = net.add_input("v_cache", H, (-1, NKV, C, D))
wi = net.add_input("write_index", trt.DataType.INT32, (-1,)); kvl = net.add_input("kv_lengths", trt.DataType.INT32, (-1,))
ku = net.add_kv_cache_update(kc, kn, wi, trt.KVCacheMode.LINEAR); vu = net.add_kv_cache_update(vc, vn, wi, trt.KVCacheMode.LINEAR)
att = net.add_attention_v2(q, ku.get_output(0), vu.get_output(0), trt.AttentionNormalizationOp.SOFTMAX, trt.CausalMaskKind.LOWER_RIGHT)
att.key_value_lengths = kvl
print("attention kv form", att.key_value_form, "causal_kind", att.causal_kind, "kv_lengths set:", att.key_value_lengths is not None)
o = att.get_output(0); o.name = "out"; net.mark_output(o)
for t, n in ((ku.get_output(0), "k_cache_out"), (vu.get_output(0), "v_cache_out")): t.name = n; net.mark_output(t)
cfg = b.create_builder_config(); cfg.num_compute_capabilities = 1; cfg.set_compute_capability(trt.ComputeCapability.SM120, 0)
prof = b.create_optimization_profile()
for n, s in (("q", [(1, NH, 1, D), (4, NH, 4, D), (8, NH, 16, D)]), ("k_new", [(1, NKV, 1, D), (4, NKV, 4, D), (8, NKV, 16, D)]),
             ("v_new", [(1, NKV, 1, D), (4, NKV, 4, D), (8, NKV, 16, D)]), ("k_cache", [(1, NKV, C, D), (4, NKV, C, D), (8, NKV, C, D)]),
             ("v_cache", [(1, NKV, C, D), (4, NKV, C, D), (8, NKV, C, D)]), ("write_index", [(1,), (4,), (8,)]), ("kv_lengths", [(1,), (4,), (8,)])):
    prof.set_shape(n, *s)
cfg.add_optimization_profile(prof)
eng = b.build_serialized_network(net, cfg)
print("build:", "OK %.1f MiB" % (eng.nbytes / 2**20) if eng else "FAILED")

"""The torch backend on a GPU (marked `gpu`; run by scripts/gpu_check.sh): the slot executor with
the real CUDA driver (csrc/cuda_device.cpp) holding every slot buffer, the export's modules running
in PyTorch on its stream. Skipped where PyTorch sees no GPU."""

import pytest
import torch
from factories import SLOT_KINDS, make_dflash2_drafter, make_drafter, make_target, tiny_slots_pair
from no_recent import NoRecent, no_recent_greedy
from reference import reference_output
from scheduler_checks import check_draft_kernels, set_up_per_step, workload

from dflash_trt import LLM, SamplingParams
from dflash_trt.export.moe import is_sparse_moe
from dflash_trt.runtime.batch_runner import BatchRunner

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU that PyTorch sees"),
]

@pytest.fixture(scope="module", params=["dense", "sliding-window", "hybrid", "moe"])
def pair_dirs(core, request, tmp_path_factory):
    if not core.HAS_CUDA_DEVICE:
        pytest.fail("dflash_trt._core was built without the CUDA headers on a GPU machine")
    _, target, draft = tiny_slots_pair(tmp_path_factory.mktemp(request.param), request.param, export=False)
    return target, draft


def run(llm, work, concurrency, speculative=True):
    runner = BatchRunner(llm, max_batch=concurrency, capacity=64, block_size=4)
    requests = [runner.add(prompt, params, speculative=speculative) for _, prompt, params in work]
    while runner.has_work:
        runner.step()
    assert not runner.executor.live_rows
    return [r.token_ids for r in requests]


@pytest.mark.parametrize("concurrency", [1, 8])
def test_greedy_on_cuda_equals_autoregressive_decoding(pair_dirs, concurrency):
    llm = LLM(*pair_dirs, block_size=4, device="cuda", dtype="float32", backend="torch")
    assert llm.target.device.type == "cuda"
    work = workload(llm.vocab_size, 8, seed=concurrency)
    for tokens, (_, prompt, params) in zip(run(llm, work, concurrency), work, strict=True):
        assert tokens == reference_output(llm, prompt, params).token_ids


def test_a_next_turn_on_cuda_reuses_its_slot_and_equals_autoregressive_decoding(pair_dirs):
    """Prefix caching on the GPU: the second request starts with the first's prompt and reply, takes
    its slot with every committed position (moved between places on the device) and prefills the rest."""
    llm = LLM(*pair_dirs, block_size=4, device="cuda", dtype="float32", backend="torch")
    runner = BatchRunner(llm, max_batch=2, capacity=64, block_size=4)
    params = SamplingParams(max_tokens=10, ignore_eos=True)
    (first,) = runner.run([[5, 6, 7, 8, 9]], params)
    runner.run([[9, 8, 7]], params)  # takes the other slot: the first's rows move up a place
    turn = first.prompt_token_ids + first.token_ids + [3]
    (out,) = runner.run([turn], params)
    assert out.metrics.cached_tokens == len(first.prompt_token_ids) + len(first.token_ids) - 1
    assert out.token_ids == reference_output(llm, turn, params).token_ids


@pytest.mark.parametrize("quant", ["int4", "fp8", "nvfp4"])
def test_a_quantized_target_on_cuda_decodes_greedy_as_its_own_autoregressive_decoding(pair_dirs, quant):
    """The slots-trt export's int4 / fp8 / nvfp4 weights (runtime/weight_only.py) held in the format on
    the GPU and dequantized at every call: DFlash on the quantized target equals its own greedy decoding."""
    from dflash_trt.runtime.weight_only import WeightOnlyLinear

    if quant == "int4":  # its codes come from onnxruntime's quantizer, whose imports the GPU image may lack
        pytest.importorskip("onnxruntime.quantization.matmul_nbits_quantizer",
                            reason="onnxruntime's quantizer does not import here (int4 codes)")
    llm = LLM(*pair_dirs, block_size=4, device="cuda", dtype="float32", backend="torch", quant=quant)
    quantized = [m for m in llm.target.model.modules() if isinstance(m, WeightOnlyLinear)]
    assert quantized and all(m.codes.is_cuda for m in quantized)
    work = workload(llm.vocab_size, 8, seed=11)
    for tokens, (_, prompt, params) in zip(run(llm, work, 8), work, strict=True):
        assert tokens == reference_output(llm, prompt, params).token_ids


def test_the_draft_graphs_run_our_kernels_on_cuda(pair_dirs, monkeypatch):
    """InjectKV and BlockAttention (libdflash_trt_plugins.so, built by scripts/gpu_check.sh) inside decoding."""
    from dflash_trt.runtime.cuda_ops import LIBRARY

    if not LIBRARY.is_file():
        pytest.skip(f"{LIBRARY.name} not built (bash scripts/build_plugins.sh)")
    llm = LLM(*pair_dirs, block_size=4, device="cuda", dtype="float32", backend="torch")
    check_draft_kernels(llm, monkeypatch, "auto")


def test_seeded_sampling_on_cuda_gives_the_cpu_executors_tokens(pair_dirs):
    cuda = LLM(*pair_dirs, block_size=4, device="cuda", dtype="float32", backend="torch")
    cpu = LLM(*pair_dirs, block_size=4, device="cpu", backend="torch")
    work = [(0, prompt, SamplingParams(max_tokens=12, temperature=0.8, top_p=0.9, seed=i, ignore_eos=True))
            for i, (_, prompt, _) in enumerate(workload(cpu.vocab_size, 4, seed=7))]
    assert run(cuda, work, 4) == run(cpu, work, 4)


def test_penalties_applied_on_cuda_give_the_reference_and_the_cpu_executors_tokens(pair_dirs):
    """The penalty kernel (dflash_penalize) before the decision kernels: greedy with penalties equals the
    reference loop's penalized autoregressive decoding; seeded T>0 the CPU executor's tokens."""
    cuda = LLM(*pair_dirs, block_size=4, device="cuda", dtype="float32", backend="torch")
    cpu = LLM(*pair_dirs, block_size=4, device="cpu", backend="torch")
    penalties = dict(presence_penalty=1.5, frequency_penalty=0.3, repetition_penalty=1.2, ignore_eos=True)
    prompts = [prompt for _, prompt, _ in workload(cpu.vocab_size, 4, seed=9)]
    greedy = [(0, prompt, SamplingParams(max_tokens=12, **penalties)) for prompt in prompts]
    for tokens, (_, prompt, params) in zip(run(cuda, greedy, 4), greedy, strict=True):
        assert tokens == reference_output(cpu, prompt, params).token_ids
    sampled = [(0, prompt, SamplingParams(max_tokens=12, temperature=0.8, seed=i, **penalties))
               for i, prompt in enumerate(prompts)]
    assert run(cuda, sampled, 4) == run(cpu, sampled, 4)


def test_output_constraints_masked_on_cuda_give_the_reference_and_the_cpu_executors_tokens(core, pair_dirs):
    """Output constraints (csrc/constraint.h; tests/no_recent.py, no grammar library needed) masked by
    dflash_penalize at every verify position: greedy equals the constraint's autoregressive reference,
    seeded T>0 the CPU executor's tokens."""
    cuda = LLM(*pair_dirs, block_size=4, device="cuda", dtype="float32", backend="torch")
    cpu = LLM(*pair_dirs, block_size=4, device="cpu", backend="torch")
    prompts = [prompt for _, prompt, _ in workload(cpu.vocab_size, 4, seed=5)]

    def constrained(llm, **sampling):
        scheduler = BatchRunner(llm, max_batch=4, capacity=64, block_size=4).scheduler
        ids = [scheduler.add_request(prompt, core.RequestParams(max_tokens=12, ignore_eos=True, **sampling,
                                                                constraint=NoRecent(llm.vocab_size, prompt)))
               for prompt in prompts]
        tokens = {i: [] for i in ids}
        while scheduler.has_work:
            for out in scheduler.step():
                tokens[out["request"]] += out["new_tokens"]
        return [tokens[i] for i in ids]

    assert constrained(cuda) == [no_recent_greedy(cpu.target, prompt, 12) for prompt in prompts]
    assert constrained(cuda, temperature=0.8, seed=3) == constrained(cpu, temperature=0.8, seed=3)


def test_prompt_logprobs_scored_on_cuda_equal_the_cpu_executors(pair_dirs):
    """A prefill row asking for prompt logprobs has every position scored on the device by the
    decided-logprobs kernel (chunked: each chunk's last position by the next chunk's first token), beside
    a row that does not ask: the CPU executor's tokens and entries (float32)."""
    cuda = LLM(*pair_dirs, block_size=4, device="cuda", dtype="float32", backend="torch", prefill_chunk=3)
    cpu = LLM(*pair_dirs, block_size=4, device="cpu", backend="torch", prefill_chunk=3)
    prompts = [prompt for _, prompt, _ in workload(cpu.vocab_size, 2, seed=7)]
    params = [SamplingParams(max_tokens=8, ignore_eos=True, repetition_penalty=1.3, prompt_logprobs=3),
              SamplingParams(max_tokens=8, ignore_eos=True)]
    ours, theirs = cuda.generate(prompts, params), cpu.generate(prompts, params)
    assert [o.token_ids for o in ours] == [o.token_ids for o in theirs]
    assert ours[1].prompt_logprobs is None and ours[0].prompt_logprobs[0] is None
    for mine, want in zip(ours[0].prompt_logprobs[1:], theirs[0].prompt_logprobs[1:], strict=True):
        assert list(mine) == list(want)
        assert all(abs(mine[t] - want[t]) < 1e-4 for t in mine)


def test_bfloat16_on_cuda_decodes_and_frees_its_slots(pair_dirs):
    free_before = torch.cuda.mem_get_info()[0]
    llm = LLM(*pair_dirs, block_size=4, device="cuda", backend="torch")
    assert llm.dtype == torch.bfloat16
    work = workload(llm.vocab_size, 4, seed=3)
    assert all(run(llm, work, 4))
    del llm
    torch.cuda.synchronize()
    # the executor's cuMemAlloc'd slots went with it (torch's own cache is emptied to compare)
    torch.cuda.empty_cache()
    assert torch.cuda.mem_get_info()[0] >= free_before - (64 << 20)


def test_bfloat16_dflash_on_cuda_equals_the_same_engines_plain_decoding(pair_dirs):
    """Lossless where users run it: bfloat16 on a GPU, a request alone, greedy DFlash (verifies of 4 tokens)
    gives the plain greedy decoding of the same executor (steps of 1 token), though the two run other
    matmul shapes. (Batched with other requests, bfloat16 tokens may move with the batch: README, Status.)"""
    llm = LLM(*pair_dirs, block_size=4, device="cuda", backend="torch")
    assert llm.dtype == torch.bfloat16
    work = workload(llm.vocab_size, 8, seed=13)
    assert run(llm, work, 1) == run(llm, work, 1, speculative=False)


def test_cuda_graphs_replay_what_eager_decoding_gives(pair_dirs):
    graphed = LLM(*pair_dirs, block_size=4, device="cuda", dtype="float32", backend="torch")
    work = workload(graphed.vocab_size, 8, seed=11)
    tokens = run(graphed, work, 4)
    assert graphed.graph_stats["captured"] > 0 and graphed.graph_stats["replayed"] > 0, graphed.graph_stats
    eager = LLM(*pair_dirs, block_size=4, device="cuda", dtype="float32", backend="torch", enforce_eager=True)
    assert run(eager, work, 4) == tokens
    assert eager.graph_stats["captured"] == 0


def test_hybrid_and_moe_targets_take_our_kernels_for_their_own_ops(pair_dirs):
    """float32 at head_dim 16: the attention stays PyTorch's (the BlockAttention kernel's tensor-core form
    takes 16-bit heads of 128 only)."""
    from dflash_trt.runtime.cuda_ops import LIBRARY

    if not LIBRARY.is_file():
        pytest.skip(f"{LIBRARY.name} not built (bash scripts/build_plugins.sh)")
    llm = LLM(*pair_dirs, block_size=4, device="cuda", dtype="float32", backend="torch")
    llm.executor(1, 64)
    moe = any(is_sparse_moe(module) for module in llm.target.model.modules())
    assert llm.target_kernels == (("GatedDeltaRule",) if llm.target.is_stateful else ()) + (("MoE",) if moe else ())


def test_the_targets_attention_through_our_kernel_decodes_as_autoregressive(pair_dirs, monkeypatch):
    """Every shape the kernel takes (TARGET_ATTENTION_KERNEL True: its float32 CUDA-core form here), in
    captured decoding at concurrency 8: greedy equals autoregressive decoding."""
    from dflash_trt.runtime import torch_graphs
    from dflash_trt.runtime.cuda_ops import LIBRARY

    if not LIBRARY.is_file():
        pytest.skip(f"{LIBRARY.name} not built (bash scripts/build_plugins.sh)")
    monkeypatch.setattr(torch_graphs, "TARGET_ATTENTION_KERNEL", True)
    llm = LLM(*pair_dirs, block_size=4, device="cuda", dtype="float32", backend="torch")
    work = workload(llm.vocab_size, 8, seed=17)
    for tokens, (_, prompt, params) in zip(run(llm, work, 8), work, strict=True):
        assert tokens == reference_output(llm, prompt, params).token_ids
    assert llm.target_kernels[:1] == ("BlockAttention",) and llm.graph_stats["replayed"] > 0


@pytest.mark.parametrize("kind", ["dense", "sliding-window"])
def test_bfloat16_heads_of_128_attend_through_our_kernel_as_they_decode_plainly(tmp_path, kind):
    """The default on a GPU where the kernel's tensor-core form runs (bfloat16, head_dim 128): the target's
    decode and verify attention is BlockAttention's, and a request alone decodes the same greedy tokens
    with DFlash (verifies of 4) as plainly (steps of 1), CUDA-graphed."""
    from dflash_trt.runtime.cuda_ops import LIBRARY

    if not LIBRARY.is_file():
        pytest.skip(f"{LIBRARY.name} not built (bash scripts/build_plugins.sh)")
    config = {k: v for k, v in SLOT_KINDS[kind].items() if k != "family"}
    target = make_target(tmp_path / "qwen3", "qwen3", head_dim=128, **config)
    draft = make_drafter(tmp_path / "draft", block_size=4, target_layer_ids=[1, 2])
    llm = LLM(str(target), str(draft), block_size=4, device="cuda", backend="torch")
    assert llm.dtype == torch.bfloat16
    work = workload(llm.vocab_size, 8, seed=19)
    assert run(llm, work, 1) == run(llm, work, 1, speculative=False)
    assert llm.target_kernels[:1] == ("BlockAttention",) and llm.graph_stats["replayed"] > 0


def slot_attention_case(dtype, window, generator):
    """Random slot-attention inputs on CUDA: 3 ragged rows (garbage past each length), grouped heads, head
    dim 128 (the tensor-core form in 16-bit dtypes) -> (query, key, value, caches, cache_lengths,
    query_lengths, heads, kv, scale, window)."""
    b, s, capacity, heads, kv, d = 3, 16, 300, 8, 2, 128
    query = torch.randn(b, s, heads * d, device="cuda", generator=generator).to(dtype)
    key, value = (torch.randn(b, s, kv * d, device="cuda", generator=generator).to(dtype) for _ in range(2))
    caches = [torch.randn(b, kv, capacity, d, device="cuda", generator=generator).to(dtype) for _ in range(2)]
    lengths = torch.tensor([200, 0, 37], device="cuda"), torch.tensor([16, 5, 1], device="cuda")
    return query, key, value, caches, *lengths, heads, kv, d ** -0.5, window


@pytest.mark.parametrize("window", [0, 50])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_targets_attention_kernel_reads_each_rows_length_when_replayed(dtype, window):
    """The target's decode-sized attention through our BlockAttention kernel equals the SDPA form on the
    same inputs, and a CUDA graph captured at some lengths, replayed after they change on the device,
    gives the new lengths' attention (the SDPA form's capture spans the whole capacity for this reason)."""
    from dflash_trt.runtime.cuda_ops import LIBRARY, register_cuda_kernels
    from dflash_trt.runtime.torch_graphs import InPlaceSlotAttention

    if not LIBRARY.is_file():
        pytest.skip(f"{LIBRARY.name} not built (bash scripts/build_plugins.sh)")
    assert register_cuda_kernels()
    query, key, value, caches, cache_lengths, query_lengths, *rest = slot_attention_case(
        dtype, window, torch.Generator(device="cuda").manual_seed(0))
    tolerance = dict(rtol=2e-2, atol=2e-2) if dtype == torch.bfloat16 else dict(rtol=1e-4, atol=1e-4)

    def attend(kernel, lengths, in_place):
        return InPlaceSlotAttention(kernel=kernel)(query, key, value, *in_place, *lengths, *rest)

    with torch.inference_mode():
        want = attend(False, (cache_lengths, query_lengths), [c.clone() for c in caches])
        got = attend(True, (cache_lengths, query_lengths), [c.clone() for c in caches])
        torch.testing.assert_close(got[0], want[0], **tolerance)
        assert all(torch.equal(g, w) for g, w in zip(got[1:], want[1:]))
        # captured at these lengths, replayed at others written into the same tensors
        lengths = (cache_lengths.clone(), query_lengths.clone())
        in_place = [c.clone() for c in caches]
        graph = torch.cuda.CUDAGraph()
        attend(True, lengths, in_place)  # warm up (workspace, registration) off the capture
        for c, original in zip(in_place, caches):
            c.copy_(original)
        with torch.cuda.graph(graph):
            captured = attend(True, lengths, in_place)
        for c, original in zip(in_place, caches):
            c.copy_(original)
        lengths[0].copy_(torch.tensor([7, 284, 100], device="cuda"))
        lengths[1].copy_(torch.tensor([3, 16, 9], device="cuda"))
        graph.replay()
        want = attend(False, lengths, [c.clone() for c in caches])
        torch.testing.assert_close(captured[0], want[0], **tolerance)
        assert all(torch.equal(g, w) for g, w in zip(captured[1:], want[1:]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("s, kept", [(17, [[0, 5, 16], [3, 3, 9], [16, 1, 0]]), (17, [[16], [12], [9]]),
                                     (77, [[76], [76], [76]]), (77, [[76], [40], [12]])],
                         ids=["from-0", "from-9", "chunked-prefill", "ragged-chunked-prefill"])
def test_the_gated_delta_rule_kernel_equals_the_ops_reference_body(dtype, s, kept):
    """dflash::delta_rule_at on CUDA (our kernel, runtime/cuda_ops.py) against the op's PyTorch body on the
    same inputs: ragged kept positions, grouped key heads; kept positions from 0, and a prefill's (one a
    row: where the longest reaches a chunk, each group of rows scans to its own kept position keeping
    that state alone, then its padding; 32 tokens or more: the chunked form, gated_delta_chunks.h)."""
    from dflash_trt.export.delta_rule import delta_rule_scan_at
    from dflash_trt.runtime.cuda_ops import LIBRARY, register_target_kernels

    if not LIBRARY.is_file():
        pytest.skip(f"{LIBRARY.name} not built (bash scripts/build_plugins.sh)")
    assert register_target_kernels()
    g = torch.Generator(device="cuda").manual_seed(0)
    b, hk, hv, dk, dv = 3, 2, 4, 32, 24
    query, key = (torch.randn(b, s, hk, dk, device="cuda", generator=g).to(dtype) for _ in range(2))
    value = torch.randn(b, s, hv, dv, device="cuda", generator=g).to(dtype)
    gate = -torch.rand(b, s, hv, device="cuda", generator=g)
    beta = torch.rand(b, s, hv, device="cuda", generator=g).to(dtype)
    state = torch.randn(b, hv, dk, dv, device="cuda", generator=g)
    positions = torch.tensor(kept, device="cuda")
    out, states = torch.ops.dflash.delta_rule_at(query, key, value, gate, beta, state, positions)
    want_out, want_states = delta_rule_scan_at(query, key, value, gate, beta, state, positions)
    tolerance = dict(rtol=2e-2, atol=2e-2) if dtype == torch.bfloat16 else dict(rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(out, want_out, **tolerance)
    torch.testing.assert_close(states, want_states, rtol=1e-4, atol=1e-4)


def test_a_dflash2_drafter_decodes_on_cuda_through_our_draft_kernels(tmp_path, monkeypatch):
    """DFlash2's convolutions and selector around our InjectKV/BlockAttention kernels, CUDA-graphed."""
    from dflash_trt.runtime.cuda_ops import LIBRARY

    if not LIBRARY.is_file():
        pytest.skip(f"{LIBRARY.name} not built (bash scripts/build_plugins.sh)")
    target = make_target(tmp_path / "qwen3", "qwen3")
    draft = make_dflash2_drafter(tmp_path / "draft", seed=3, block_size=4, target_layer_ids=[1, 2])
    llm = LLM(str(target), str(draft), block_size=4, device="cuda", dtype="float32", backend="torch")
    check_draft_kernels(llm, monkeypatch, "auto")


@pytest.mark.parametrize("method", ["draft-vocabulary", "dflash2"])
def test_the_drafter_rule_decided_on_cuda_gives_the_cpu_executors_tokens(tiny_pairs, tmp_path, method):
    """draft_rule="drafter" on the GPU: drafts drawn by dflash_draw_drafts from the block pass's logits (a
    draft vocabulary's columns) or a DFlash2 selector's scores, each draft tested against the target by
    dflash_target_tokens, q never leaving the device; seeded sampled rows and a greedy row in one batch
    get the CPU executor's tokens (float32)."""
    if method == "dflash2":
        target = str(make_target(tmp_path / "qwen3", "qwen3"))
        draft = str(make_dflash2_drafter(tmp_path / "draft", seed=3, block_size=4, target_layer_ids=[1, 2]))
    else:
        target, draft = map(str, tiny_pairs["llama"])
    cuda = LLM(target, draft, block_size=4, device="cuda", dtype="float32", backend="torch", draft_rule="drafter")
    cpu = LLM(target, draft, block_size=4, device="cpu", backend="torch", draft_rule="drafter")
    params = [SamplingParams(max_tokens=12, temperature=0.8, top_p=0.9, seed=i, ignore_eos=True) for i in range(3)]
    params.append(SamplingParams(max_tokens=12, ignore_eos=True))
    work = [(0, prompt, p) for (_, prompt, _), p in zip(workload(cpu.vocab_size, 4, seed=5), params, strict=True)]
    assert run(cuda, work, 4) == run(cpu, work, 4)


def test_captured_graphs_share_one_memory_pool_and_replay_in_any_order():
    """GraphMemory: four captured shapes, each with 64 MiB of scratch, reserve about one shape's scratch,
    not four; replayed in another order than captured, each still writes its own outputs."""
    from dflash_trt.runtime.torch_graphs import TorchGraph

    scratch = 16 << 20  # floats: 64 MiB

    class Scratch(torch.nn.Module):
        def forward(self, input_ids, x):
            t = torch.full((scratch,), 2.0, device=x.device)
            return (x * t[:x.numel()].view_as(x) + input_ids.to(x.dtype),)

    stream = torch.cuda.Stream()  # as the executor's own: a capture cannot run on the default stream
    graph = TorchGraph(Scratch(), ["input_ids", "x"], ["y"], torch.device("cuda"), stream, graphed=True)
    with torch.cuda.stream(stream):
        tensors = {rows: (torch.full((rows, 4), rows, dtype=torch.int64, device="cuda"),
                          torch.rand(rows, 4, device="cuda"), torch.zeros(rows, 4, device="cuda"))
                   for rows in (1, 2, 3, 4)}

        def bindings(rows):
            ids, x, y = tensors[rows]
            return ({"input_ids": (ids.data_ptr(), "int64", (rows, 4)),
                     "x": (x.data_ptr(), "float32", (rows, 4))}, {"y": (y.data_ptr(), "float32", (rows, 4))})

        graph.run("warm", *bindings(1))  # eager: its scratch comes from the ordinary pool
        stream.synchronize()
        reserved = torch.cuda.memory_reserved()
        for rows in (1, 2, 3, 4):
            for _ in range(2):  # eager (rows 1: seen above), then captured and replayed
                graph.run("capture", *bindings(rows))
        assert graph.stats["captured"] == 4
        stream.synchronize()
        assert torch.cuda.memory_reserved() - reserved < 2 * scratch * 4, "the captures share their scratch"
        for rows in (4, 2, 3, 1, 4):
            ids, x, y = tensors[rows]
            x.copy_(torch.rand_like(x))
            graph.run("replay", *bindings(rows))
            stream.synchronize()
            torch.testing.assert_close(y, x * 2 + rows)
    assert graph.stats["replayed"] >= 9


def test_a_bindings_first_run_and_its_capture_pay_set_up_and_its_replays_none(pair_dirs):
    """executor.set_up_runs on CUDA (what the scheduler leaves out of its cost model): the draft block, the
    target and the draft context pass each run once eagerly, then are captured (or, where a run cannot
    be, tried once); after that (same rows, same block, the draft context within one length bucket)
    every run replays, or runs eagerly without set-up."""
    llm = LLM(*pair_dirs, block_size=4, device="cuda", dtype="float32", backend="torch")
    executor = llm.executor(2, 64)
    executor.prefill_logits([0, 1], [[3, 1, 4], [2, 7]])
    paid = set_up_per_step(executor, [0, 1], [1, 2], 6)
    assert paid[-2:] == [0, 0] and paid[0] > 0 and paid[1] > 0, paid

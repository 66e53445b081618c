"""The torch backend's executor (runtime/torch_graphs.py): the C++ slot executor over the export's
contract-2 modules run in PyTorch (csrc/py_graph.h), on the host here.

Checked against two independent things: the reference dflash::slot_attention op (what the exporters
lower) for the in-place attention, and the onnxruntime executor over the same pair's slots bundle
for every phase (a different runtime running the exported graphs). Greedy equality with
autoregressive decoding is in test_staggered_slots.py and test_scheduler.py."""

import ctypes.util

import numpy as np
import pytest
import torch
from factories import SLOT_KINDS, make_dflash2_drafter, make_target, tiny_slots_pair
from reference import reference_output
from scheduler_checks import check_batched_greedy, check_draft_kernels, set_up_per_step, workload

from dflash_trt import LLM
from dflash_trt.errors import DFlashError
from dflash_trt.export.slot_ops import slot_attention
from dflash_trt.runtime.batch_runner import BatchRunner
from dflash_trt.runtime.ort_executor import SlotBundle
from dflash_trt.runtime.torch_graphs import InPlaceSlotAttention

@pytest.mark.parametrize("kernel", [False, True], ids=["sdpa", "block-attention-op"])
@pytest.mark.parametrize("window", [0, 3])
def test_in_place_attention_equals_the_reference_op(window, kernel):
    """Ragged rows (5, 0 and 9 cached; 4, 2 and 0 new: the last is idle), garbage past each length; with
    `kernel`, through dflash::block_attention's reference body (its CUDA kernel's oracle in kernel_parity):
    the slot attention's contract mapped onto the block attention's."""
    g = torch.Generator().manual_seed(0)
    b, s, capacity, heads, kv, d = 3, 4, 16, 4, 2, 8
    query = torch.randn(b, s, heads * d, generator=g)
    key, value = (torch.randn(b, s, kv * d, generator=g) for _ in range(2))
    caches = [torch.randn(b, kv, capacity, d, generator=g) * 100 for _ in range(2)]
    cache_lengths, query_lengths = torch.tensor([5, 0, 9]), torch.tensor([4, 2, 0])
    args = (cache_lengths, query_lengths, heads, kv, d ** -0.5, window)
    want, want_key, want_value = slot_attention(query, key, value, *caches, *args)
    in_place = [c.clone() for c in caches]
    out, got_key, got_value = InPlaceSlotAttention(kernel=kernel)(query, key, value, *in_place, *args)
    assert got_key is in_place[0] and got_value is in_place[1], "the caches are written where they are"
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)
    assert torch.equal(got_key, want_key) and torch.equal(got_value, want_value)


@pytest.fixture(scope="module", params=list(SLOT_KINDS))
def pair(core, request, tmp_path_factory):
    """(slots bundle, torch LLM over the same pair)."""
    if not core.HAS_ORT_EXECUTOR:
        pytest.skip("dflash_trt._core was built without the onnxruntime executor (see csrc/README.md, Build)")
    bundle, target, draft = tiny_slots_pair(tmp_path_factory.mktemp(request.param), request.param)
    return bundle, LLM(target, draft, block_size=4, backend="torch")


def test_every_phase_equals_the_onnxruntime_executors_on_the_same_pair(pair):
    """Prefill two rows, draft, verify, commit part of each block, prefill a third row beside them,
    then draft and verify all three: logits within float32 rounding, the same draft tokens."""
    bundle, llm = pair
    executors = [SlotBundle(bundle).executor(3, 64), llm.executor(3, 64)]
    assert executors[1].backend_version == torch.__version__
    prompts = {0: [3, 1, 4, 1, 5], 2: [9, 2, 6, 5, 3, 5, 8, 9, 7]}

    def both(call, *args):
        return [getattr(e, call)(*args) for e in executors]

    def close(pair_of_logits):
        for want, got in zip(*pair_of_logits, strict=True):
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)

    close(both("prefill_logits", [0, 2], [prompts[0], prompts[2]]))
    for rows, bonus, kept in (([0, 2], [7, 11], [2, 0]), ([0, 1, 2], [4, 5, 6], [1, 3, 4])):
        if rows == [0, 1, 2]:
            close(both("prefill_logits", [1], [[2, 7, 1, 8]]))
        ort_drafts, torch_drafts = both("draft", rows, bonus, 4)
        assert torch_drafts == ort_drafts
        close(both("verify_logits", rows, [[t, *d] for t, d in zip(bonus, ort_drafts, strict=True)]))
        both("commit", rows, kept)
        assert [executors[0].committed(r) for r in rows] == [executors[1].committed(r) for r in rows]


@pytest.mark.parametrize("kind", list(SLOT_KINDS))
def test_bfloat16_dflash_of_a_request_alone_equals_its_plain_decoding(kind, tmp_path):
    """In bfloat16 (the GPU's default dtype; here PyTorch's CPU kernels) a request alone decodes the same
    greedy tokens with DFlash (verifies of 4 tokens) as plainly (steps of 1), though the target's matmuls
    then have other shapes. Batched with other requests, bfloat16 tokens may move with the batch (a row's
    attention spans the batch's longest row: README, Status): not asserted."""
    _, target, draft = tiny_slots_pair(tmp_path, kind, export=False)
    llm = LLM(target, draft, block_size=4, device="cpu", dtype="bfloat16", backend="torch")
    work = workload(llm.vocab_size, 8, seed=13)

    def run(speculative):
        runner = BatchRunner(llm, max_batch=1, capacity=64, block_size=4)
        requests = [runner.add(prompt, params, speculative=speculative) for _, prompt, params in work]
        while runner.has_work:
            runner.step()
        return [r.token_ids for r in requests]

    assert run(True) == run(False)


def test_a_target_without_a_drafter_decodes_plainly_as_autoregressive(tmp_path):
    llm = LLM(str(make_target(tmp_path / "qwen3", "qwen3")), draft=None, backend="torch")
    work = workload(llm.vocab_size, 4, seed=5)
    runner = BatchRunner(llm, max_batch=2, capacity=64)
    requests = [runner.add(prompt, params) for _, prompt, params in work]
    while runner.has_work:
        runner.step()
    for request, (_, prompt, params) in zip(requests, work, strict=True):
        assert request.token_ids == reference_output(llm, prompt, params).token_ids
    assert not runner.executor.live_rows


def test_a_device_it_cannot_use_is_refused_in_one_line(pair, core):
    from dflash_trt.runtime import torch_graphs

    _, llm = pair
    config = llm.executor(1, 64).config
    with pytest.raises(DFlashError, match=r"the torch graph executor: unknown device 'tpu' \(cpu or cuda\)"):
        core.PyGraphExecutor(config, None, "tpu")
    if core.HAS_CUDA_DEVICE and not ctypes.util.find_library("cuda"):
        graphs = torch_graphs.TorchGraphs(llm, torch_graphs.graph_specs(llm, "float32"), torch.device("cpu"))
        with pytest.raises(DFlashError, match=r"the torch graph executor needs an NVIDIA GPU and its driver"):
            core.PyGraphExecutor(config, graphs, "cuda")



def test_the_plugin_flavours_draft_graphs_fit_the_slot_executor(pair, monkeypatch):
    """The draft graphs as dflash:: ops (what a GPU runs through our kernels, runtime/cuda_ops.py), here
    on the ops' PyTorch reference bodies: the standard graphs' drafts, and greedy = autoregressive."""
    _, llm = pair
    llm.executor(1, 64)
    assert llm.draft_kernels == ()  # on the CPU "auto" keeps the standard graphs
    check_draft_kernels(llm, monkeypatch, True)


def test_the_plugin_flavours_draft_graphs_run_a_dflash2_drafter(tmp_path, monkeypatch):
    """DFlash2's in-block convolutions around the dflash:: ops and its selector walk after them: on the
    ops' PyTorch reference bodies, the standard graphs' drafts, and greedy = autoregressive."""
    target = make_target(tmp_path / "qwen3", "qwen3")
    draft = make_dflash2_drafter(tmp_path / "draft", seed=3, block_size=4, target_layer_ids=[1, 2])
    llm = LLM(str(target), str(draft), block_size=4, backend="torch")
    assert llm.drafter.config.method == "dflash2"
    check_draft_kernels(llm, monkeypatch, True)


def test_the_targets_attention_through_the_block_attention_op_decodes_as_autoregressive(pair, monkeypatch):
    """The target's decode-sized runs through dflash::block_attention (what a GPU runs through our
    BlockAttention kernel), here on the op's reference body: each phase's logits equal the SDPA form's, and
    greedy output equals autoregressive decoding at concurrency 3 (sliding windows and hybrids included)."""
    from dflash_trt.runtime import torch_graphs

    _, llm = pair
    monkeypatch.setattr(torch_graphs, "TARGET_ATTENTION_KERNEL", False)
    standard = llm.executor(2, 64)
    assert "BlockAttention" not in llm.target_kernels
    monkeypatch.setattr(torch_graphs, "TARGET_ATTENTION_KERNEL", True)
    kernel = llm.executor(2, 64)
    assert llm.target_kernels[:1] == ("BlockAttention",)
    executors = (standard, kernel)

    def close(call, *args):
        want, got = (getattr(e, call)(*args) for e in executors)
        for w, g in zip(want, got, strict=True):
            np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)

    close("prefill_logits", [0, 1], [[3, 1, 4, 1, 5, 9, 2], [2, 7, 1]])
    for block, kept in (([[7, 1, 2, 3], [11, 4]], [2, 0]), ([[4, 5, 6, 7], [5]], [3, 1])):
        close("verify_logits", [0, 1], block)
        for e in executors:
            e.commit([0, 1], kept)
    check_batched_greedy(llm, 5, seed=21)


def test_eager_attention_spans_recur_on_a_gpu_and_are_exact_on_the_cpu():
    from dflash_trt.runtime.torch_graphs import SPAN_BUCKET, attention_span

    assert [attention_span(n, 1000, cuda=False) for n in (0, 1, 129, 1000)] == [1, 1, 129, 1000]
    assert [attention_span(n, 1000, cuda=True) for n in (1, SPAN_BUCKET, SPAN_BUCKET + 1, 999)] == [
        SPAN_BUCKET, SPAN_BUCKET, 2 * SPAN_BUCKET, 1000]  # never past the capacity


def test_the_eager_gpu_attention_form_reads_each_query_heads_own_kv_head():
    """attend's form for eager GPU runs (kv heads repeated, cuDNN's attention excluded; on the CPU it
    takes SDPA's math kernel) equals the grouped-query form on the same inputs, the masked slots too."""
    from dflash_trt.runtime.torch_graphs import attend

    g = torch.Generator().manual_seed(1)
    b, heads, kv, s, span, d = 2, 6, 2, 5, 11, 8
    q = torch.randn(b, heads, s, d, generator=g)
    k, v = (torch.randn(b, kv, span, d, generator=g) for _ in range(2))
    mask = torch.rand(b, 1, s, span, generator=g) < 0.6
    mask[..., 0] = True  # every query sees a key
    want = attend(q, k, v, mask, 0.3, eager_gpu=False)
    torch.testing.assert_close(attend(q, k, v, mask, 0.3, eager_gpu=True), want, rtol=1e-5, atol=1e-6)
    # a kv head read by the wrong query heads would not be: heads 0-2 read kv head 0, 3-5 kv head 1
    swapped = attend(q, k.flip(1), v.flip(1), mask, 0.3, eager_gpu=True)
    assert not torch.allclose(swapped, want, atol=1e-3)


def test_a_ragged_prefill_keeps_each_rows_state_through_scans_that_keep_only_their_last():
    """runtime/cuda_ops.scan_by_kept_position (how the GatedDeltaRule kernel runs a prefill of rows of
    different lengths: each group of rows scans up to its own last token keeping that state alone, then its
    padding from there) over the reference scan equals delta_rule_scan_at, outputs and kept states: rows
    keeping the last position, the first, and a shared middle one."""
    from dflash_trt.export.delta_rule import delta_rule_scan, delta_rule_scan_at
    from dflash_trt.runtime.cuda_ops import scan_by_kept_position

    calls = []

    def reference_scan(query, key, value, g, beta, state, first):
        calls.append((query.shape[0], query.shape[1], first))
        return delta_rule_scan(query, key, value, g, beta, state, torch.tensor(first))

    gen = torch.Generator().manual_seed(2)
    b, s, hk, hv, dk, dv = 4, 9, 1, 2, 8, 4
    query, key = (torch.randn(b, s, hk, dk, generator=gen) for _ in range(2))
    value = torch.randn(b, s, hv, dv, generator=gen)
    gate, beta = -torch.rand(b, s, hv, generator=gen), torch.rand(b, s, hv, generator=gen)
    state = torch.randn(b, hv, dk, dv, generator=gen)
    kept = [8, 4, 0, 4]
    out, states = scan_by_kept_position(reference_scan, query, key, value, gate, beta, state, kept)
    want_out, want_states = delta_rule_scan_at(query, key, value, gate, beta, state, torch.tensor(kept)[:, None])
    torch.testing.assert_close(out, want_out, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(states, want_states, rtol=1e-6, atol=1e-6)
    # (rows, tokens, states_from) of each scan: a group's tokens up to its kept position, keeping that state
    # alone, then the rest of its tokens (for their outputs) keeping their last
    assert calls == [(1, 1, 0), (1, 8, 7), (2, 5, 4), (2, 4, 3), (1, 9, 8)]


def test_a_cuda_graph_is_keyed_on_every_binding_and_only_for_decode_sized_runs():
    """TorchGraph's capture key (the replay is only valid for the same addresses, dtypes and shapes), as
    the executor hands bindings over: name -> (address, dtype, shape tuple) in name order."""
    from dflash_trt.runtime.torch_graphs import GRAPHED_TOKENS, TorchGraph

    graph = TorchGraph(torch.nn.Identity(), ["input_ids", "x"], ["y"], torch.device("cpu"), None, graphed=True)
    inputs = {"input_ids": (64, "int64", (2, 4)), "x": (128, "float32", (2, 4, 8))}
    outputs = {"y": (256, "float32", (2, 4, 8))}
    key = graph._graph_key(inputs, outputs)
    assert key == graph._graph_key(dict(inputs), dict(outputs)) and hash(key) == hash(graph._graph_key(inputs, outputs))
    for changed in ({"x": (192, "float32", (2, 4, 8))}, {"x": (128, "bfloat16", (2, 4, 8))},
                    {"x": (128, "float32", (3, 4, 8))}):
        assert graph._graph_key({**inputs, **changed}, outputs) != key
    assert graph._graph_key({**inputs, "input_ids": (64, "int64", (2, GRAPHED_TOKENS + 1))}, outputs) is None
    # the executor's number for the bindings (csrc/py_graph.cpp) keys them where it gives one; -1: eager
    assert graph._graph_key(inputs, outputs, 5) == 5 and graph._graph_key(inputs, outputs, -1) is None


def test_a_graphed_run_pays_set_up_on_its_first_run_and_capture_an_eager_one_on_its_shapes_first(pair):
    """What TorchGraph.run answers the executor (its set_up_runs): ungraphed, the first run of its token and
    index inputs' shapes (as onnxruntime's; the draft context growing each step is no new shape); graphed,
    a binding's first run and its capture, its replays none. On the CPU the graphed path is driven through
    its bookkeeping with the capture stubbed (no CUDA graphs here)."""
    from dflash_trt.runtime.torch_graphs import GRAPHED_TOKENS, TorchGraph

    _, llm = pair
    executor = llm.executor(3, 64)
    executor.prefill_logits([0, 1], [[3, 1, 4, 1, 5], [2, 7]])  # [2, 5] tokens: no verify's shape
    assert set_up_per_step(executor, [0, 1], [7, 11], 3) == [3, 0, 0]  # the draft block, the target and the draft context passes' first [2, 4]

    class Replayed:
        def replay(self):
            pass

    graph = TorchGraph(torch.nn.Identity(), ["input_ids"], ["y"], torch.device("cpu"), None, graphed=True)
    graph._capture = lambda key, *_: graph._graphs.update({key: Replayed()}) or True
    ids = torch.zeros(2, 4, dtype=torch.int64)
    out = torch.zeros(2, 4, dtype=torch.int64)
    bound = ({"input_ids": (ids.data_ptr(), "int64", (2, 4))}, {"y": (out.data_ptr(), "int64", (2, 4))})
    assert [graph.run("step", *bound, 0) for _ in range(4)] == [True, True, False, False]
    assert graph.stats == {"eager": 1, "replayed": 3}
    long = (1, GRAPHED_TOKENS + 1)
    ids, out = torch.zeros(long, dtype=torch.int64), torch.zeros(long, dtype=torch.int64)
    prefill = ({"input_ids": (ids.data_ptr(), "int64", long)}, {"y": (out.data_ptr(), "int64", long)})
    assert [graph.run("prefill", *prefill, 1) for _ in range(2)] == [True, False]  # never graphed: its shapes


def test_the_executor_numbers_each_set_of_bindings_the_same_every_time_it_recurs(pair, monkeypatch):
    """csrc/py_graph.cpp hands a graph the same number (and the same dicts) whenever it binds the same
    memory, dtypes and shapes, and another number otherwise: what a captured graph is keyed on."""
    from dflash_trt.runtime.torch_graphs import TorchGraph

    calls = []
    run = TorchGraph.run

    def recording(graph, what, inputs, outputs, bindings=None):
        calls.append((id(graph), bindings, tuple(inputs.items()), tuple(outputs.items()), id(inputs)))
        run(graph, what, inputs, outputs, bindings)

    monkeypatch.setattr(TorchGraph, "run", recording)
    _, llm = pair
    executor = llm.executor(3, 64)
    executor.prefill_logits([0, 1, 2], [[3, 1, 4, 1, 5], [2, 7], [9, 2, 6]])
    for rows, bonus in (([0, 2], [7, 11]), ([0, 2], [4, 5]), ([0, 1, 2], [4, 5, 6]), ([0, 2], [6, 3])):
        drafts = executor.draft(rows, bonus, 4)
        executor.verify_logits(rows, [[t, *d] for t, d in zip(bonus, drafts, strict=True)])
        executor.commit(rows, [1] * len(rows))
    numbered = {}
    for graph, bindings, inputs, outputs, dicts in calls:
        assert isinstance(bindings, int)
        numbered.setdefault((graph, bindings), set()).add((inputs, outputs, dicts))
    assert all(len(seen) == 1 for seen in numbered.values()), "one number, one set of bindings (one dict)"
    sets = {(graph, inputs, outputs) for graph, _, inputs, outputs, _ in calls}
    assert len(sets) == len(numbered) < len(calls), "a set that recurs keeps its number"


@pytest.mark.parametrize("kind", ["moe", "hybrid-moe"])
def test_sparse_moe_blocks_in_the_exported_form_decode_as_autoregressive(kind, tmp_path, monkeypatch):
    """torch_graphs.ROUTED_MOE: on a GPU a sparse MoE block runs as the export writes it (fixed shapes and
    no host sync, so its target is CUDA-graphed); forced here on the CPU, decoding is still greedy =
    autoregressive (HF's own blocks), and the exported form is what ran."""
    from dflash_trt.export.moe import RoutedMoE
    from dflash_trt.runtime import torch_graphs

    calls = []
    forward = RoutedMoE.forward
    monkeypatch.setattr(RoutedMoE, "forward", lambda self, hidden: calls.append(1) or forward(self, hidden))
    monkeypatch.setattr(torch_graphs, "ROUTED_MOE", True)
    _, target, draft = tiny_slots_pair(tmp_path, kind, export=False)
    llm = LLM(target, draft, block_size=4, backend="torch")
    work = workload(llm.vocab_size, 6, seed=2)
    runner = BatchRunner(llm, max_batch=3, capacity=64, block_size=4)
    requests = [runner.add(prompt, params) for _, prompt, params in work]
    while runner.has_work:
        runner.step()
    assert calls, "the exported MoE form ran"
    calls.clear()
    for request, (_, prompt, params) in zip(requests, work, strict=True):
        assert request.token_ids == reference_output(llm, prompt, params).token_ids
    assert not calls, "the oracle is HF's own block"

"""The C++ onnxruntime executor (csrc/ort_executor.cpp) under the core scheduler, over tiny `slots`
bundles, against the torch reference: every request's greedy output equals its own autoregressive
output (and its drafts equal the Python speculative loop's), whatever shares the batch and whenever
it arrived."""

import json
import random
import shutil
import subprocess
import sys

import numpy as np
import pytest
from factories import export_tiny_slots_bundle, make_drafter, make_target
from scheduler_checks import decode_together, drive_scheduler, python_loop

from dflash_trt.errors import DFlashError
from dflash_trt.export.bundle import export_bundle
from dflash_trt.models.checkpoints import load_drafter, load_target
from dflash_trt.runtime.torch_backend import TorchTargetSession


@pytest.fixture(scope="module")
def pairs(ort, tmp_path_factory):
    """name -> (slots bundle, TargetModel, DFlashDrafter, prompt token range)."""
    root = tmp_path_factory.mktemp("slots")
    made = {}
    bundle = export_tiny_slots_bundle(root / "qwen3")
    made["qwen3"] = (bundle, root / "qwen3" / "qwen3", root / "qwen3" / "qwen3-draft", 264)
    # 6 tokens (MASK is 5): greedy drafts are often accepted, so acceptance is exercised
    target_dir = make_target(root / "small" / "target", "qwen3", seed=5, tokenizer=False, vocab_size=6)
    draft_dir = make_drafter(
        root / "small" / "draft", seed=5, block_size=4, target_layer_ids=[1, 2], mask_token_id=5
    )
    target, _ = load_target(str(target_dir))
    export_bundle(
        target, load_drafter(draft_dir), None, root / "small" / "bundle", flavour="slots", check=False
    )
    made["small_vocab"] = (root / "small" / "bundle", target_dir, draft_dir, 5)
    return {
        name: (b, *load_target(str(t))[:1], load_drafter(d), top) for name, (b, t, d, top) in made.items()
    }


_REF = {}


def reference(pair, prompt, max_tokens, block_size=1):
    """(tokens, accepted drafts per verify step) of the Python loop on the torch models, greedy."""
    _, target, drafter, _ = pair
    key = (id(target), tuple(prompt), max_tokens, block_size)
    if key not in _REF:
        _REF[key] = python_loop(target, drafter, prompt, max_tokens, block_size)
    return _REF[key]


def scheduler(core, ort, pair, max_batch, capacity=64, block_size=4, executor=None):
    executor = executor or ort.ort_executor(pair[0], max_batch=max_batch, capacity=capacity)
    config = core.SchedulerConfig(
        max_batch=max_batch, capacity=capacity, block_size=block_size, engine_seed=0
    )
    return core.Scheduler(executor, config), executor


def workload(top, count, seed):
    """`count` (arrival step, prompt, max_tokens): prompts of 1..24 tokens below `top`, 3..20 new tokens."""
    rng = random.Random(seed)
    work, step = [], 0
    for _ in range(count):
        work.append((step, [rng.randrange(top) for _ in range(rng.randint(1, 24))], rng.randint(3, 20)))
        step += rng.choice([0, 1, 2])
    return work


@pytest.mark.parametrize("block_size", [1, 4])
@pytest.mark.parametrize("concurrency", [1, 3, 8])
@pytest.mark.parametrize("name", ["qwen3", "small_vocab"])
def test_greedy_equals_each_requests_autoregressive_output(core, ort, pairs, name, concurrency, block_size):
    pair = pairs[name]
    work = workload(pair[3], 8 if concurrency > 1 else 3, seed=concurrency)
    sched, executor = scheduler(core, ort, pair, concurrency, block_size=block_size)
    tokens, metrics = drive_scheduler(core, sched, work)
    for index, (_, prompt, max_tokens) in enumerate(work):
        assert tokens[index] == reference(pair, prompt, max_tokens)[0], (prompt, max_tokens)
    assert sched.slots.num_free == concurrency
    assert all(executor.committed(row) == 0 and executor.drafted(row) == 0 for row in range(concurrency))
    if name == "small_vocab" and block_size > 1:  # speculation really happened: drafts made and some accepted
        assert sum(m["num_drafts"] for m in metrics.values()) > 0
        assert sum(m["num_accepted_tokens"] for m in metrics.values()) > 0


def test_drafts_equal_the_python_speculative_loop(core, ort, pairs):
    """Same acceptance, step for step: the drafter got the same features at the same positions."""
    pair = pairs["small_vocab"]
    prompts, max_tokens = [[1, 2, 3], [4, 0, 4, 0, 1, 1, 2], [3]], 30
    sched, _ = scheduler(core, ort, pair, 3)
    tokens, accepted = decode_together(core, sched, prompts, max_tokens, 4)
    for ours, accepts, prompt in zip(tokens, accepted, prompts, strict=True):
        ref_tokens, ref_accepted = reference(pair, prompt, max_tokens, block_size=4)
        assert ours == ref_tokens
        assert accepts == ref_accepted[: len(accepts)] and len(accepts) >= 5


def test_abort_frees_the_slot_for_reuse_and_leaves_the_others_alone(core, ort, pairs):
    pair = pairs["qwen3"]
    prompts = [[5, 6, 7, 8], [9, 10], [11, 12, 13, 14, 15, 16]]
    sched, executor = scheduler(core, ort, pair, 3)
    params = core.RequestParams(max_tokens=16, ignore_eos=True)
    ids = [sched.add_request(p, params) for p in prompts]
    tokens = {i: [] for i in ids}
    for _ in range(3):
        for out in sched.step():
            tokens[out["request"]] += out["new_tokens"]
    assert sched.abort(ids[1]) and executor.committed(1) == 0  # released at once
    late = sched.add_request([20, 21, 22], params)  # takes the freed slot (the lowest free one)
    assert sched.slots.request(1) == late
    tokens[late], finish = [], {}
    while sched.has_work:
        for out in sched.step():
            tokens[out["request"]] += out["new_tokens"]
            finish[out["request"]] = out["finish_reason"]
    assert finish[ids[1]] == "abort"
    for i, prompt in [(ids[0], prompts[0]), (ids[2], prompts[2]), (late, [20, 21, 22])]:
        assert tokens[i] == reference(pair, prompt, 16)[0]


def test_a_release_keeps_the_places_packed_and_a_phase_runs_only_its_rows(core, ort, pairs):
    """Slot 0 finishes while slot 1 decodes on: slot 1's request moves to place 0 (its cache, draft
    context and all; what slot 0 held changes places with it, kept for prefix reuse), two late requests
    take slots 2 (never used: nothing to drop) and 0 (whose kept tokens neither prompt starts with)
    and places 1 and 2, so the step prefills them in one Run of two rows and verifies slot 1 in one
    Run of one row: nothing else is computed, and every request still equals its own autoregressive
    output."""
    pair = pairs["small_vocab"]
    sched, executor = scheduler(core, ort, pair, 3)
    short = sched.add_request([1, 2], core.RequestParams(max_tokens=2, ignore_eos=True))  # slot 0, done soon
    long = sched.add_request([3, 4, 0, 1, 2], core.RequestParams(max_tokens=30, ignore_eos=True))  # slot 1
    tokens = {short: [], long: []}
    while sched.slots.request(0) == short:
        for out in sched.step():
            tokens[out["request"]] += out["new_tokens"]
    assert executor.place(1) == 0 and executor.place(0) == -1 and executor.committed(1) > 5
    assert executor.retained_place(0) == 1 and executor.retained(0) == 3  # its prompt and first token
    prompts = [[2, 2, 3], [4, 1, 0, 3, 3, 2, 1]]
    late = [sched.add_request(p, core.RequestParams(max_tokens=12, ignore_eos=True)) for p in prompts]
    assert [sched.slots.request(2), sched.slots.request(0)] == late
    runs, fed = executor.target_runs, executor.target_rows
    for out in sched.step():  # prefill slots 0 and 2 (places 1, 2), verify slot 1 (place 0)
        tokens.setdefault(out["request"], []).extend(out["new_tokens"])
    assert [executor.place(r) for r in range(3)] == [1, 0, 2]
    assert (executor.target_runs - runs, executor.target_rows - fed) == (2, 3)
    while sched.has_work:
        for out in sched.step():
            tokens[out["request"]] += out["new_tokens"]
    assert tokens[short] == reference(pair, [1, 2], 2)[0]
    assert tokens[long] == reference(pair, [3, 4, 0, 1, 2], 30)[0]
    for request, prompt in zip(late, prompts, strict=True):
        assert tokens[request] == reference(pair, prompt, 12)[0]
    assert [executor.place(r) for r in range(3)] == [-1, -1, -1]


RESERVE_IN_A_FRESH_PROCESS = """
import sys
from dflash_trt.runtime.ort_executor import ort_executor

def private_mib():
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("RssAnon:")) / 1024

executor = ort_executor(sys.argv[1], max_batch=8, capacity=4096)
before = private_mib()
executor.reserve_memory()
print(private_mib() - before)
"""


def test_reserve_memory_makes_the_slots_resident_and_decoding_is_unchanged(core, ort, pairs):
    """A server's memory at start is its memory under load: the slot buffers are allocated zeroed
    but untouched (their pages arrive as requests first fill them); reserve_memory writes through
    all of them, so the process grows by the whole pool at once. It is refused once a request holds
    a row (it clears the slots), and decoding after it equals each request's own output."""
    pair = pairs["qwen3"]
    executor = ort.ort_executor(pair[0], max_batch=8, capacity=4096)
    c = executor.config
    pool = 4 * 2 * 8 * 4096 * (len(c.attention_layers) * c.target_kv_heads * c.target_head_dim
                               + c.draft_layers * c.draft_kv_heads * c.draft_head_dim)  # float32 K and V
    assert pool >= 48 * 2**20  # large beside a process's own noise
    # in a fresh process: here, calloc may hand out heap pages earlier tests left resident
    grown = subprocess.run([sys.executable, "-c", RESERVE_IN_A_FRESH_PROCESS, str(pair[0])], capture_output=True,
                           text=True, check=True).stdout.split()[-1]
    assert float(grown) >= 0.9 * pool / 2**20, grown
    executor.reserve_memory()
    sched, _ = scheduler(core, ort, pair, 8, capacity=4096, executor=executor)
    work = workload(pair[3], 4, seed=3)
    tokens, _ = drive_scheduler(core, sched, work)
    for index, (_, prompt, max_tokens) in enumerate(work):
        assert tokens[index] == reference(pair, prompt, max_tokens)[0]
    sched.add_request([5, 6, 7], core.RequestParams(max_tokens=4, ignore_eos=True))
    sched.step()
    with pytest.raises(DFlashError, match="before any request"):
        executor.reserve_memory()


def test_idle_scratch_is_freed_and_grows_back_as_it_was(core, ort, pairs):
    """With no request live, release_scratch frees what the phases grew (logits, features, Run
    outputs, decisions) and the next requests decode as before; while a row lives it frees nothing."""
    pair = pairs["small_vocab"]
    sched, executor = scheduler(core, ort, pair, 3)
    work = workload(pair[3], 6, seed=4)
    for _ in range(2):  # the second round runs on scratch allocated anew
        tokens, _ = drive_scheduler(core, sched, work)
        for index, (_, prompt, max_tokens) in enumerate(work):
            assert tokens[index] == reference(pair, prompt, max_tokens)[0]
        assert executor.release_scratch() > 0
    assert executor.release_scratch() == 0  # nothing grew since
    sched.add_request([1, 2, 3], core.RequestParams(max_tokens=4, ignore_eos=True))
    sched.step()
    assert executor.release_scratch() == 0


def test_a_phase_skips_the_live_rows_between_its_own(ort, pairs):
    """Rows 0 and 2 verify while row 1, live between them, does not: two Runs of one row each (rows
    whose places are not adjacent never share a Run), and their logits equal the torch target's."""
    bundle, target, _, _ = pairs["small_vocab"]
    executor = ort.ort_executor(bundle, max_batch=3, capacity=32)
    prompts = [[1, 2, 3], [4, 0], [2, 3, 4, 4]]
    sessions = [TorchTargetSession(target, ()) for _ in prompts]
    for session, prompt in zip(sessions, prompts, strict=True):
        session.prefill(prompt)
    executor.prefill_logits([0, 1, 2], prompts)
    runs, fed = executor.target_runs, executor.target_rows
    blocks = [[1, 2, 0], [3, 3, 1, 4]]
    ours = executor.verify_logits([0, 2], blocks)
    assert (executor.target_runs - runs, executor.target_rows - fed) == (2, 2)
    for session, logits, block in zip([sessions[0], sessions[2]], ours, blocks, strict=True):
        np.testing.assert_allclose(logits, session.forward(block)[0].numpy(), rtol=1e-4, atol=1e-4)


def test_the_runs_that_pay_set_up_are_each_rows_by_tokens_shapes_first(ort, pairs):
    """executor.set_up_runs, what the scheduler leaves out of its cost model: onnxruntime plans new
    shapes of the token and index inputs ([rows, tokens], [rows, logits rows]) on their first run. The
    block pass's context grows a row every step here, a plan paid at every step: no set-up, the steady
    cost."""
    bundle = pairs["small_vocab"][0]
    executor = ort.ort_executor(bundle, max_batch=3, capacity=64)
    executor.prefill_logits([0, 1], [[1, 2, 3], [4, 0]])  # [2, 3] tokens, one logits row each: not a verify's

    def paid(block):
        before = executor.set_up_runs
        drafts = executor.draft([0, 1], [1, 2], block)
        drafted = executor.set_up_runs - before
        executor.verify_logits([0, 1], [[1, *drafts[0]], [2, *drafts[1]]])
        executor.commit([0, 1], [1, 1])
        return drafted, executor.set_up_runs - before - drafted

    # (the draft block pass, the target and the draft context pass over the verified block): a verify of
    # 3 tokens has the prefill's context pass shapes, not its target's (3 logits rows each)
    assert [paid(4), paid(4), paid(4), paid(3), paid(3), paid(4)] == [(1, 2), (0, 0), (0, 0), (1, 1), (0, 0), (0, 0)]


def test_an_onnxruntime_error_is_a_dflash_error(core, ort, pairs):
    bundle = pairs["qwen3"][0]
    broken = ort.executor_config(bundle, max_batch=2, capacity=32)
    broken.feature_width += 1  # the bound features output no longer matches the graph's
    sched, _ = scheduler(core, ort, pairs["qwen3"], 2, capacity=32, executor=core.OrtExecutor(broken))
    sched.add_request([1, 2, 3], core.RequestParams(max_tokens=4))
    with pytest.raises(DFlashError, match="onnxruntime: running target.onnx"):
        sched.step()
    broken.target_path = str(bundle / "missing.onnx")
    with pytest.raises(DFlashError, match="onnxruntime: loading"):
        core.OrtExecutor(broken)
    broken.dtype = "bfloat16"  # refused before the (missing) graph is opened
    with pytest.raises(DFlashError, match="no bfloat16 kernel"):
        core.OrtExecutor(broken)


def test_a_contract_1_bundle_is_refused_in_one_line(ort, pairs, tmp_path):
    old = shutil.copytree(pairs["qwen3"][0], tmp_path / "old")
    manifest = json.loads((old / "bundle.json").read_text())
    del manifest["contract"]  # bundles written before contract 2 have no key
    (old / "bundle.json").write_text(json.dumps(manifest))
    with pytest.raises(DFlashError, match="re-export with --flavour slots") as err:
        ort.ort_executor(old, max_batch=1, capacity=32)
    assert "\n" not in str(err.value)


def test_phase_logits_equal_the_torch_target(ort, pairs):
    """The phases one by one, rows 0 and 2 with slot 1 idle between them: prefill and verify logits
    equal the torch target's at those positions (float tolerance), and commit keeps what it says."""
    pair = pairs["qwen3"]
    target = pair[1]
    executor = ort.ort_executor(pair[0], max_batch=3, capacity=32)
    prompts, blocks = [[5, 6, 7, 8, 9], [10, 11]], [[12, 13, 14], [15]]
    first = executor.prefill_logits([0, 2], prompts)
    later = executor.verify_logits([0, 2], blocks)
    for prompt, block, p, v in zip(prompts, blocks, first, later, strict=True):
        session = TorchTargetSession(target, ())
        logits, _ = session.prefill(prompt)
        np.testing.assert_allclose(p, logits[None].numpy(), rtol=1e-4, atol=1e-4)
        logits, _ = session.forward(block)
        np.testing.assert_allclose(v, logits.numpy(), rtol=1e-4, atol=1e-4)
    executor.commit([0, 2], [2, 1])
    assert [executor.committed(r) for r in range(3)] == [7, 0, 3]
    assert len(executor.draft([0, 2], [1, 2], 4)[0]) == 3  # injects 7 and 3 positions
    assert [executor.drafted(r) for r in range(3)] == [7, 0, 3]
    executor.release(0)
    assert executor.committed(0) == 0 and executor.drafted(0) == 0


@pytest.mark.slow
def test_the_embedded_pair_runs_on_the_cpp_executor(core, ort, tmp_path):
    """SmolLM2-135M and its shipped drafter, exported as a slots bundle: greedy tokens and acceptance
    per step equal the Python loop's on the torch models, two requests batched."""
    from dflash_trt import LLM

    llm = LLM(backend="torch")  # the embedded default pair
    bundle = export_bundle(
        llm.target, llm.drafter, llm.tokenizer, tmp_path / "bundle", flavour="slots", check=False
    )
    pair = (bundle, llm.target, llm.drafter, None)
    prompts = [llm.encode("Write a Python function that adds two numbers."), llm.encode("Name three colors.")]
    sched, _ = scheduler(core, ort, pair, 2, capacity=256, block_size=16)
    tokens, accepted = decode_together(core, sched, prompts, 32, 16)
    for ours, accepts, prompt in zip(tokens, accepted, prompts, strict=True):
        ref_tokens, ref_accepted = reference(pair, prompt, 32, block_size=16)
        assert ours == ref_tokens
        assert accepts == ref_accepted[: len(accepts)] and sum(accepts) > 0

"""Adaptive speculation (csrc/adaptive.cpp, csrc/cost_model.cpp, the scheduler's bookkeeping): the
policy against a plain Python twin of its formula, the cost model's fits, and losslessness through
the scheduler whatever block it picks. Which block a live run picks depends on timings, so the
scheduler tests force it with seeded costs rather than assert on what it learnt from the clock."""

import itertools
import random

import pytest
from scheduler_checks import autoregressive, drive, workload

from dflash_trt import SamplingParams
from dflash_trt.errors import DFlashError


def expected_tokens(a, block):
    total, run = 1.0, 1.0
    for k in range(1, block):
        run *= a[k - 1] if k <= len(a) else 0.0
        total += run
    return total


def best_block(a, limits, verify, draft):
    """The policy's formula, written out: argmax of committed tokens per second, ties to the smaller B."""
    rates = []
    for b in range(1, len(verify) + 1):
        tokens = sum(expected_tokens(a, min(b, lim)) for lim in limits) if limits else expected_tokens(a, b)
        rates.append(tokens / max(verify[b - 1] + (draft[b - 1] if b > 1 else 0.0), 1e-12))
    return 1 + max(range(len(rates)), key=lambda i: (rates[i], -i))


def test_expected_tokens(core):
    assert core.expected_tokens([0.5, 0.5, 0.5], 1) == 1.0
    assert core.expected_tokens([0.5, 0.5, 0.5], 2) == 1.5
    assert core.expected_tokens([0.5, 0.5, 0.5], 4) == pytest.approx(1.875)
    assert core.expected_tokens([1.0], 3) == 2.0  # a missing estimate counts as never accepted


def test_high_acceptance_and_flat_cost_take_the_largest_block(core):
    assert core.choose_block([0.9] * 15, [], [1.0] * 16, [0.2] * 16) == 16
    assert core.choose_block([1.0] * 3, [5, 5], [1.0] * 4, [0.0] * 4) == 4


def test_zero_acceptance_takes_plain_decoding(core):
    assert core.choose_block([0.0] * 7, [], [1.0] * 8, [0.1] * 8) == 1
    assert core.choose_block([0.0] * 7, [], [1.0] * 8, [0.0] * 8) == 1, "a tie goes to the smaller block"


def test_costs_growing_steeply_with_the_block_take_a_small_one(core):
    verify = [0.01 * b**3 for b in range(1, 17)]
    block = core.choose_block([0.9] * 15, [], verify, [0.0] * 16)
    assert block < 4 and block == best_block([0.9] * 15, [], verify, [0.0] * 16)


def test_rows_near_their_end_do_not_pay_for_a_block_they_cannot_use(core):
    # Every row may emit one more token: a larger block costs more and commits nothing more.
    assert core.choose_block([0.9] * 3, [1, 1, 1], [1.0, 1.1, 1.2, 1.3], [0.1] * 4) == 1
    # One row of three can use the block: the gain is a third of the batch's, and it does not pay.
    assert core.choose_block([0.9] * 3, [1, 1, 4], [1.0, 1.5, 1.7, 1.9], [0.1] * 4) == 1
    assert core.choose_block([0.9] * 3, [4, 4, 4], [1.0, 1.5, 1.7, 1.9], [0.1] * 4) == 4


def test_the_policy_equals_its_formula_on_random_cases(core):
    rng = random.Random(0)
    for _ in range(500):
        max_block = rng.randint(1, 16)
        a = [rng.random() ** rng.choice([0.2, 1, 3]) for _ in range(max_block - 1)]
        limits = [rng.randint(1, max_block) for _ in range(rng.randint(0, 6))]
        verify = [rng.uniform(0.5, 2) * (1 + rng.random() * b) for b in range(1, max_block + 1)]
        draft = [rng.uniform(0, 1) for _ in range(max_block)]
        assert core.choose_block(a, limits, verify, draft) == best_block(a, limits, verify, draft)


def test_bad_policy_inputs_are_one_line_errors(core):
    with pytest.raises(DFlashError, match="probabilities"):
        core.choose_block([1.5], [], [1.0, 1.0], [0.0, 0.0])
    with pytest.raises(DFlashError, match="one draft cost per block size"):
        core.choose_block([0.5], [], [1.0, 1.0], [0.0])
    with pytest.raises(DFlashError, match="seconds >= 0"):
        core.choose_block([0.5], [], [1.0, -1.0], [0.0, 0.0])


def test_acceptance_is_learnt_per_position_from_verified_drafts_only(core):
    est = core.AcceptanceEstimate(3)
    assert est.acceptance() == [0.5, 0.5, 0.5], "the Beta(1, 1) prior"
    est.observe(3, 1)  # draft 1 accepted, draft 2 rejected, draft 3 never decided
    assert est.acceptance() == pytest.approx([2 / 3, 1 / 3, 0.5])
    est.observe(1, 0)  # a row cut to one draft: only position 1 was decided
    assert est.acceptance() == pytest.approx([2 / 4, 1 / 3, 0.5])
    # old evidence fades back to the prior, so a drafter written off is tried again
    for _ in range(2000):
        est.decay()
    assert est.acceptance() == pytest.approx([0.5, 0.5, 0.5], abs=1e-6)
    assert 0.9 < core.AcceptanceEstimate.DECAY < 1


def test_the_cost_model_answers_measured_cells_and_fits_a_line_in_tokens_between_them(core):
    model = core.CostModel()
    assert model.predict(1, 1) is None
    model.observe(1, 4, 2.0)
    assert model.predict(8, 2) == 2.0, "one size measured: its mean, whatever is asked"
    model.observe(1, 4, 4.0)
    assert model.predict(1, 4) == 3.0, "a measured cell answers with its mean"
    # points on 1 + 0.5 * tokens: interpolation and extrapolation follow the line
    model = core.CostModel()
    for rows, block in [(1, 1), (2, 2), (4, 4)]:
        model.observe(rows, block, 1 + 0.5 * rows * block)
    assert model.predict(2, 4) == pytest.approx(1 + 0.5 * 8)
    assert model.predict(8, 8) == pytest.approx(1 + 0.5 * 64)
    # two block sizes measured at the asked row count: their own line (a per-row intercept)
    model.observe(8, 1, 10.0)
    model.observe(8, 2, 11.0)
    assert model.predict(8, 4) == pytest.approx(13.0)
    # never cheaper with more tokens
    model = core.CostModel()
    model.observe(1, 1, 2.0)
    model.observe(1, 4, 1.0)
    assert model.predict(1, 8) == pytest.approx(1.5)
    assert [c["count"] for c in model.cells()] == [1, 1]


def test_a_timing_is_checked(core):
    with pytest.raises(ValueError, match="a phase cost must be a number of seconds >= 0"):
        core.CostModel().observe(1, 2, -1.0)


@pytest.mark.parametrize("paying", ["running target.onnx", "running draft_block.onnx"])
def test_a_phase_call_that_paid_set_up_is_not_a_timing(llms, runner_module, monkeypatch, paying):
    """The scheduler leaves out of its cost model each phase call during which the executor's
    set_up_runs grew (a shape's first run, a CUDA graph capture: a cell holding one makes its block look
    too dear ever to be chosen, and re-timed, again). Here every run of one graph says it paid set-up: its
    phase (verify runs the target, draft the block pass) learns no cost, the other learns each call's."""
    from dflash_trt.runtime.torch_graphs import TorchGraph

    run = TorchGraph.run

    def paid(graph, what, *args):
        return run(graph, what, *args) or what == paying

    llm = llms["small_vocab"]
    learnt = {}
    for graphs in (run, paid):
        monkeypatch.setattr(TorchGraph, "run", graphs)
        engine = runner_module.BatchRunner(llm, max_batch=3, capacity=64, calibrate=False)
        drive(engine, workload(llm.vocab_size, 6, seed=7))
        stats = engine.core_stats()
        learnt[graphs] = {phase: sum(c["count"] for c in stats[phase]) for phase in ("verify_cost", "draft_cost")}
    assert all(learnt[run].values()), learnt
    silent = "verify_cost" if paying == "running target.onnx" else "draft_cost"
    assert learnt[paid][silent] == 0
    other = ({"verify_cost", "draft_cost"} - {silent}).pop()
    assert learnt[paid][other] > 0


# A 2-core CPU's verify costs by block (ms), and its draft's; a drafter accepting half its drafts
REAL_VERIFY = {1: 31.0, 2: 32.0, 3: 33.5, 4: 35.0, 5: 40.0, 6: 46.0, 7: 49.0, 8: 52.0}
REAL_DRAFT, SETUP = 6.0, 8.0  # SETUP: what a shape's first call adds (onnxruntime planning it)


def true_rate(block: int) -> float:
    return sum(0.5 ** k for k in range(block)) / (REAL_VERIFY[block] + (REAL_DRAFT if block > 1 else 0.0))


def settled(core, seed: int, keep_set_up: bool) -> float:
    """400 steps of the policy over the costs above, calibrated at B = 1 and 8 as BatchRunner does ->
    the true rate of the blocks of its last 200 steps, as a share of the best block's."""
    import random

    rng = random.Random(seed)
    verify, draft, estimate = core.CostModel(), core.CostModel(), core.AcceptanceEstimate(7)
    verify.observe(1, 1, REAL_VERIFY[1] / 1e3)
    verify.observe(1, 8, REAL_VERIFY[8] / 1e3)
    draft.observe(1, 8, REAL_DRAFT / 1e3)
    timed, chosen = {1, 8}, []  # the shapes run so far: the calibrated ones
    for _ in range(400):
        costs = [verify.predict(1, b) for b in range(1, 9)]
        drafts = [0.0] + [draft.predict(1, b) or 0.0 for b in range(2, 9)]
        block = core.choose_block(estimate.acceptance(), [], costs, drafts)
        chosen.append(block)
        seconds = (REAL_VERIFY[block] + (SETUP if block not in timed else 0.0)) * rng.gauss(1, 0.03) / 1e3
        if keep_set_up or block in timed:  # the scheduler's rule: a call that paid set-up is no timing
            verify.observe(1, block, seconds)
        timed.add(block)
        if block > 1:
            draft.observe(1, block, REAL_DRAFT / 1e3)
            accepted = 0
            while accepted < block - 1 and rng.random() < 0.5:
                accepted += 1
            estimate.observe(block - 1, accepted)
        estimate.decay()
    best = max(true_rate(b) for b in REAL_VERIFY)
    return sum(true_rate(b) for b in chosen[-200:]) / 200 / best


def test_the_policy_is_not_trapped_by_a_shapes_slow_first_call(core):
    """Seen on a 2-core CPU: a verify of 4 timed once at 43 ms (its first call), where it runs in 35,
    left the policy on B = 5 (40 ms) for good, 5-9 % slower than a fixed B = 4. Kept, such first calls
    trap it in some runs (the control); left out, every run settles within 4 % of the best block."""
    assert min(settled(core, seed, keep_set_up=True) for seed in range(8)) < 0.95
    assert min(settled(core, seed, keep_set_up=False) for seed in range(8)) > 0.96


def force(engine, max_batch, block):
    """Seed costs that make `block` the only choice, whatever the clock says: it costs a millisecond and
    every other block 1000 s, so those are never run (and no live timing ever corrects them)."""
    scheduler, top = engine.scheduler, engine.core_stats()["max_block"]
    for rows, b in itertools.product(range(1, max_batch + 1), range(1, top + 1)):
        seconds = 1e-3 if b == block else 1000.0
        scheduler.seed_cost("verify", rows, b, seconds)
        if b > 1:
            scheduler.seed_cost("draft", rows, b, seconds)


@pytest.mark.parametrize("forced", [None, 1, 4], ids=["adaptive", "forced-B1", "forced-Bmax"])
def test_adaptive_greedy_equals_each_requests_autoregressive_output(runner_module, llms, forced):
    llm = llms["small_vocab"]
    work = workload(llm.vocab_size, 6, seed=7)
    engine = runner_module.BatchRunner(llm, max_batch=3, capacity=64, calibrate=forced is None)
    assert engine.core_stats()["adaptive"] and engine.core_stats()["max_block"] == 4
    if forced:
        force(engine, 3, forced)
    outputs = drive(engine, work)
    for (_, prompt, params), out in zip(work, outputs, strict=True):
        ref = autoregressive(llm, "small_vocab", prompt, params)
        assert out.token_ids == ref.token_ids, (prompt, params)
        assert out.finish_reason == ref.finish_reason
    stats = engine.core_stats()
    assert sum(stats["steps_per_block"]) > 0 and stats["last_block"] >= 1
    if forced:
        assert stats["steps_per_block"][forced - 1] == sum(stats["steps_per_block"])
    if forced == 1:  # never drafted: nothing learnt, the estimates are the prior's
        assert sum(o.core_metrics["num_drafts"] for o in outputs) == 0
        assert stats["acceptance"] == [0.5, 0.5, 0.5]
    if forced == 4:  # every verified position taught the estimate (drafts at slot 1 are often right)
        drafts = sum(o.core_metrics["num_drafts"] for o in outputs)
        accepted = sum(o.core_metrics["accepted_per_position"][0] for o in outputs)
        assert drafts > 0 and accepted > 0 and stats["acceptance"][0] != 0.5


def test_a_seeded_request_samples_the_same_tokens_whatever_the_block_and_the_batch(runner_module, llms):
    """Sample-then-compare acceptance: the token at a position is the target's draw there, so block
    1, 2, 4, adaptive, alone or among others, a seeded T > 0 request commits the same tokens."""
    llm = llms["small_vocab"]
    rng = random.Random(5)
    prompts = [[rng.randrange(5) for _ in range(rng.randint(2, 10))] for _ in range(4)]
    params = [
        SamplingParams(
            max_tokens=24, temperature=0.8, top_k=4 if i % 2 else 0, top_p=0.95, seed=40 + i, ignore_eos=True
        )
        for i in range(4)
    ]
    work = [(i, p, s) for i, (p, s) in enumerate(zip(prompts, params, strict=True))]

    def alone(**kwargs):
        return [
            runner_module.BatchRunner(llm, max_batch=1, capacity=64, **kwargs).run([p], s)[0]
            for p, s in zip(prompts, params, strict=True)
        ]

    reference = [o.token_ids for o in alone(block_size=1)]
    for block in (2, 4):
        outputs = alone(block_size=block)
        assert [o.token_ids for o in outputs] == reference, f"alone, block {block}"
        batched = drive(runner_module.BatchRunner(llm, max_batch=3, capacity=64, block_size=block), work)
        assert [o.token_ids for o in batched] == reference, f"batched, block {block}"
    # drafts were really checked, and some of them accepted (the equality above is not vacuous)
    assert sum(o.metrics.num_accepted_tokens for o in outputs) > 0
    assert sum(o.metrics.num_draft_tokens - o.metrics.num_accepted_tokens for o in outputs) > 0
    adaptive = drive(runner_module.BatchRunner(llm, max_batch=3, capacity=64), work)
    assert [o.token_ids for o in adaptive] == reference, "adaptive"
    other = runner_module.BatchRunner(llm, max_batch=1, capacity=64, block_size=4).run(
        [prompts[0]], SamplingParams(max_tokens=24, temperature=0.8, top_p=0.95, seed=999, ignore_eos=True)
    )[0]
    assert other.token_ids != reference[0], "the seed matters"


def test_calibration_seeds_each_shape_once_from_a_greedy_call_that_paid_no_set_up(ort, small_vocab_pair, tmp_path):
    """calibrate_costs over onnxruntime, whose first run of a shape plans it: each (rows, block) phase is
    timed from a call during which the executor's set_up_runs did not grow, once, through the phases a
    greedy request runs (verify decided where the executor decides, not verify_logits)."""
    from dflash_trt.export.bundle import export_bundle
    from dflash_trt.models.checkpoints import load_drafter, load_target
    from dflash_trt.runtime.calibration import calibrate_costs

    target, drafter = load_target(str(small_vocab_pair[0]))[0], load_drafter(small_vocab_pair[1])
    bundle = export_bundle(target, drafter, None, tmp_path / "bundle", flavour="slots", check=False)
    executor = ort.ort_executor(bundle, max_batch=2, capacity=64)
    calls, seeded = [], []

    class Watched:
        """The executor, each phase call noted with whether it paid set-up."""

        def __getattr__(self, name):
            method = getattr(executor, name)
            if name not in ("draft", "verify", "verify_logits"):
                return method

            def call(*args):
                before = executor.set_up_runs
                out = method(*args)
                calls.append((name, len(args[0]), len(args[1][0]) if name != "draft" else args[2],
                              executor.set_up_runs > before))
                return out
            return call

    class Seeds:
        def seed_cost(self, phase, rows, block, seconds):
            seeded.append((phase, rows, block, calls[-1]))  # the call just timed

    calibrate_costs(Seeds(), Watched(), [1, 2], [1, 4], [0] * 8)
    assert sorted((phase, rows, block) for phase, rows, block, _ in seeded) == [
        ("draft", 1, 4), ("draft", 2, 4), ("verify", 1, 1), ("verify", 1, 4), ("verify", 2, 1), ("verify", 2, 4)]
    for phase, rows, block, (name, n, b, paid) in seeded:
        assert (name, n, b, paid) == (phase, rows, block, False)
    assert any(paid for *_, paid in calls), "onnxruntime's first runs paid set-up, and were not seeded"
    assert {name for name, *_ in calls} == {"draft", "verify"}


def test_stats_are_visible_from_the_engine(runner_module, llms):
    engine = runner_module.BatchRunner(llms["qwen3"], max_batch=2, capacity=64)
    stats = engine.core_stats()
    assert stats["adaptive"] and stats["num_running"] == 0 and stats["num_waiting"] == 0
    # the load-time calibration seeded both phases at 1 and max_batch rows
    assert {(c["rows"], c["block"]) for c in stats["verify_cost"]} == {(1, 1), (1, 4), (2, 1), (2, 4)}
    assert {(c["rows"], c["block"]) for c in stats["draft_cost"]} == {(1, 4), (2, 4)}
    pinned = runner_module.BatchRunner(llms["qwen3"], max_batch=2, capacity=64, block_size=4)
    assert not pinned.core_stats()["adaptive"] and pinned.core_stats()["verify_cost"] == []
    with pytest.raises(DFlashError, match="seed_cost: phase"):
        engine.scheduler.seed_cost("prefill", 1, 1, 0.1)

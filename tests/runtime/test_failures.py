"""When the numbers go wrong: a temperature so small that logits / T overflows float32, a target whose
logits are NaN for one request, a backend step that raises. A request the target gives no token
finishes "error" (vLLM's finish reason) with why in one line, alone: the others in its batch run on
and give what they give alone; the engine serves on, and keeps nothing of the failure for reuse."""

import dataclasses
import threading

import pytest
from factories import POISON
from reference import reference_output

from dflash_trt import LLM, BeamSearchParams, DFlashError, SamplingParams
from dflash_trt.runtime.engine import Engine
from dflash_trt.runtime.batch_runner import StepFailed

pytest.importorskip("dflash_trt._core", reason="dflash_trt._core is not built: run `bash scripts/setup.sh`")

CLEAN = [[5, 6, 7], [9, 8], [1, 2, 3, 4]]


@pytest.fixture(scope="module")
def llm(tiny_pairs):
    target, draft = tiny_pairs["qwen3"]
    return LLM(str(target), str(draft), max_batch=3, backend="torch")


@pytest.fixture(scope="module")
def poisoned(poisoned_pair):
    target, draft = poisoned_pair
    return LLM(str(target), str(draft), max_batch=4, backend="torch")


@pytest.mark.parametrize("speculative", [True, False])
@pytest.mark.parametrize("temperature", [1e-40, 1e-45])
def test_a_temperature_that_overflows_the_scores_samples_the_greedy_tokens(llm, speculative, temperature):
    # logits / 1e-40 is inf in float32, and inf - inf is NaN: the limit T -> 0+ is the argmax
    params = SamplingParams(max_tokens=12, temperature=temperature, seed=3, ignore_eos=True)
    greedy = SamplingParams(max_tokens=12, ignore_eos=True)
    for prompt, out in zip(CLEAN, llm.generate(CLEAN, params, speculative=speculative), strict=True):
        assert out.finish_reason == "length"
        assert out.token_ids == reference_output(llm, prompt, greedy, speculative).token_ids


def sampling(temperature: float, **extra) -> SamplingParams:
    return SamplingParams(max_tokens=10, temperature=temperature, seed=5, ignore_eos=True, **extra)


@pytest.mark.parametrize("speculative", [True, False])
@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_a_prompt_the_target_gives_nan_logits_fails_alone(poisoned, speculative, temperature):
    params = sampling(temperature, logprobs=2)
    outs = poisoned.generate([[5, POISON, 7], *CLEAN], params, speculative=speculative)
    assert outs[0].finish_reason == "error" and outs[0].token_ids == []
    assert "the target's logits after the prompt gave no token (NaN logits" in outs[0].error
    for prompt, out in zip(CLEAN, outs[1:], strict=True):
        alone = poisoned.generate([prompt], params, speculative=speculative)[0]
        assert (out.finish_reason, out.token_ids, out.error) == ("length", alone.token_ids, None)
        if temperature == 0:
            assert out.token_ids == reference_output(poisoned, prompt, sampling(0), speculative).token_ids


@pytest.mark.parametrize("rule", ["point-mass", "drafter"])
@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_a_request_that_meets_nan_logits_mid_reply_fails_there_and_its_batch_runs_on(poisoned_pair, rule,
                                                                                       temperature):
    """The bias makes POISON the first token: the next verify (and the drafter, whose context it
    poisons too) sees NaN logits. The request keeps the token it had; the others run on."""
    target, draft = poisoned_pair
    llm = LLM(str(target), str(draft), max_batch=4, backend="torch", draft_rule=rule, block_size=4)
    forced = sampling(temperature, logit_bias={POISON: 100.0}, logprobs=1)
    params = sampling(temperature)
    runner_outs = llm.generate([[5, 6], *CLEAN], [forced] + [params] * len(CLEAN))
    failed = runner_outs[0]
    assert failed.finish_reason == "error" and failed.token_ids == [POISON] and len(failed.logprobs) == 1
    assert "the target's logits at output token 1 gave no token (NaN logits" in failed.error
    for prompt, out in zip(CLEAN, runner_outs[1:], strict=True):
        assert (out.finish_reason, out.token_ids) == ("length", llm.generate([prompt], params)[0].token_ids)


def test_a_failed_prompt_leaves_nothing_for_prefix_reuse(poisoned):
    """Its slot keeps no positions: a prompt with its head prefills whole."""
    poisoned.generate([[1, 2, 3, 4, 5, 6, 7, 8, POISON]], sampling(0))
    again = poisoned.generate([[1, 2, 3, 4, 5, 6, 7, 8, 9]], sampling(0))[0]
    assert again.finish_reason == "length" and again.metrics.cached_tokens == 0
    reused = poisoned.generate([[1, 2, 3, 4, 5, 6, 7, 8, 9, 10]], sampling(0))[0]
    assert reused.metrics.cached_tokens > 0  # a clean one's do serve


@pytest.mark.parametrize("speculative", [True, False])
def test_the_rows_that_take_a_failed_requests_place_next_run_as_they_would_anywhere(poisoned_pair, speculative):
    """A failed request's place holds NaN K/V past what the next rows write; the torch backend's batched
    attention reads past a row's own positions (masked, but 0 x NaN is NaN). The place is zeroed when
    the request fails: a request started there later, and a live row moved there when the failed one
    left, give the tokens they give on a fresh LLM."""
    target, draft = map(str, poisoned_pair)
    pair, poison, params = [[9, 8], [1, 2, 3, 4, 5, 6]], [5, POISON, 7, 7, 7, 7], sampling(0)

    def fresh(max_batch):
        return LLM(target, draft, backend="torch", max_batch=max_batch, capacity=64)

    want = [o.token_ids for o in fresh(2).generate(pair, params, speculative=speculative)]
    llm = fresh(2)
    assert llm.generate([poison], params, speculative=speculative)[0].finish_reason == "error"
    assert [o.token_ids for o in llm.generate(pair, params, speculative=speculative)] == want  # in its place
    # the poisoned prompt between the two: when it fails, the row above moves down into its place
    outs = fresh(3).generate([pair[1], poison, pair[0]], params, speculative=speculative)
    assert [o.finish_reason for o in outs] == ["length", "error", "length"]
    assert [outs[2].token_ids, outs[0].token_ids] == want


def failing_step(monkeypatch, after: int, always: bool = False):
    """The torch backend's graph runs raise at the `after`-th run from now: that once, or from then on."""
    from dflash_trt.runtime import torch_graphs

    run = torch_graphs.TorchGraph.run
    calls = [0]

    def flaky(self, *args, **kwargs):
        calls[0] += 1
        if calls[0] == after or (always and calls[0] > after):
            raise RuntimeError("the device fell over")
        return run(self, *args, **kwargs)

    monkeypatch.setattr(torch_graphs.TorchGraph, "run", flaky)


def test_a_step_the_backend_fails_raises_from_generate_and_the_llm_serves_on(llm, monkeypatch):
    params = sampling(0)
    failing_step(monkeypatch, after=4)
    with pytest.raises(StepFailed, match="the engine step failed: RuntimeError: the device fell over"):
        llm.generate(CLEAN, params)
    monkeypatch.undo()
    for prompt, out in zip(CLEAN, llm.generate(CLEAN, params), strict=True):
        assert out.token_ids == reference_output(llm, prompt, params, True).token_ids


def test_an_engine_whose_step_fails_finishes_its_requests_with_error_serves_on_and_drains(llm, monkeypatch):
    engine = Engine(llm, max_batch=3)
    params = sampling(0)
    try:
        failing_step(monkeypatch, after=3)
        outs = engine.generate(CLEAN, params)
        errors = [out for out in outs if out.finish_reason == "error"]
        assert errors, "a step failed under them"
        for out in errors:
            assert out.error == "the engine step failed: RuntimeError: the device fell over"
        assert isinstance(engine.error, RuntimeError)
        monkeypatch.undo()
        for prompt, out in zip(CLEAN, engine.generate(CLEAN, params), strict=True):
            assert out.token_ids == reference_output(llm, prompt, params, True).token_ids
        streaming = engine.stream(CLEAN[0], SamplingParams(max_tokens=300, ignore_eos=True))
        next(streaming)  # running while the engine drains
        finished = threading.Event()
        threading.Thread(target=lambda: [*streaming] and finished.set(), daemon=True).start()
    finally:
        engine.shutdown(drain=True, timeout=120)
    assert not engine._thread.is_alive() and finished.wait(10)


def test_an_engine_whose_steps_keep_failing_goes_down_and_takes_no_more_requests(llm, monkeypatch):
    """A broken backend (a sticky CUDA error fails every step after it): after DOWN_AFTER_FAILED_STEPS
    failed steps in a row the engine refuses requests with 503, which a server's /health reports, so that
    it is restarted rather than answering 500s. Failures apart, with steps that worked between, do not."""
    from dflash_trt.errors import Busy
    from dflash_trt.runtime.engine import DOWN_AFTER_FAILED_STEPS

    engine = Engine(llm, max_batch=3)
    params = sampling(0)
    try:
        for _ in range(DOWN_AFTER_FAILED_STEPS):  # one failure, then requests that succeed
            failing_step(monkeypatch, after=1)
            assert engine.generate([CLEAN[0]], params)[0].finish_reason == "error"
            monkeypatch.undo()
            assert engine.generate([CLEAN[0]], params)[0].finish_reason == "length"
        assert engine.down is None
        failing_step(monkeypatch, after=1, always=True)
        for _ in range(DOWN_AFTER_FAILED_STEPS):
            assert engine.generate([CLEAN[1]], params)[0].finish_reason == "error"
        assert engine.down == f"{DOWN_AFTER_FAILED_STEPS} steps failed in a row, the last: RuntimeError: " \
                              "the device fell over"
        with pytest.raises(Busy, match="the engine is down: 3 steps failed in a row") as refused:
            engine.add_request(CLEAN[2], params)
        assert refused.value.status == 503
    finally:
        engine.shutdown(drain=True, timeout=60)


def test_a_beam_search_that_meets_nan_logits_fails_with_one_line(poisoned):
    with pytest.raises(DFlashError, match="beam search: the target's logits after the prompt gave no token"):
        poisoned.beam_search([[5, POISON]], BeamSearchParams(beam_width=2, max_tokens=4))
    assert len(poisoned.beam_search([[5, 6]], BeamSearchParams(beam_width=2, max_tokens=4))[0].sequences) == 2


def test_a_request_the_core_refuses_at_queueing_fails_alone(llm, monkeypatch):
    """What prepare let through and the core's queue refused: that request finishes "error", the others
    run on."""
    engine = Engine(llm, max_batch=3)
    submit = engine.runner.submit

    def picky(request, *args):
        if request.ids == [9, 8]:
            raise RuntimeError("no room for it")
        return submit(request, *args)

    monkeypatch.setattr(engine.runner, "submit", picky)
    try:
        outs = engine.generate(CLEAN, sampling(0))
    finally:
        engine.shutdown()
    assert [out.finish_reason for out in outs] == ["length", "error", "length"]
    assert outs[1].error == "the core refused it: RuntimeError: no room for it"


def test_an_engine_thread_that_fails_answers_every_request_and_goes_down(llm, monkeypatch):
    """A bug of ours out of the engine loop: the thread ends, but every live and queued request gets its
    last output ("error"), the engine refuses new ones (503) and shutdown returns."""
    from dflash_trt.errors import Busy

    engine = Engine(llm, max_batch=1)
    step = engine.runner.step
    calls = [0]

    def broken():
        calls[0] += 1
        if calls[0] == 3:
            raise AssertionError("a bug")  # not a StepFailed: out of the loop
        return step()

    monkeypatch.setattr(engine.runner, "step", broken)
    outs = engine.generate(CLEAN, sampling(0))  # one slot: two of them wait in the core or the inbox
    assert [out.finish_reason for out in outs] == ["error"] * 3
    assert all(out.error == "the engine thread failed: AssertionError: a bug" for out in outs)
    with pytest.raises(Busy, match="the engine is down: the engine thread failed"):
        engine.add_request([5, 6], sampling(0))
    engine.shutdown(timeout=10)
    assert not engine._thread.is_alive()


@pytest.fixture(scope="module")
def poisoned_bundle(poisoned_pair, tmp_path_factory):
    from dflash_trt.export.bundle import export_bundle
    from dflash_trt.models.checkpoints import load_drafter, load_target

    target, tokenizer = load_target(str(poisoned_pair[0]))
    return export_bundle(target, load_drafter(poisoned_pair[1]), tokenizer,
                         tmp_path_factory.mktemp("poisoned") / "bundle", flavour="slots", check=False)


@pytest.mark.parametrize("params", [sampling(0), sampling(0.8)], ids=["greedy", "sampled"])
def test_the_onnxruntime_executor_fails_the_requests_the_torch_one_fails(poisoned_pair, poisoned_bundle, params):
    """The default CPU path (a slots bundle on the C++ onnxruntime executor): onnxruntime's NaN logits fail
    the same requests, with the same tokens before; the others give the torch executor's tokens."""
    target_dir, draft_dir = poisoned_pair
    prompts = [[5, POISON, 7], [5, 6], [9, 8]]
    each = [params, dataclasses.replace(params, logit_bias={POISON: 100.0}), params]
    want = [(o.finish_reason, o.token_ids) for o in LLM(str(target_dir), str(draft_dir), block_size=4,
                                                       backend="torch").generate(prompts, each)]
    assert [reason for reason, _ in want] == ["error", "error", "length"]
    ort = LLM.from_bundle(poisoned_bundle, block_size=4)
    assert [(o.finish_reason, o.token_ids) for o in ort.generate(prompts, each)] == want

"""Per-request metrics (csrc/metrics.cpp) in vLLM's names, against dflash_trt.spec.metrics."""

import random

import pytest

from dflash_trt.spec.metrics import RequestMetrics

FIELDS = ["num_drafts", "num_draft_tokens", "num_accepted_tokens", "accepted_per_position", "mean_acceptance_length"]


@pytest.mark.parametrize("block_size", [2, 4, 16])
def test_counters_equal_the_python_metrics_for_a_fixed_block_size(core, block_size):
    rng = random.Random(block_size)
    ours, theirs = core.SpecMetrics(), RequestMetrics(block_size=block_size)
    for _ in range(300):
        accepted = rng.randint(0, block_size - 1)
        ours.record(drafted=block_size - 1, accepted=accepted)
        theirs.record(accepted)
    expected = theirs.to_dict()
    got = ours.to_dict()
    assert {k: got[k] for k in FIELDS if k != "mean_acceptance_length"} == {
        k: expected[k] for k in FIELDS if k != "mean_acceptance_length"}
    assert got["mean_acceptance_length"] == pytest.approx(expected["mean_acceptance_length"])


def test_arithmetic_by_hand_with_a_changing_block_size(core):
    m = core.SpecMetrics()
    assert m.to_dict() == {"num_drafts": 0, "num_draft_tokens": 0, "num_accepted_tokens": 0,
                           "accepted_per_position": [], "mean_acceptance_length": None}
    m.record(drafted=3, accepted=2)  # tau = 3
    m.record(drafted=1, accepted=0)  # tau = 1 (an adaptive step with B = 2)
    m.record(drafted=5, accepted=5)  # tau = 6: every draft and the bonus
    assert m.to_dict() == {"num_drafts": 3, "num_draft_tokens": 9, "num_accepted_tokens": 7,
                           "accepted_per_position": [2, 2, 1, 1, 1],
                           "mean_acceptance_length": pytest.approx(1 + 7 / 3)}


def test_aggregate_sums_requests(core):
    a, b = core.SpecMetrics(), core.SpecMetrics()
    a.record(3, 1)
    b.record(7, 6)
    b.record(7, 0)
    total = core.aggregate([a, b])
    assert total == {"num_drafts": 3, "num_draft_tokens": 17, "num_accepted_tokens": 7,
                     "accepted_per_position": [2, 1, 1, 1, 1, 1, 0],
                     "mean_acceptance_length": pytest.approx(1 + 7 / 3)}
    assert core.aggregate([])["mean_acceptance_length"] is None


def test_impossible_records_are_invariant_errors(core):
    m = core.SpecMetrics()
    with pytest.raises(AssertionError):
        m.record(drafted=3, accepted=4)
    with pytest.raises(AssertionError):
        m.record(drafted=0, accepted=0)
    assert m.to_dict()["num_drafts"] == 0

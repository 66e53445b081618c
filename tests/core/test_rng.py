"""Counter RNG (csrc/rng.h): Philox4x32-10 known answers, determinism, uniformity, independence."""

import numpy as np
import pytest
from scipy.stats import kstest

# Known-answer vectors for Philox4x32-10 from the Random123 distribution (Salmon et al., SC'11):
# counter (4 words), key (2 words) -> output (4 words).
KNOWN_ANSWERS = [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    (
        (0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344),
        (0xA4093822, 0x299F31D0),
        (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1),
    ),
]


@pytest.mark.parametrize("counter, key, expected", KNOWN_ANSWERS, ids=["zeros", "ones", "pi"])
def test_philox_matches_the_published_known_answers(core, counter, key, expected):
    assert tuple(core.philox4x32_10(counter, key)) == expected


def test_the_same_key_gives_the_same_number(core):
    keys = [(seed, request, position, draw) for seed in (0, 1, 2**63 + 5) for request in (0, 7, 2**40)
            for position in (0, 1, 4095) for draw in (0, core.CATEGORICAL_DRAW)]
    first = [core.uniform(*key) for key in keys]
    core.uniform(3, 3, 3, 3)  # something else runs in between: no state to disturb
    assert [core.uniform(*key) for key in reversed(keys)] == first[::-1]
    assert len(set(first)) == len(first), "distinct keys collided"


def test_uniforms_are_uniform_on_the_unit_interval(core):
    u = np.array([core.uniform(11, request, position, 0) for request in range(20) for position in range(2000)])
    assert u.min() >= 0 and u.max() < 1
    assert abs(u.mean() - 0.5) < 0.005 and abs(u.var() - 1 / 12) < 0.002
    assert kstest(u, "uniform").pvalue > 1e-3


def test_the_uniformity_test_can_fail(core):
    """The KS test above has the power to reject a generator that lost resolution or range."""
    u = np.array([core.uniform(11, 0, position, 0) for position in range(20000)])
    assert kstest(np.floor(u * 16) / 16, "uniform").pvalue < 1e-6
    assert kstest(u * 0.98, "uniform").pvalue < 1e-6


@pytest.mark.parametrize("field", ["seed", "request", "position", "draw"])
def test_neighbouring_keys_are_uncorrelated(core, field):
    """Two streams over positions 0..n-1 whose keys differ by one in `field` (for `position`: the
    next n positions) look independent: no correlation, and their difference mod 1 is uniform."""
    n = 20000
    base = {"seed": 5, "request": 9, "position": 0, "draw": 0}

    def stream(shift):
        key = dict(base, **{field: base[field] + shift * (n if field == "position" else 1)})
        return np.array([core.uniform(**dict(key, position=key["position"] + i)) for i in range(n)])

    a, b = stream(0), stream(1)
    assert abs(np.corrcoef(a, b)[0, 1]) < 4 / np.sqrt(n)
    assert kstest((a - b) % 1.0, "uniform").pvalue > 1e-3

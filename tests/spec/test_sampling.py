import pytest
import torch

from dflash_trt.errors import DFlashError
from dflash_trt.spec.sampling import SamplingParams, target_probs


@pytest.mark.parametrize("temperature, top_k, top_p", [(1.0, 0, 1.0), (0.6, 5, 1.0), (1.2, 0, 0.7), (0.9, 8, 0.85)])
def test_target_probs_match_the_reference_filters(temperature, top_k, top_p):
    reference = pytest.importorskip("dflash.model", reason="test oracle: pip install --no-deps dflash==0.1.0")
    logits = torch.randn(4, 50, generator=torch.Generator().manual_seed(top_k))
    ours = target_probs(logits, SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p))
    theirs = reference._sampling_probs(logits, temperature, top_p, top_k)
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(max_tokens=0), "max_tokens"),
        (dict(temperature=-0.1), "temperature"),
        (dict(top_p=0.0), "top_p"),
        (dict(top_p=1.5), "top_p"),
        (dict(top_k=-1), "top_k"),
        (dict(stop=[""]), "stop"),
    ],
)
def test_bad_sampling_params_are_refused(kwargs, field):
    with pytest.raises(DFlashError, match=f"SamplingParams.{field}"):
        SamplingParams(**kwargs)


def test_stop_accepts_a_string_or_a_list():
    assert SamplingParams(stop="###").stop == ("###",)
    assert SamplingParams(stop=["a", "b"]).stop == ("a", "b")

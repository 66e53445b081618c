"""The CPU matmul for 2-4 rows: the same product as nn.Linear, on the same parameters, at
inference only; the runtime uses it and still decodes losslessly (tests/test_embedded_pair.py)."""

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from dflash_trt.runtime import skinny
from dflash_trt.runtime.skinny import SkinnyLinear, use_skinny_linears


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("shape", [(1, 1), (1, 2), (1, 3), (1, 4), (2, 2), (1, 5), (1, 16), (3, 7)])
def test_skinny_linear_computes_what_linear_does(shape, bias):
    gen = torch.Generator().manual_seed(0)
    layer = nn.Linear(96, 320, bias=bias)
    x = torch.randn(*shape, 96, generator=gen)
    expected = F.linear(x, layer.weight, layer.bias)
    use_skinny_linears(layer)
    with torch.inference_mode():
        out = layer(x)
    assert out.shape == expected.shape and out.is_contiguous()
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


def test_only_two_to_four_inference_rows_take_the_other_product(monkeypatch):
    calls = []
    real_mm = torch.mm
    monkeypatch.setattr(skinny.torch, "mm", lambda *a: calls.append(a[1].shape[1]) or real_mm(*a))
    layer = nn.Linear(8, 8)
    use_skinny_linears(layer)
    with torch.inference_mode():
        for rows in (1, 2, 3, 4, 5, 8):
            layer(torch.randn(rows, 8))
    assert calls == [2, 3, 4]
    calls.clear()
    layer(torch.randn(3, 8, requires_grad=True)).sum().backward()  # training keeps F.linear and its gradient
    assert calls == [] and layer.weight.grad is not None


def test_switching_keeps_every_parameter_and_the_state_dict():
    model = nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 2, bias=False))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    assert use_skinny_linears(model) == 2
    assert all(type(m) is SkinnyLinear for m in (model[0], model[2]))
    after = model.state_dict()
    assert after.keys() == before.keys() and all(torch.equal(after[k], before[k]) for k in before)
    assert use_skinny_linears(model) == 0  # already switched

"""The CPU matmul for 2-4 rows: the same product as nn.Linear, on the same parameters, at
inference only, taken for the rows it measured faster at; the runtime uses it and still decodes
losslessly (tests/test_embedded_pair.py)."""

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
    use_skinny_linears(layer, rows=skinny.SKINNY_ROWS)  # the other product wherever it applies
    with torch.inference_mode():
        out = layer(x)
    assert out.shape == expected.shape and out.is_contiguous()
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


def test_only_the_rows_it_was_given_at_inference_take_the_other_product(monkeypatch):
    calls = []
    real_mm = torch.mm
    monkeypatch.setattr(skinny.torch, "mm", lambda *a: calls.append(a[1].shape[1]) or real_mm(*a))
    layer = nn.Linear(8, 8)
    use_skinny_linears(layer, rows=skinny.SKINNY_ROWS)
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


@pytest.mark.parametrize("faster, rows", [("other", {2, 3, 4}), ("linear", set()), ("same", set())])
def test_a_weight_shape_takes_the_other_product_only_where_it_measured_faster(monkeypatch, faster, rows):
    """Which product wins depends on the CPU and its BLAS (AVX2 MKL: weight @ x.T; an AVX-512 Xeon:
    F.linear, by 3x on a 49152-row head), so it is measured per weight shape, once, with a margin."""
    monkeypatch.setattr(skinny, "_chosen", {})
    weight, calls = torch.randn(24, 16), []

    def seconds(product):  # weight @ x.T returns [out, rows], F.linear [rows, out]
        other = product().shape[0] == 24
        calls.append(other)
        return {"other": 1.0 if other else 2.0, "linear": 2.0 if other else 1.0, "same": 1.0}[faster]

    assert skinny.faster_rows(weight, seconds=seconds) == rows
    assert sorted(calls) == [False] * 3 + [True] * 3  # each product at 2, 3 and 4 rows
    assert skinny.faster_rows(weight, seconds=seconds) == rows and len(calls) == 6  # once per shape


def test_switching_gives_each_layer_its_shapes_measured_rows(monkeypatch):
    monkeypatch.setattr(skinny, "faster_rows", lambda weight: frozenset({2}) if weight.shape[0] == 6 else frozenset())
    model = nn.Sequential(nn.Linear(4, 6), nn.Linear(6, 2))
    use_skinny_linears(model)
    assert model[0].skinny_rows == {2} and model[1].skinny_rows == frozenset()

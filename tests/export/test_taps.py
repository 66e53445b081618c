"""A drafter reads its target's hidden states in its own `target_layer_ids` order, a layer repeated
where the list repeats it (the DFlash authors' `build_target_layer_ids(4, 2)` gives [1, 1] for a
4-layer target). Every flavour's target graph taps them that way, checked against HF's hidden states."""

import pytest
import torch

from dflash_trt.export.bundle import export_bundle
from dflash_trt.models.checkpoints import load_drafter, load_target
from contract1_runner import OrtBundle, OrtTargetSession
from factories import make_drafter, make_target

ATOL = 1e-4  # float32 on one CPU: reduction-order round-off
PROMPT = [3, 17, 99, 4, 250, 31, 8, 77]


@pytest.mark.parametrize("family", ["qwen3", "qwen3_5_text"])
@pytest.mark.parametrize("taps", [(1, 1), (2, 0)])
def test_every_flavour_taps_the_drafters_layers_in_its_order(tmp_path, family, taps):
    target, tokenizer = load_target(str(make_target(tmp_path / family, family)))
    drafter = load_drafter(make_drafter(tmp_path / "draft", target_layer_ids=list(taps)))
    for flavour in ("portable", "slots"):  # each checked against its PyTorch module by polygraphy
        bundle = export_bundle(target, drafter, tokenizer, tmp_path / flavour, flavour=flavour, check=True)
    with torch.no_grad():
        out = target.model(torch.tensor([PROMPT]), output_hidden_states=True)
    # HF's hidden_states[k + 1] is layer k's output (the last one after the final norm)
    expected = torch.cat([out.hidden_states[k + 1][0] for k in taps], dim=-1)
    _, features = OrtTargetSession(OrtBundle(tmp_path / "portable")).prefill(PROMPT)
    torch.testing.assert_close(features, expected, atol=ATOL, rtol=0)
    assert bundle.is_dir()

"""Our drafter against the authors' reference (PyPI `dflash` 0.1.0) loading the same weights."""

import pytest
import torch
from factories import draft_config_dict
from transformers import Qwen3Config

from dflash_trt.models.draft_config import DraftConfig
from dflash_trt.models.drafter import DFlashDrafter

reference = pytest.importorskip("dflash.model", reason="test oracle: pip install --no-deps dflash==0.1.0")

CASES = {
    "full": dict(layers=2, block_size=4),
    "deep-b16": dict(layers=3, block_size=16, target_layer_ids=[0, 1, 2, 3]),
    "sliding-causal": dict(layers=2, block_size=8, layer_types=["sliding_attention", "full_attention"], sliding_window=6,
        use_sliding_window=True),
    "sliding-noncausal": dict(
        layers=2, block_size=8, layer_types=["full_attention", "sliding_attention"], sliding_window=5, is_causal=False,
        use_sliding_window=True,
    ),
    "one-layer-b2": dict(layers=1, block_size=2, target_layer_ids=[2]),
}


def build_pair(raw, seed):
    torch.manual_seed(seed)
    # the reference derives default layer ids eagerly, so it always needs num_target_layers
    ref = reference.DFlashDraftModel(Qwen3Config(**raw, num_target_layers=4)).eval()
    with torch.no_grad():
        for p in ref.parameters():
            p.copy_(torch.randn_like(p) * 0.2 + (1.0 if p.dim() == 1 else 0.0))
    ours = DFlashDrafter(DraftConfig.from_dict(raw)).eval()
    state = {k: v for k, v in ref.state_dict().items() if "rotary" not in k}
    ours.load_state_dict(state, strict=True)
    return ref, ours


@pytest.mark.parametrize("case", CASES)
def test_block_outputs_match_reference_over_two_steps(case):
    raw = draft_config_dict(**CASES[case])
    config = DraftConfig.from_dict(raw)
    ref, ours = build_pair(raw, seed=len(case))
    hidden, taps, block = config.hidden_size, len(config.target_layer_ids), config.block_size
    gen = torch.Generator().manual_seed(1)
    cache = reference._make_cache(ref.config)  # the reference's own cache set-up
    context, length = None, 0
    for new_ctx in (11, 3):  # prefill-sized context, then a verify step's accepted tokens
        feats = torch.randn(1, new_ctx, taps * hidden, generator=gen)
        noise = torch.randn(1, block, hidden, generator=gen)
        start = length + new_ctx
        with torch.no_grad():
            expected = ref(
                target_hidden=feats,
                noise_embedding=noise,
                position_ids=torch.arange(length, start + block)[None],
                past_key_values=cache,
                use_cache=True,
            )
            cache.crop(-block)  # the reference drops block K/V after each draft
            new_kv = ours.inject_context(feats, torch.arange(length, start)[None])
            context = new_kv if context is None else [
                (torch.cat([k, nk], 2), torch.cat([v, nv], 2)) for (k, v), (nk, nv) in zip(context, new_kv)
            ]
            got = ours.block_hidden(
                noise, torch.arange(start, start + block)[None], context, torch.arange(0, start)[None]
            )
        length = start
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)

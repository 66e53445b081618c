"""Grouped-query attention without copied K/V heads, for the torch runtime on a CPU.

HF's "sdpa" attention hands grouped K/V to PyTorch's SDPA as they are only when no mask is passed
(on a CPU, one token at a time also takes a packed path). A verify of 2+ tokens after a cache
passes a mask, so every layer first repeats each K/V head for its query group: on SmolLM2 (9 query
heads over 3 K/V heads) three copies of the whole cache per layer per verify, work that grows with
the context and that plain decoding never pays. PyTorch's SDPA takes grouped K/V with a mask too
(`enable_gqa`), with the same result. Measured on our 2-core VM, one layer's attention for 4
queries over 300 / 2000 cached keys: 245 / 926 us with repeated heads, 126 / 492 us grouped,
outputs equal to the last bit.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F
from transformers import AttentionInterface, AttentionMaskInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import sdpa_mask

# Not "dflash_...": HF takes any implementation name that contains "flash" for a flash-attention kernel.
NAME = "cpu_grouped_sdpa"


def grouped_sdpa_forward(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """HF's sdpa attention with K/V heads left grouped on a CPU. Anything else (a GPU, where HF
    keeps its own kernel choices, or an option this path does not spell out) goes to HF's."""
    extras = any(kwargs.get(name) is not None for name in ("softcap", "position_bias", "cache"))
    if not query.is_cpu or extras or query.shape[1] == key.shape[1]:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, is_causal=is_causal, **kwargs)
    q_length = query.shape[2]
    # HF's rule: SDPA's own causal mask only where HF passed none, and never for one query
    causal = q_length > 1 and attention_mask is None and (
        is_causal if is_causal is not None else getattr(module, "is_causal", True))
    if causal and key.shape[2] > q_length:  # as HF: an empty static cache's prefill
        key, value = key[:, :, :q_length], value[:, :, :q_length]
    out = F.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask, dropout_p=dropout,
                                         scale=scaling, is_causal=causal, enable_gqa=True)
    return out.transpose(1, 2).contiguous(), None


AttentionInterface.register(NAME, grouped_sdpa_forward)
AttentionMaskInterface.register(NAME, sdpa_mask)  # the masks HF builds for "sdpa"


def use_grouped_attention(model: nn.Module) -> bool:
    """Switch an HF model that runs "sdpa" attention to `grouped_sdpa_forward`, in place; True if
    switched. Other implementations (eager, flash) are the caller's choice and stay."""
    if model.config._attn_implementation != "sdpa":
        return False
    model.set_attn_implementation(NAME)
    return True

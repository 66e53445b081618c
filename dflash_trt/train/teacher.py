"""The target's own next-token distributions as soft labels (distillation, `train-drafter --distill`).

A corpus label is the target's greedy token; the distribution it was the argmax of also says how
sure the target was and which tokens came close. On a small corpus that is more signal per token
than the hard label alone (a drafter on a 2-core CPU sees thousands of responses, not 800k).

It costs little: the features already hold the residual stream after the deepest tapped layer, so
running only the target's remaining layers and its final norm on it gives the final hidden state a
full forward would (equal in fp32; bf16-stored features give it to bf16 precision). For
SmolLM2-135M (taps up to 27 of 30) that is 2 of its 30 layers.
"""

from __future__ import annotations

import torch
from torch.nn import functional as F
from transformers import PreTrainedModel

from dflash_trt.errors import DFlashError
from dflash_trt.models.target import ATTENTION_ONLY


def check_distillable(model: PreTrainedModel) -> None:
    """The layers after the tap are re-run with a plain causal mask: attention-only targets."""
    model_type = model.config.model_type
    if model_type not in ATTENTION_ONLY:
        raise DFlashError(
            f"--distill: recomputing the target's distribution from its tapped features needs an attention-only "
            f"target; '{model_type}' has recurrent layers"
        )


@torch.no_grad()
def final_hidden(model: PreTrainedModel, tap_hidden: torch.Tensor, tap_layer: int) -> torch.Tensor:
    """[b, S, H] residual stream after layer `tap_layer` -> the final normed hidden state (what the
    LM head reads), by running layers tap_layer+1.. under a causal mask. Rows are right-padded:
    a real position never attends to the padding after it."""
    decoder = model.get_decoder()
    b, s, _ = tap_hidden.shape
    hidden = tap_hidden.to(next(decoder.parameters()).dtype)
    positions = torch.arange(s, device=hidden.device)[None].expand(b, s)
    rope = decoder.rotary_emb(hidden, position_ids=positions)
    # an additive mask works the same under the eager and the SDPA attention implementations
    causal = torch.full((s, s), float("-inf"), dtype=hidden.dtype, device=hidden.device).triu(1)[None, None]
    for layer in decoder.layers[tap_layer + 1 :]:
        hidden = layer(hidden, attention_mask=causal, position_ids=positions, position_embeddings=rope)
    return decoder.norm(hidden)


@torch.no_grad()
def teacher_logprobs(
    final: torch.Tensor, positions: torch.Tensor, block_size: int, head_rows: torch.Tensor
) -> torch.Tensor:
    """Log-probabilities [b*n, B-1, V'] of the target for block slots 1..B-1.

    `final` is [b, L, H] (one row per token but each sequence's last), `positions` the blocks'
    [b, n*B] slot positions. Slot k of a block at anchor a is labelled with the token at a+k, which
    the target predicted from row a+k-1. Rows past a sequence's end are clamped; their labels are
    ignored anyway. `head_rows` are the LM head's rows for the ids the training logits cover.
    """
    b, length, width = final.shape
    rows = positions.view(b, -1, block_size)[:, :, 1:].to(final.device) - 1
    rows = rows.clamp(0, length - 1).reshape(b, -1)
    picked = torch.gather(final, 1, rows[..., None].expand(-1, -1, width)).reshape(-1, width)
    logits = (picked @ head_rows.T).view(-1, block_size - 1, head_rows.shape[0])
    return F.log_softmax(logits.float(), dim=-1)

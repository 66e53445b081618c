"""The DFlash training objective on one sequence (research/dflash.md §3).

Random anchors a_b are drawn from response positions. Block b is [x_a, MASK x (B-1)] at positions
a..a+B-1; it sees the context rows strictly before its anchor and its own B rows (both ways),
never another block. Slot k predicts x_{a+k} (same position, no shift), weighted by
exp(-(k-1)/gamma). All blocks of a sequence go through the drafter in one packed pass; several sequences are
padded into one batch (`stack_blocks`) so a GPU step is not launch-bound.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch.nn import functional as F

from dflash_trt.errors import DFlashError
from dflash_trt.models.draft_vocab import scale_logits
from dflash_trt.models.drafter import DFlashDrafter

IGNORE = -100


@dataclass
class Blocks:
    anchors: torch.Tensor  # [N]
    ids: torch.Tensor  # [N*B] block input ids
    positions: torch.Tensor  # [N*B]
    labels: torch.Tensor  # [N, B-1], IGNORE past the sequence end
    visible: torch.Tensor  # [1, 1, N*B, ctx + N*B] bool


def sample_anchors(seq_len: int, prompt_len: int, count: int, generator: torch.Generator) -> torch.Tensor:
    """Distinct sorted anchors in [prompt_len, seq_len - 2]: response tokens with a label after them."""
    valid = seq_len - 1 - prompt_len
    if valid <= 0:
        return torch.empty(0, dtype=torch.long)
    pick = torch.randperm(valid, generator=generator)[: min(count, valid)]
    return (pick + prompt_len).sort().values


def make_blocks(
    tokens: torch.Tensor,
    anchors: torch.Tensor,
    block_size: int,
    mask_id: int,
    ctx_len: int,
    lengths: torch.Tensor | None = None,
) -> Blocks:
    """Blocks of `block_size` slots at `anchors`. With `lengths` [N], block b is a shorter block of
    lengths[b] slots padded to block_size: its slots from lengths[b] on carry no label and no real
    slot sees them (a padding slot sees only itself), so it trains exactly what decoding with that
    verify block size runs (the block attends both ways: its length changes every slot's output)."""
    n, size = anchors.shape[0], block_size
    offsets = torch.arange(size)
    positions = anchors[:, None] + offsets  # [N, B]
    ids = torch.full((n, size), mask_id, dtype=torch.long)
    ids[:, 0] = tokens[anchors]
    real_slot = offsets[None, :] < (torch.full((n,), size) if lengths is None else lengths)[:, None]  # [N, B]
    label_pos = positions[:, 1:]
    in_sequence = label_pos < tokens.shape[0]
    labels = torch.where(in_sequence & real_slot[:, 1:], tokens[label_pos.clamp(max=tokens.shape[0] - 1)], IGNORE)
    # context column j is visible to block b iff j < a_b; block columns only within the same block
    ctx_visible = torch.arange(ctx_len)[None, :] < anchors[:, None]  # [N, ctx]
    ctx_visible = ctx_visible.repeat_interleave(size, dim=0)  # [N*B, ctx]
    block_of = torch.arange(n).repeat_interleave(size)
    real = real_slot.flatten()
    slots_meet = (real[:, None] & real[None, :]) | torch.eye(n * size, dtype=torch.bool)  # padding: itself only
    own_block = (block_of[:, None] == block_of[None, :]) & slots_meet  # [N*B, N*B]
    visible = torch.cat([ctx_visible, own_block], dim=1)[None, None]
    return Blocks(anchors, ids.flatten(), positions.flatten(), labels, visible)


def position_weights(block_size: int, gamma: float) -> torch.Tensor:
    """w_k = exp(-(k-1)/gamma) for slots k = 1..B-1: early slots matter most for acceptance."""
    return torch.exp(-torch.arange(block_size - 1, dtype=torch.float32) / gamma)


def default_gamma(block_size: int) -> float:
    """SpecForge's published choices (7 for B=16, 5 for B=10, 4 for B=8), interpolated."""
    return {16: 7.0, 10: 5.0, 8: 4.0}.get(block_size, max(1.0, block_size / 2 - 1))


@dataclass
class BlockBatch:
    """Several sequences' blocks, padded to a common context length and block count."""

    features: torch.Tensor  # [b, L, F]
    ids: torch.Tensor  # [b, n*B]
    positions: torch.Tensor  # [b, n*B]
    labels: torch.Tensor  # [b*n, B-1]; a padding block's labels are all IGNORE
    visible: torch.Tensor  # [b, 1, n*B, L + n*B]

    @property
    def real_blocks(self) -> torch.Tensor:
        """[b*n] bool: every real block has a label at slot 1 (anchors stop 2 before the end)."""
        return self.labels[:, 0] != IGNORE


def stack_blocks(items: list[tuple[torch.Tensor, Blocks]], mask_id: int) -> BlockBatch:
    """Pad (features, blocks) pairs into one batch. Padding blocks see only themselves (never an
    empty attention row) and padding context columns are visible to no one."""
    b = len(items)
    n = max(blocks.anchors.shape[0] for _, blocks in items)
    ctx = max(features.shape[0] for features, _ in items)
    size = items[0][1].labels.shape[1] + 1
    features = items[0][0].new_zeros(b, ctx, items[0][0].shape[1])
    ids = torch.full((b, n * size), mask_id, dtype=torch.long)
    positions = torch.zeros(b, n * size, dtype=torch.long)
    labels = torch.full((b * n, size - 1), IGNORE, dtype=torch.long)
    visible = torch.zeros(b, 1, n * size, ctx + n * size, dtype=torch.bool)
    block_of = torch.arange(n).repeat_interleave(size)
    visible[:, 0, :, ctx:] = block_of[:, None] == block_of[None, :]
    for i, (feats, blocks) in enumerate(items):
        k, c = blocks.anchors.shape[0], feats.shape[0]
        features[i, :c] = feats
        ids[i, : k * size] = blocks.ids
        positions[i, : k * size] = blocks.positions
        labels[i * n : i * n + k] = blocks.labels
        visible[i, 0, : k * size, :c] = blocks.visible[0, 0, :, :c]
        visible[i, 0, : k * size, ctx : ctx + k * size] = blocks.visible[0, 0, :, c:]  # shorter blocks' padding
    return BlockBatch(features, ids, positions, labels, visible)


def block_logits(
    drafter: DFlashDrafter,
    embed: torch.Tensor,
    head_rows: torch.Tensor,
    batch: BlockBatch,
) -> torch.Tensor:
    """Packed drafter pass -> logits [b*n, B-1, V'] for slots 1..B-1, one column per row of
    `head_rows` [V', H]: the LM head's rows for the ids the caller scores (the labels must all be
    among them). On CPU the 49k-row LM head otherwise costs more than the whole drafter.
    """
    if drafter.config.method == "dflash2":  # packed blocks would leak into each other through its convolutions
        raise DFlashError("training a DFlash2 drafter is not supported (train-drafter packs blocks); train DFlash ones")
    features = batch.features
    b, ctx_len = features.shape[:2]
    device = features.device
    ctx_positions = torch.arange(ctx_len, device=device)[None].expand(b, ctx_len)
    context = drafter.inject_context(features, ctx_positions)
    hidden = drafter.block_hidden(
        F.embedding(batch.ids.to(device), embed),
        batch.positions.to(device),
        context,
        ctx_positions,
        visible=batch.visible.to(device),
    )
    rows, width = batch.labels.shape[0], hidden.shape[-1]
    hidden = hidden.reshape(rows, -1, width)[:, 1:].reshape(-1, width)  # slot 0 is the anchor itself
    # one 2-D GEMM: a 3-D `hidden @ head_rows.T` runs as a batched matmul, ~8x slower on CPU
    logits = (hidden @ head_rows.T).view(rows, -1, head_rows.shape[0])
    return scale_logits(logits, drafter.config.output_multiplier, drafter.config.final_logit_softcapping)


def weighted_loss(
    logits: torch.Tensor,
    labels: torch.Tensor,
    weights: torch.Tensor,
    teacher: torch.Tensor | None = None,
    distill: float = 0.0,
) -> torch.Tensor:
    """Position-weighted cross-entropy over valid labels. logits [N, B-1, V'], labels [N, B-1].

    With `teacher` (the target's log-probabilities, same shape as logits) a `distill` share of each
    token's loss is the cross-entropy against that soft distribution instead of the hard label.
    """
    valid = labels != IGNORE
    log_probs = F.log_softmax(logits, dim=-1)  # once, for the hard and the soft term
    per_token = F.nll_loss(log_probs.flatten(0, 1), labels.clamp(min=0).flatten(), reduction="none")
    if teacher is not None and distill > 0:
        soft = -(teacher.exp() * log_probs).sum(-1).flatten()
        per_token = (1 - distill) * per_token + distill * soft
    w = (weights[None, :].to(logits.device) * valid).flatten()
    return (per_token * w).sum() / w.sum().clamp(min=1e-8)


def greedy_acceptance(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """τ per block if the labels are the target's greedy continuation: 1 + matching prefix length."""
    match = (logits.argmax(-1) == labels) & (labels != IGNORE)
    return 1 + match.long().cumprod(dim=1).sum(dim=1)


def decode_walk(accepted: torch.Tensor) -> tuple[int, int]:
    """(tokens, steps) of greedy decoding over a response, given the acceptance length of a block
    anchored at each of its positions: each step commits its accepted drafts plus the target's
    token, and the next block is anchored at that token."""
    tokens = steps = position = 0
    while position < accepted.shape[0]:
        length = int(accepted[position])
        steps, tokens, position = steps + 1, tokens + length, position + length
    return tokens, steps


def warmup_cosine(step: int, total: int, warmup: int) -> float:
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))

"""DFlash2's two drafter parts. The block pass, the target side and KV injection are DFlash's; DFlash2
adds, per draft layer, a grouped dynamic causal convolution around the attention and around the
MLP, and after the head a candidate selector that makes neighbouring drafts agree.

Convolution: over the block's own positions only (position 0, the anchor, reads zero padding: the
taps never reach the context or a previous block). Output position t is
    sum over taps o < K of (base[o] + dynamic[t, o, group]) * x[t - o]
with a learned per-channel base kernel and a per-position correction projected from the hidden
state, one value per group of `group_size` channels. One module holds both uses: the correction
for the sublayer's input and for its output are projected together from the sublayer's input.

Selector: each drafted position keeps its `top_k` candidates by logit (the unary score); walking
from the anchor token, each position picks the candidate maximising unary + the low-rank pairwise
score  <predecessor_codebook[previous pick] * projected hidden, successor_codebook[candidate]>.

Parameter names are the published checkpoints': `layers.N.attention_conv.base_kernel`,
`.kernel_projection.weight`, `layers.N.mlp_conv.*`, and `candidate_selector.predecessor_codebook`,
`.successor_codebook` (bare tensors), `.hidden_projection.weight`.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn
from torch.nn import functional as F


class GroupedDynamicConv(nn.Module):
    """A group's correction reaches its channels in one of two equal ways (bit for bit: the export's
    check compares the two). Run in PyTorch, by broadcasting over a [groups, group_size] view of the
    channels: half the kernels of a product with a one-hot [G, H] matrix, and half the time (an
    `around` on the CPU, 4 positions: about 0.2 ms against 0.4 at 576 wide, 1.7 against 2.7 at 2560).
    Traced for export, by that product: one node, where the views trace to reshapes that read shapes
    at run time (onnxruntime pays per node: the embedded pair's DFlash2 twin drafted 3 % slower with
    them). A tap's shift is a slice and a pad of constant bounds."""

    def __init__(self, hidden_size: int, kernel_size: int, group_size: int):
        super().__init__()
        self.kernel_size, self.group_size = kernel_size, group_size
        self.groups = hidden_size // group_size
        base = torch.zeros(2, kernel_size, hidden_size)
        base[:, 0] = 1.0  # an untrained conv passes its input through
        self.base_kernel = nn.Parameter(base)
        self.kernel_projection = nn.Linear(hidden_size, 2 * kernel_size * self.groups, bias=False)

    def kernels(self, x: torch.Tensor) -> list[torch.Tensor]:
        """Per (side, tap), each position's kernel [b, n, H]: the base plus the correction of the
        channel's group (the projection's columns are [side, tap, group])."""
        chunks, groups = 2 * self.kernel_size, self.groups
        projected, base = self.kernel_projection(x), self.base_kernel.flatten(0, 1).to(x.dtype)  # base [2K, H]
        if torch.jit.is_tracing():
            group_of = torch.arange(groups * self.group_size, device=x.device) // self.group_size
            spread = (group_of[None, :] == torch.arange(groups, device=x.device)[:, None]).to(x.dtype)  # [G, H]
            return [base[c] + chunk @ spread for c, chunk in enumerate(projected.split(groups, dim=-1))]
        correction = projected.unflatten(-1, (chunks, groups, 1))  # [b, n, 2K, G, 1]
        return list((correction + base.unflatten(-1, (groups, self.group_size))).flatten(-2).unbind(2))

    def convolve(self, x: torch.Tensor, kernels: list[torch.Tensor]) -> torch.Tensor:
        """x [b, n, H], kernels: per tap [b, n, H] -> [b, n, H], causal over the n positions."""
        out = kernels[0] * x
        for tap in range(1, self.kernel_size):
            shifted = F.pad(x[:, :-tap], (0, 0, tap, 0))  # x[t - tap], zero before the block
            out = out + kernels[tap] * shifted
        return out

    def around(self, sublayer: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        """conv_after(sublayer(conv_before(x))), both sides' kernels projected from x."""
        kernels, k = self.kernels(x), self.kernel_size
        return self.convolve(sublayer(self.convolve(x, kernels[:k])), kernels[k:])


class CandidateSelector(nn.Module):
    """`max_drafts`: the most positions a traced graph walks (its block pass drafts up to the
    drafter's block size - 1): the walk is sequential, so a trace unrolls it over that many
    positions (zero padding past the block's own) and keeps the first ones, for every block size."""

    def __init__(self, vocab_size: int, hidden_size: int, rank: int, top_k: int, max_drafts: int):
        super().__init__()
        self.top_k, self.max_drafts = top_k, max_drafts
        self.predecessor_codebook = nn.Parameter(torch.randn(vocab_size, rank) * 0.02)
        self.successor_codebook = nn.Parameter(torch.randn(vocab_size, rank) * 0.02)
        self.hidden_projection = nn.Linear(hidden_size, rank, bias=False)

    def forward(self, hidden: torch.Tensor, logits: torch.Tensor, anchor: torch.Tensor,
                token_ids: torch.Tensor | None = None) -> torch.Tensor:
        """hidden [b, n, H] and logits [b, n, V'] of the drafted positions, anchor [b] (the block's
        first token) -> the greedy path [b, n] of target ids. `token_ids` maps a draft vocabulary's
        columns to target ids (the codebooks are indexed by target id)."""
        return self.walk(*self.tables(hidden, logits, anchor, token_ids))

    def tables(self, hidden: torch.Tensor, logits: torch.Tensor, anchor: torch.Tensor,
               token_ids: torch.Tensor | None = None):
        """-> (n, columns [b, s, k] of the draft vocabulary, candidates [b, s, k] as target ids, scores
        [b, s, k before, k here]): position t's score of candidate j after candidate i of position t-1
        (position 0's rows all score after the anchor). s = n, or max_drafts while traced."""
        n = hidden.shape[1]
        unary, columns = torch.topk(logits, self.top_k, dim=-1)  # [b, n, k]
        projected = self.hidden_projection(hidden)  # [b, n, r]
        steps = n
        if torch.jit.is_tracing():  # static: max_drafts positions, the block's own first
            steps = self.max_drafts
            # zeros past the block's own (a pad of constant size: no node reads a shape)
            unary, columns, projected = (F.pad(t, (0, 0, 0, steps)).narrow(1, 0, steps)
                                         for t in (unary, columns, projected))
        candidates = columns if token_ids is None else token_ids[columns]
        # The pairwise score of candidate j after candidate i of the position before is
        # <predecessor[i], projected * successor[j]>: every position's [k, k] table in one product.
        weighted = F.embedding(candidates, self.successor_codebook) * projected[:, :, None, :]  # [b, s, k, r]
        first = (weighted[:, 0] @ F.embedding(anchor, self.predecessor_codebook)[:, :, None])[..., 0]  # [b, k]
        before = F.embedding(candidates[:, :-1], self.predecessor_codebook)  # [b, s-1, k, r]
        pairwise = before @ weighted[:, 1:].transpose(-1, -2)  # [b, s-1, k before, k here]
        k = self.top_k
        scores = torch.cat([(unary[:, :1] + first[:, None])[:, :, None, :].expand(-1, 1, k, k),
                            unary[:, 1:, None, :] + pairwise], dim=1)
        return n, columns, candidates, scores

    def walk(self, n: int, columns: torch.Tensor, candidates: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        """The greedy path [b, n] of target ids through `tables`' scores."""
        # A position's pick depends on the position before only through that pick, so every position's
        # best candidate after each candidate of the one before is known at once, and the walk only
        # follows them (one gather a position). It follows flat indices t * k + pick of position t:
        # follow[t * k + i] is position t+1's flat index after pick i at position t.
        k, steps = self.top_k, scores.shape[1]
        starts = torch.arange(steps, device=scores.device) * k  # [s]: where each position's k indices start
        best = scores[:, 1:].argmax(dim=-1)  # [b, s-1, k before]
        follow = (best + starts[1:, None]).flatten(1)  # [b, (s-1) * k]
        flat = [scores[:, 0, 0].argmax(dim=-1, keepdim=True)]  # position 0's pick: [b, 1]
        for _ in range(1, steps):
            flat.append(follow.gather(1, flat[-1]))
        picks = torch.cat(flat, dim=1) - starts  # [b, s]
        return candidates.gather(-1, picks[..., None]).squeeze(-1).narrow(1, 0, n)

"""Train a DFlash drafter on a target-regenerated corpus: frozen target, resumable, seeded."""

from __future__ import annotations

import json
import os
import random
import shutil
import time
import zlib
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from dflash_trt.errors import DFlashError
from dflash_trt.models.checkpoints import load_drafter, resolve_draft, save_drafter
from dflash_trt.models.draft_config import DraftConfig
from dflash_trt.models.draft_vocab import most_frequent, response_counts
from dflash_trt.models.drafter import DFlashDrafter
from dflash_trt.models.target import TargetModel
from dflash_trt.train.data import read_shard, tapped_features
from dflash_trt.train.objective import (
    IGNORE,
    block_logits,
    decode_walk,
    default_gamma,
    greedy_acceptance,
    make_blocks,
    position_weights,
    sample_anchors,
    stack_blocks,
    warmup_cosine,
    weighted_loss,
)
from dflash_trt.train.teacher import check_distillable, final_hidden, teacher_logprobs

OUTSIDE_DRAFT_VOCAB = -1  # a label the draft vocabulary cannot produce: it never matches a draft


@dataclass(frozen=True)
class TrainConfig:
    layers: int = 2
    block_size: int = 16
    # verify block sizes to train, each block's drawn at random (e.g. (16, 8, 4)); empty: block_size
    # only. A drafter trained on 16-slot blocks alone drafts worse at B=8 (its slots attend to the
    # whole block), and the smaller verify is what pays on a CPU.
    block_sizes: tuple[int, ...] = ()
    mask_token_id: int = 16
    anchors: int = 24  # blocks per sequence per step
    batch: int = 1  # sequences per step (padded together; raise it on a GPU)
    bf16: bool = False  # autocast the drafter's matmuls to bfloat16 (fp32 weights and optimizer state)
    epochs: float = 1.0
    lr: float = 6e-4
    # position-weight decay (None: the published value for the block size). A weak drafter gains
    # most from its first slots, since acceptance is a product over them: a smaller gamma focuses there.
    gamma: float | None = None
    # share of each token's loss taken against the target's own next-token distribution instead of
    # its greedy token (soft labels: more signal per token from a small corpus); 0 = hard labels only
    distill: float = 0.0
    warmup: float = 0.04
    grad_clip: float = 1.0
    weight_decay: float = 0.0
    val_share: float = 0.05
    init_from_target: bool = True
    init_drafter: str | None = None  # start from this drafter's weights (fine-tune) instead
    seed: int = 0
    max_minutes: float | None = None  # stop early (and still write the drafter) after this long
    checkpoint_every: int = 200
    # the drafter proposes only the `draft_vocab` most frequent response tokens of its training split
    # (models/draft_vocab.py: a smaller head, a faster draft); 0: the whole vocabulary
    draft_vocab: int = 16384

    def __post_init__(self):
        if self.gamma is not None and not self.gamma > 0:
            raise DFlashError(f"gamma must be positive (got {self.gamma})")
        if not 0 <= self.distill <= 1:
            raise DFlashError(f"distill is a share of the loss, between 0 and 1 (got {self.distill})")
        wrong = [size for size in self.block_sizes if not 2 <= size <= self.block_size]
        if wrong:
            raise DFlashError(f"block sizes {wrong}: each trained block size must be between 2 and the "
                              f"drafter's block size {self.block_size}")

    @property
    def trained_sizes(self) -> tuple[int, ...]:
        return tuple(sorted(set(self.block_sizes), reverse=True)) or (self.block_size,)


def check_bf16(device: str) -> None:
    """Refuse --bf16 where bfloat16 matmuls run in software: on a CPU without AVX512-BF16 or AMX
    they are emulated, and a training step took 26x longer than in fp32 (21.8 s against 0.84 s on
    a 2-core AVX2 machine), so the flag would silently turn an hour's run into a day's."""
    if torch.device(device).type != "cpu":
        return
    if torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported():
        return
    raise DFlashError(
        f"--bf16: this CPU ({torch.backends.cpu.get_cpu_capability()}) has no AVX512-BF16 or AMX, so bfloat16 "
        "matmuls run emulated, about 25x slower than fp32; train without --bf16"
    )


def draft_config_for(target: TargetModel, taps: tuple[int, ...], config: TrainConfig) -> DraftConfig:
    """A drafter shaped like the target's own layers (same heads, MLP width, RoPE)."""
    t = target.config
    raw = dict(
        hidden_size=t.hidden_size,
        intermediate_size=t.intermediate_size,
        num_hidden_layers=config.layers,
        num_attention_heads=t.num_attention_heads,
        num_key_value_heads=t.num_key_value_heads,
        head_dim=getattr(t, "head_dim", None) or t.hidden_size // t.num_attention_heads,
        rms_norm_eps=t.rms_norm_eps,
        rope_parameters=dict(t.rope_parameters),
        max_position_embeddings=t.max_position_embeddings,
        vocab_size=target.vocab_size,
        hidden_act="silu",
        attention_bias=False,
        model_type="qwen3",
        dflash_config=dict(
            block_size=config.block_size, target_layer_ids=list(taps), mask_token_id=config.mask_token_id
        ),
        num_target_layers=target.num_layers,
    )
    return DraftConfig.from_dict(raw, where="train config")


def init_from_target(drafter: DFlashDrafter, target: TargetModel) -> None:
    """Copy target layers 0..L-1 into the draft layers (attention, MLP, norms).

    Those target layers read token embeddings, as the draft layers do for their block tokens; it
    gives a small-data run a working language-model start instead of noise. q_norm/k_norm have
    no target counterpart in Llama and stay at their identity initialisation.
    """
    source = target.model.model.layers
    with torch.no_grad():
        for index, layer in enumerate(drafter.layers):
            src = source[index]
            for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
                getattr(layer.self_attn, name).weight.copy_(getattr(src.self_attn, name).weight)
            for name in ("gate_proj", "up_proj", "down_proj"):
                getattr(layer.mlp, name).weight.copy_(getattr(src.mlp, name).weight)
            layer.input_layernorm.weight.copy_(src.input_layernorm.weight)
            layer.post_attention_layernorm.weight.copy_(src.post_attention_layernorm.weight)


def check_init_drafter(path: str, want: DraftConfig) -> None:
    """Refuse, before any work, a start drafter whose shape or DFlash contract (taps, block size,
    MASK id) differs from what this run trains. Reads config.json only."""
    have = DraftConfig.from_dir(resolve_draft(path))
    if have.method != want.method:  # train-drafter trains DFlash drafters (DFlash2 packs no blocks)
        raise DFlashError(f"{path}: cannot start from this drafter: it is {have.describe()}, this run trains "
                          f"{want.describe()}")
    for name in ("num_layers", "hidden_size", "block_size", "target_layer_ids", "mask_token_id"):
        if getattr(want, name) != getattr(have, name):
            raise DFlashError(
                f"{path}: cannot start from this drafter: its {name} is {getattr(have, name)}, "
                f"this run trains {getattr(want, name)}"
            )


def init_from_drafter(drafter: DFlashDrafter, path: str) -> None:
    """Start from a trained drafter's weights: fine-tuning it on a larger corpus."""
    check_init_drafter(path, drafter.config)
    drafter.load_state_dict(load_drafter(path).state_dict())


def load_corpus(corpus: Path) -> list[dict]:
    """Every sequence of the corpus, each with a stable `key` ("shard-00003:17")."""
    shards = sorted(corpus.glob("shard-*.safetensors"))
    if not shards:
        raise DFlashError(f"{corpus}: no corpus shards; build the corpus first")
    sequences = []
    for shard in shards:
        for row, seq in enumerate(read_shard(shard)):
            seq["key"] = f"{shard.stem}:{row}"
            sequences.append(seq)
    return sequences


SPLIT_FILE = "split.json"


def validation_keys(corpus: Path, sequences: list[dict], val_share: float) -> set[str]:
    """The held-out sequences, fixed once chosen: recorded in corpus/split.json.

    A corpus grows (a stopped build is resumed, more prompts are answered), and a run may start
    from a drafter trained on the smaller corpus. So a sequence's side never changes once a
    trainer has seen it; sequences in shards the file does not list yet are split by a hash of
    their key, independent of corpus size and order.
    """
    path = corpus / SPLIT_FILE
    record = {"val_share": val_share, "shards": [], "validation": []}
    if path.exists():
        record = json.loads(path.read_text())
        if record["val_share"] != val_share:
            raise DFlashError(f"{path}: the corpus was split with val_share {record['val_share']}, not {val_share}")
    known = set(record["shards"])
    held = set(record["validation"])
    fresh = sorted({seq["key"].split(":")[0] for seq in sequences} - known)
    if fresh:
        scale = 10_000
        new_keys = [seq["key"] for seq in sequences if seq["key"].split(":")[0] in fresh]
        rank = {key: zlib.crc32(key.encode()) % scale for key in new_keys}
        held |= {key for key in new_keys if rank[key] < val_share * scale}
        if not held:  # a tiny corpus still gets one held-out sequence
            held.add(min(new_keys, key=rank.get))
        record = {"val_share": val_share, "shards": sorted(known | set(fresh)), "validation": sorted(held)}
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(record, indent=1) + "\n")
        os.replace(tmp, path)
    return held


def corpus_taps(corpus: Path) -> tuple[int, ...]:
    return tuple(json.loads((corpus / "corpus.json").read_text())["taps"])


class Trainer:
    def __init__(self, target: TargetModel, corpus: Path, out: Path, config: TrainConfig, device: str | None = None):
        self.target, self.out, self.config = target, out, config
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        torch.manual_seed(config.seed)
        self.taps = corpus_taps(corpus)
        sequences = load_corpus(corpus)
        held = validation_keys(corpus, sequences, config.val_share)
        self.val = [seq for seq in sequences if seq["key"] in held]
        self.train = [seq for seq in sequences if seq["key"] not in held]
        if not self.val or not self.train:
            raise DFlashError(f"{corpus}: too few sequences ({len(sequences)}) for a training and a validation split")
        random.Random(config.seed).shuffle(self.train)
        self.drafter = DFlashDrafter(draft_config_for(target, self.taps, config))
        if config.init_drafter:
            init_from_drafter(self.drafter, config.init_drafter)
        elif config.init_from_target:
            init_from_target(self.drafter, target)
        self.drafter.to(self.device).train()
        stored = [seq["features"] is not None for seq in sequences]
        if any(stored) and not all(stored):
            raise DFlashError(f"{corpus}: some shards store target features and some do not; rebuild it")
        # A tokens-only corpus: the frozen target recomputes the features of each step's sequences.
        self.online_features = not all(stored)
        if config.distill:
            check_distillable(target.model)
        if self.online_features or config.distill:
            target.model.to(self.device)
        if self.device.type == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = True  # training only; the corpus tokens are fixed
            if not self.online_features:  # keep the whole corpus on the GPU: no copy per step
                for seq in sequences:
                    seq["features"] = seq["features"].to(self.device)
        # Frozen target pieces the drafter borrows: the embedding table and the (tied) LM head.
        self.embed = target.model.get_input_embeddings().weight.detach().to(self.device)
        self.head = target.lm_head.weight.detach().to(self.device)
        self.vocab, self.remap = self._training_vocab(sequences)
        self.vocab_head = self.head[self.vocab]  # the output rows training computes, gathered once, not per step
        # what the drafter will propose; validation drafts from it too
        self.use_draft_vocab(
            most_frequent(response_counts(self.train, target.vocab_size), config.draft_vocab) if config.draft_vocab else None
        )
        self.weights = position_weights(config.block_size, default_gamma(config.block_size) if config.gamma is None else config.gamma)
        self.optimizer = torch.optim.AdamW(
            self.drafter.parameters(), lr=config.lr, weight_decay=config.weight_decay, betas=(0.9, 0.95)
        )
        self.total_steps = max(1, int(len(self.train) * config.epochs / config.batch))
        self.step = 0
        self.generator = torch.Generator().manual_seed(config.seed)
        self.history: list[dict] = []
        self.started: float | None = None
        self.resumed_elapsed_s = 0.0

    def use_draft_vocab(self, ids: torch.Tensor | None) -> None:
        """Draft from these token ids (None: all) in validation and in the exported drafter."""
        self.drafter.draft_vocab = ids
        self.draft_head, self.draft_remap = self.head, None  # the rows validation drafts from
        if ids is not None:
            remap = torch.full((self.target.vocab_size,), OUTSIDE_DRAFT_VOCAB, dtype=torch.long)
            remap[ids] = torch.arange(ids.shape[0])
            self.draft_head, self.draft_remap = self.head[ids.to(self.device)], remap.to(self.device)

    def _training_vocab(self, sequences: list[dict]) -> tuple[torch.Tensor, torch.Tensor]:
        """Every token id in the corpus: the output layer is restricted to these while training."""
        seen = torch.zeros(self.target.vocab_size, dtype=torch.bool)
        for seq in sequences:
            seen[seq["tokens"]] = True
        vocab = seen.nonzero()[:, 0]
        remap = torch.full((self.target.vocab_size,), IGNORE, dtype=torch.long)
        remap[vocab] = torch.arange(vocab.shape[0])
        return vocab.to(self.device), remap

    # -- checkpoints ---------------------------------------------------------------------------

    def identity(self) -> dict:
        """Settings a checkpoint must share to be resumed (time limits and cadence may change)."""
        identity = {k: v for k, v in asdict(self.config).items() if k not in ("max_minutes", "checkpoint_every", "draft_vocab")}
        # unset: as checkpoints written before these settings existed
        if identity["gamma"] is None:
            del identity["gamma"]
        if not identity["distill"]:
            del identity["distill"]
        if identity["block_sizes"]:
            identity["block_sizes"] = list(identity["block_sizes"])
        else:
            del identity["block_sizes"]
        return identity

    def checkpoint_path(self) -> Path:
        return self.out / "checkpoint.pt"

    def save_checkpoint(self) -> None:
        state = {
            "step": self.step,
            "drafter": self.drafter.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "generator": self.generator.get_state(),
            "config": self.identity(),
            "history": self.history,
            # the clock-driven LR schedule resumes from here, not from a fresh warm restart
            "elapsed_s": self.elapsed_s(),
        }
        self.out.mkdir(parents=True, exist_ok=True)
        tmp = self.checkpoint_path().with_suffix(".tmp")
        torch.save(state, tmp)
        tmp.replace(self.checkpoint_path())

    def maybe_resume(self) -> None:
        path = self.checkpoint_path()
        if not path.exists():
            return
        state = torch.load(path, map_location=self.device, weights_only=True)
        if state["config"] != self.identity():
            raise DFlashError(f"{path}: checkpoint was trained with other settings; use a new output directory")
        self.drafter.load_state_dict(state["drafter"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.generator.set_state(state["generator"])
        self.step, self.history = state["step"], state["history"]
        self.resumed_elapsed_s = float(state.get("elapsed_s", 0.0))

    # -- training ------------------------------------------------------------------------------

    def _sampled_batch(
        self, sequences: list[dict], anchors: int, generator: torch.Generator, sizes: tuple[int, ...] | None = None
    ):
        """Sample anchors per sequence and pad their blocks into one batch (None if no anchors).
        Each block's length is drawn from `sizes` (default: the drafter's block size)."""
        picks = [sample_anchors(seq["tokens"].shape[0], seq["prompt_len"], anchors, generator) for seq in sequences]
        chosen = [(seq, p) for seq, p in zip(sequences, picks, strict=True) if p.numel()]
        return self._batch(chosen, self._block_lengths([p for _, p in chosen], sizes, generator))

    def _block_lengths(
        self, picks: list[torch.Tensor], sizes: tuple[int, ...] | None, generator: torch.Generator | None
    ) -> list[torch.Tensor] | None:
        """Each picked block's length: drawn from `sizes` when it names several, that size when it
        names one (no draw, so every size sees the same anchors), None for full-length blocks."""
        if not sizes or sizes == (self.config.block_size,):
            return None
        if len(sizes) == 1:
            return [torch.full_like(p, sizes[0]) for p in picks]
        table = torch.tensor(sizes)
        return [table[torch.randint(len(sizes), p.shape, generator=generator)] for p in picks]

    def _batch(self, chosen: list[tuple[dict, torch.Tensor]], lengths: list[torch.Tensor] | None = None):
        """Pad the blocks at the given anchors of each sequence into one batch (None if none);
        `lengths`, per sequence, makes shorter blocks (see `make_blocks`)."""
        cfg = self.config
        if not chosen:
            return None
        if self.online_features:
            features = tapped_features(self.target.model, [seq["tokens"] for seq, _ in chosen], self.taps)
        else:
            features = [seq["features"] for seq, _ in chosen]
        items = []
        for (seq, picked), feats, length in zip(chosen, features, lengths or [None] * len(chosen), strict=True):
            blocks = make_blocks(seq["tokens"], picked, cfg.block_size, cfg.mask_token_id, feats.shape[0], length)
            items.append((feats, blocks))
        batch = stack_blocks(items, cfg.mask_token_id)
        batch.features = batch.features.to(self.device, torch.float32)
        return batch

    def train_step(self, sequences: list[dict]) -> dict | None:
        cfg = self.config
        batch = self._sampled_batch(sequences, cfg.anchors, self.generator, cfg.trained_sizes)
        if batch is None:
            return None
        labels = batch.labels
        labels = torch.where(labels == IGNORE, IGNORE, self.remap[labels.clamp(min=0)]).to(self.device)
        # bf16 autocast halves the step on GPUs and on CPUs with AVX512-BF16/AMX; validation stays fp32.
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=cfg.bf16):
            logits = block_logits(self.drafter, self.embed, self.vocab_head, batch)
        logits = logits.float()
        teacher = self._teacher(batch) if cfg.distill else None
        loss = weighted_loss(logits, labels, self.weights, teacher, cfg.distill)
        lr = cfg.lr * warmup_cosine(*self.schedule_position())
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.drafter.parameters(), cfg.grad_clip)
        self.optimizer.step()
        real = batch.real_blocks.to(self.device)
        tau = greedy_acceptance(logits.detach(), labels)[real].float().mean().item()
        return {"step": self.step, "loss": loss.item(), "tau": tau, "lr": lr}

    def _teacher(self, batch) -> torch.Tensor:
        """The target's log-probabilities for the batch's labels, from its deepest tapped layer on."""
        deepest = max(range(len(self.taps)), key=self.taps.__getitem__)
        width = self.target.hidden_size
        tap = batch.features[..., deepest * width : (deepest + 1) * width]
        final = final_hidden(self.target.model, tap, self.taps[deepest])
        return teacher_logprobs(final, batch.positions, self.config.block_size, self.vocab_head)

    def elapsed_s(self) -> float:
        """Training time so far, across resumes: a time limit covers the whole run, not each part."""
        running = time.monotonic() - self.started if self.started is not None else 0.0
        return self.resumed_elapsed_s + running

    def schedule_position(self) -> tuple[int, int, int]:
        """(step, total, warmup) for the LR schedule. Under a time limit the schedule follows the
        clock instead, so the cosine still reaches zero when time runs out (not bit-reproducible)."""
        total, step = self.total_steps, self.step
        if self.config.max_minutes and self.started is not None:
            elapsed = self.elapsed_s() / (60 * self.config.max_minutes)
            step = max(step, int(elapsed * total))
        return step, total, max(1, int(self.config.warmup * total))

    def advance(self) -> dict | None:
        """One training step on the next sequences; the order is a pure function of (seed, step)."""
        picked = []
        for position in range(self.step * self.config.batch, (self.step + 1) * self.config.batch):
            epoch, index = divmod(position, len(self.train))
            order = self._epoch_order(epoch)
            picked.append(self.train[order[index]])
        record = self.train_step(picked)
        self.step += 1
        if record:
            self.history.append(record)
        return record

    def _epoch_order(self, epoch: int) -> list[int]:
        if getattr(self, "_order_epoch", None) != epoch:
            order = list(range(len(self.train)))
            random.Random(self.config.seed + epoch).shuffle(order)
            self._order_epoch, self._order = epoch, order
        return self._order

    def fit(self) -> dict:
        self.out.mkdir(parents=True, exist_ok=True)
        self.maybe_resume()
        self.started = time.monotonic()
        with tqdm(total=self.total_steps, initial=self.step, desc="train drafter", unit="seq") as bar:
            while self.step < self.total_steps:
                if self.config.max_minutes and self.elapsed_s() > 60 * self.config.max_minutes:
                    break
                self.advance()
                bar.update(1)
                recent = self.history[-50:]
                if recent:
                    bar.set_postfix(
                        loss=f"{sum(r['loss'] for r in recent) / len(recent):.3f}",
                        tau=f"{sum(r['tau'] for r in recent) / len(recent):.2f}",
                    )
                if self.step % self.config.checkpoint_every == 0:
                    self.save_checkpoint()
        self.save_checkpoint()
        return self.validate()

    @torch.no_grad()
    def validate(self, anchors: int = 32, walk_tokens: int = 128) -> dict:
        """Greedy acceptance on held-out sequences, drafting as at inference (from the draft
        vocabulary when the run has one, else from the full vocabulary).

        `val_tau` averages blocks at random response positions. Decoding does not visit positions
        uniformly: it takes many short steps where the drafter is weak and few long ones where it is
        strong, so it sees a lower mean. `val_tau_decode` walks each response as greedy decoding
        would (the corpus responses are the target's own greedy output): the first block at the
        first response token, each next block at the token after the last one accepted; it is the
        number to compare with `bench`'s acceptance length, and like `bench`'s default it covers
        the first `walk_tokens` tokens of each response (a fp32 block at every position is costly).
        A run that trains smaller block sizes too also gets `val_tau_by_size` (random blocks only).
        """
        tau, tokens, steps = self.held_out_acceptance(self.val, anchors, walk_tokens)
        summary = {"steps": self.step, "train_minutes": round(self.elapsed_s() / 60, 1), "val_sequences": len(self.val),
                   "val_blocks": int(tau.numel()), "val_tau": float(tau.mean()),
                   "val_tau_decode": tokens / max(1, steps)}
        if self.config.block_sizes:
            summary["val_tau_by_size"] = {
                size: summary["val_tau"] if size == self.config.block_size
                else float(self.held_out_acceptance(self.val, anchors, walk=False, size=size)[0].mean())
                for size in self.config.trained_sizes
            }
        return summary

    @torch.no_grad()
    def held_out_acceptance(
        self, sequences: list[dict], anchors: int = 32, walk_tokens: int = 128, walk: bool = True,
        size: int | None = None,
    ) -> tuple[torch.Tensor, int, int]:
        """Greedy τ of each block at random response positions of `sequences` (the anchor generator
        restarts from the seed, so every call draws the same blocks), and the (tokens, steps) of
        walking the first `walk_tokens` of each response as decoding does ((0, 0) without `walk`),
        with verify blocks of `size` slots (default: the drafter's block size)."""
        size = size or self.config.block_size
        self.drafter.eval()
        generator = torch.Generator().manual_seed(self.config.seed + 1)
        taus = []
        for begin in range(0, len(sequences), self.config.batch):
            batch = self._sampled_batch(sequences[begin : begin + self.config.batch], anchors, generator, (size,))
            if batch is None:
                continue
            taus.append(self._acceptance(batch))
        tokens = steps = 0
        if walk:
            walks = [decode_walk(self._acceptance_everywhere(seq, anchors, walk_tokens, size)) for seq in sequences]
            tokens, steps = (sum(column) for column in zip(*walks, strict=True))
        self.drafter.train()
        return torch.cat(taus), tokens, steps

    def _acceptance(self, batch) -> torch.Tensor:
        labels = batch.labels.to(self.device)
        logits = block_logits(self.drafter, self.embed, self.draft_head, batch)
        if self.draft_remap is not None:  # logits index the draft vocabulary: so must the labels
            labels = torch.where(labels == IGNORE, IGNORE, self.draft_remap[labels.clamp(min=0)])
        tau = greedy_acceptance(logits, labels)
        return tau[batch.real_blocks.to(self.device)].float().cpu()

    def _acceptance_everywhere(
        self, seq: dict, chunk: int, limit: int | None = None, size: int | None = None
    ) -> torch.Tensor:
        """Greedy acceptance length of a block of `size` slots (default: the drafter's block size)
        at each of the first `limit` response anchors (all by default), `chunk` blocks per pass."""
        every = torch.arange(seq["prompt_len"], seq["tokens"].shape[0] - 1)[:limit]
        parts = []
        for begin in range(0, every.shape[0], chunk):
            anchors = every[begin : begin + chunk]
            lengths = self._block_lengths([anchors], None if size is None else (size,), None)
            parts.append(self._acceptance(self._batch([(seq, anchors)], lengths)))
        return torch.cat(parts) if parts else torch.empty(0)

    def export(self, summary: dict) -> Path:
        """Write the final drafter (bf16, z-lab layout) next to a training summary."""
        final = self.out / "drafter"
        tmp = self.out / "drafter.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        source = f"the (at most) {self.config.draft_vocab} most frequent response tokens of the training split ({len(self.train)} sequences)"
        save_drafter(self.drafter.cpu(), tmp, vocab_source=source)
        (tmp / "training.json").write_text(json.dumps({"config": asdict(self.config), "taps": self.taps, **summary}, indent=2))
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)
        self.drafter.to(self.device)
        return final

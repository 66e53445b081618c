"""The trainer end to end on a tiny corpus: learns, resumes, and writes a loadable drafter."""

import json
import time

import pytest
import torch

from dflash_trt.errors import DFlashError
from dflash_trt.models.checkpoints import load_drafter, load_target
from dflash_trt.models.pairing import validate_pair
from dflash_trt.runtime.torch_backend import TorchDraftSession, TorchTargetSession
from dflash_trt.spec.loop import speculative_decode
from dflash_trt.spec.sampling import Sampler, SamplingParams
from dflash_trt.train.data import generate_batch, read_shard, tapped_features, write_shard
from dflash_trt.train.objective import IGNORE
from dflash_trt.train.trainer import TrainConfig, Trainer

TAPS = (1, 2)


def write_corpus(target, root, taps):
    """Two shards of greedy responses; `taps=()` writes tokens only (features recomputed online)."""
    gen = torch.Generator().manual_seed(0)
    for shard in range(2):
        # prompts of different lengths, so batches are really padded
        prompts = [torch.randint(0, 256, (5 + i % 3,), generator=gen).tolist() for i in range(6)]
        results = generate_batch(target.model, prompts, max_new_tokens=20, stop_ids={7}, taps=taps)
        write_shard(root / f"shard-{shard:05d}.safetensors", prompts, results)
    (root / "corpus.json").write_text(json.dumps({"taps": list(TAPS)}))


@pytest.fixture(scope="module")
def corpus(tiny_pairs, tmp_path_factory):
    target, _ = load_target(str(tiny_pairs["llama"][0]))
    root = tmp_path_factory.mktemp("corpus")
    write_corpus(target, root, TAPS)
    return target, root


@pytest.fixture(scope="module")
def tokens_only(corpus, tmp_path_factory):
    target, _ = corpus
    root = tmp_path_factory.mktemp("tokens-only")
    write_corpus(target, root, ())
    return target, root


def test_shards_round_trip(corpus):
    _, root = corpus
    sequences = read_shard(root / "shard-00000.safetensors")
    assert len(sequences) == 6
    for i, seq in enumerate(sequences):
        assert seq["prompt_len"] == 5 + i % 3 and seq["tokens"].shape[0] <= seq["prompt_len"] + 20
        assert seq["features"].shape == (seq["tokens"].shape[0] - 1, 2 * 64)


def test_online_features_equal_the_features_captured_while_generating(corpus, tokens_only):
    """A tokens-only corpus holds the same sequences; one padded forward over several of them gives
    the features the incremental decode captured (stored in bf16, hence the tolerance)."""
    target, root = corpus
    _, bare = tokens_only
    stored = read_shard(root / "shard-00001.safetensors")
    plain = read_shard(bare / "shard-00001.safetensors")
    assert all(seq["features"] is None for seq in plain)
    assert [s["tokens"].tolist() for s in stored] == [s["tokens"].tolist() for s in plain]
    assert len({s["tokens"].shape[0] for s in plain}) > 1  # the batch below is really padded
    online = tapped_features(target.model, [s["tokens"] for s in plain], TAPS)
    for seq, feats in zip(stored, online, strict=True):
        torch.testing.assert_close(feats, seq["features"].float(), rtol=1e-2, atol=2e-2)


def test_a_tokens_only_corpus_trains_with_online_features(tokens_only, tmp_path):
    target, root = tokens_only
    trainer = Trainer(target, root, tmp_path, config(batch=2, epochs=6), device="cpu")
    assert trainer.online_features
    summary = trainer.fit()
    losses = [r["loss"] for r in trainer.history]
    assert sum(losses[-5:]) / 5 < sum(losses[:5]) / 5
    assert summary["val_blocks"] > 0 and 1 <= summary["val_tau"] <= 4


def test_a_corpus_mixing_stored_and_missing_features_is_refused(corpus, tokens_only, tmp_path):
    target, root = corpus
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    (mixed / "corpus.json").write_text((root / "corpus.json").read_text())
    (mixed / "shard-00000.safetensors").write_bytes((root / "shard-00000.safetensors").read_bytes())
    (mixed / "shard-00001.safetensors").write_bytes((tokens_only[1] / "shard-00001.safetensors").read_bytes())
    with pytest.raises(DFlashError, match="some shards store target features"):
        Trainer(target, mixed, tmp_path / "run", config(), device="cpu")


def config(**change):
    base = dict(layers=1, block_size=4, mask_token_id=259, anchors=8, epochs=3, lr=3e-3, warmup=0.1, val_share=0.1)
    return TrainConfig(**{**base, **change})


@pytest.mark.parametrize(("batch", "bf16"), [(1, False), (3, False), (1, True)])
def test_training_lowers_the_loss_and_exports_a_loadable_drafter(corpus, tmp_path, batch, bf16):
    target, root = corpus
    trainer = Trainer(target, root, tmp_path, config(batch=batch, bf16=bf16, epochs=3 * batch), device="cpu")
    summary = trainer.fit()
    losses = [r["loss"] for r in trainer.history]
    assert sum(losses[-5:]) / 5 < sum(losses[:5]) / 5
    assert summary["val_blocks"] > 0 and 1 <= summary["val_tau"] <= 4
    assert 1 <= summary["val_tau_decode"] <= 4
    assert summary["steps"] == trainer.total_steps == len(trainer.history) and summary["train_minutes"] >= 0
    path = trainer.export(summary)
    assert json.loads((path / "training.json").read_text())["steps"] == summary["steps"]
    drafter = load_drafter(path)
    validate_pair(target, drafter.config)
    assert drafter.config.target_layer_ids == TAPS and drafter.config.block_size == 4
    assert next(drafter.parameters()).dtype == torch.float32  # loaded for compute; stored bf16
    assert not (tmp_path / "drafter.tmp").exists()
    # the draft vocabulary: every token its training responses hold (fewer than the default 16384)
    seen = {t for seq in trainer.train for t in seq["tokens"][seq["prompt_len"] :].tolist()}
    assert drafter.draft_vocab.tolist() == sorted(seen) and len(seen) < target.vocab_size


def test_a_draft_vocabulary_keeps_the_most_frequent_response_tokens_or_none(corpus, tmp_path):
    target, root = corpus
    trainer = Trainer(target, root, tmp_path / "five", config(epochs=0.1, draft_vocab=5), device="cpu")
    counts = torch.zeros(target.vocab_size, dtype=torch.long)
    for seq in trainer.train:
        counts += torch.bincount(seq["tokens"][seq["prompt_len"] :], minlength=target.vocab_size)
    drafter = load_drafter(trainer.export(trainer.fit()))
    assert len(drafter.draft_vocab) == 5 and counts[drafter.draft_vocab].min() >= counts.topk(5).values.min()
    whole = Trainer(target, root, tmp_path / "whole", config(epochs=0.1, draft_vocab=0), device="cpu")
    assert load_drafter(whole.export(whole.fit())).draft_vocab is None


@pytest.mark.parametrize("batch", [1, 2])
def test_training_is_deterministic_and_resumes_exactly(corpus, tmp_path, batch):
    target, root = corpus
    full = Trainer(target, root, tmp_path / "full", config(epochs=2, batch=batch), device="cpu")
    full.fit()
    part = Trainer(target, root, tmp_path / "part", config(epochs=2, batch=batch), device="cpu")
    for _ in range(7 // batch):  # interrupted mid-epoch
        part.advance()
    part.save_checkpoint()
    resumed = Trainer(target, root, tmp_path / "part", config(epochs=2, batch=batch), device="cpu")
    resumed.fit()
    assert resumed.step == full.step
    for name, tensor in full.drafter.state_dict().items():
        torch.testing.assert_close(resumed.drafter.state_dict()[name], tensor, rtol=0, atol=0)
    with pytest.raises(DFlashError, match="other settings"):
        Trainer(target, root, tmp_path / "part", config(epochs=5, batch=batch), device="cpu").maybe_resume()


def _stopped_after(seconds, corpus, out):
    """A one-minute run interrupted after one step, with `seconds` of its time spent."""
    target, root = corpus
    part = Trainer(target, root, out, config(epochs=2, max_minutes=1.0), device="cpu")
    part.advance()
    part.started = time.monotonic() - seconds
    part.save_checkpoint()
    return Trainer(target, root, out, config(epochs=2, max_minutes=1.0), device="cpu")


def test_a_time_limit_spans_resumes(corpus, tmp_path):
    """A run stopped after 30 of its 60 s resumes half-way down its LR schedule and keeps only the
    remaining time: restarting the clock would warm-restart the cosine and overrun the limit."""
    resumed = _stopped_after(30.0, corpus, tmp_path / "half")
    resumed.maybe_resume()
    resumed.started = time.monotonic()
    step, total, _ = resumed.schedule_position()
    assert 0.45 * total <= step <= 0.55 * total
    spent = _stopped_after(61.0, corpus, tmp_path / "spent")
    spent.fit()
    assert spent.step == 1  # no time left: validated and stopped without another step


def _copy_corpus(root, dest, shards):
    dest.mkdir(exist_ok=True)
    (dest / "corpus.json").write_text((root / "corpus.json").read_text())
    for shard in shards:
        name = f"shard-{shard:05d}.safetensors"
        (dest / name).write_bytes((root / name).read_bytes())


def test_the_validation_split_holds_as_the_corpus_grows(corpus, tmp_path):
    """A sequence keeps its side once a trainer has seen it: a run that starts from a drafter
    trained on the smaller corpus never validates on what that drafter trained on."""
    target, root = corpus
    grown = tmp_path / "grown"
    _copy_corpus(root, grown, [0])
    small = Trainer(target, grown, tmp_path / "a", config(val_share=0.3), device="cpu")
    _copy_corpus(root, grown, [1])
    large = Trainer(target, grown, tmp_path / "b", config(val_share=0.3), device="cpu")
    val, train = {s["key"] for s in large.val}, {s["key"] for s in large.train}
    assert {s["key"] for s in small.val} <= val and not val & {s["key"] for s in small.train}
    assert not val & train and len(val | train) == 12
    assert any(key.startswith("shard-00001") for key in val)  # new shards give their share too
    with pytest.raises(DFlashError, match="split with val_share 0.3, not 0.1"):
        Trainer(target, grown, tmp_path / "c", config(val_share=0.1), device="cpu")


def test_training_can_start_from_a_trained_drafter(corpus, tmp_path):
    target, root = corpus
    first = Trainer(target, root, tmp_path / "a", config(epochs=1), device="cpu")
    path = first.export(first.fit())
    warm = Trainer(target, root, tmp_path / "b", config(init_drafter=str(path)), device="cpu")
    cold = Trainer(target, root, tmp_path / "c", config(), device="cpu")
    trained = load_drafter(path).state_dict()
    for name, tensor in warm.drafter.state_dict().items():
        torch.testing.assert_close(tensor, trained[name], rtol=0, atol=0)
    assert any(not torch.equal(t, trained[n]) for n, t in cold.drafter.state_dict().items())
    with pytest.raises(DFlashError, match="its num_layers is 1, this run trains 2"):
        Trainer(target, root, tmp_path / "d", config(layers=2, init_drafter=str(path)), device="cpu")


@pytest.mark.parametrize("block", [4, 3])
def test_validation_acceptance_is_what_decoding_gets(tokens_only, tmp_path, block):
    """The acceptance the trainer computes for a block at a response position equals what the
    real speculative loop gets when it anchors a block there, so `val_tau_decode` (which walks
    those positions as decoding does) is the acceptance length decoding will see; also for a
    verify block smaller than the drafter's."""
    target, root = tokens_only
    trainer = Trainer(target, root, tmp_path, config(batch=2, epochs=6, block_sizes=(4, 3)), device="cpu")
    trainer.fit()
    drafter = trainer.drafter.eval()
    compared = longer = 0
    for seq in trainer.val + trainer.train:
        tokens, start = seq["tokens"], seq["prompt_len"]
        with torch.no_grad():
            everywhere = trainer._acceptance_everywhere(seq, 8, size=block)
        steps = speculative_decode(
            TorchTargetSession(target, TAPS), TorchDraftSession(drafter, target), tokens[:start].tolist(), block,
            Sampler(SamplingParams(temperature=0)),
        )
        anchor = start + len(next(steps).tokens) - 1  # the prefill's token anchors the first block
        while anchor + block < tokens.shape[0]:  # the corpus holds every label and the bonus token
            step = next(steps)
            assert step.tokens == tokens[anchor + 1 : anchor + 1 + len(step.tokens)].tolist()  # greedy corpus
            assert everywhere[anchor - start] == step.accepted + 1
            compared, longer = compared + 1, longer + (step.accepted > 0)
            anchor += step.accepted + 1
    assert compared >= 20 and longer >= 3  # the drafter's blocks do get accepted, some of them


def test_gamma_sets_the_position_weights_and_a_checkpoint_keeps_it(corpus, tmp_path):
    target, root = corpus
    focused = Trainer(target, root, tmp_path / "run", config(gamma=3.0), device="cpu")
    torch.testing.assert_close(focused.weights, torch.tensor([1.0, 0.7165313, 0.5134171]))
    focused.advance()
    focused.save_checkpoint()
    with pytest.raises(DFlashError, match="other settings"):
        Trainer(target, root, tmp_path / "run", config(gamma=2.0), device="cpu").maybe_resume()
    # unset, it is left out: checkpoints written before the setting existed still resume
    assert "gamma" not in Trainer(target, root, tmp_path / "other", config(), device="cpu").identity()


def test_mixed_block_sizes_train_each_size_and_a_checkpoint_keeps_them(corpus, tmp_path):
    target, root = corpus
    mixed = Trainer(target, root, tmp_path / "mixed", config(block_sizes=(4, 2), epochs=2), device="cpu")
    batch = mixed._sampled_batch(mixed.train[:3], 8, torch.Generator().manual_seed(0), mixed.config.trained_sizes)
    real = batch.labels[batch.real_blocks]
    short = (real[:, 1:] == IGNORE).all(dim=1)  # a 2-slot block has its one label at slot 1 only
    assert 0 < short.sum() < real.shape[0]
    # one size: no draw, so each size measures blocks at the same anchors, batch after batch
    def one_by_one(size):
        generator = torch.Generator().manual_seed(0)
        return [mixed._sampled_batch([seq], 8, generator, (size,)) for seq in mixed.train[:3]]

    for two, four in zip(one_by_one(2), one_by_one(4), strict=True):
        assert torch.equal(two.positions, four.positions) and torch.equal(two.ids, four.ids)
        assert (two.labels[:, 1:] == IGNORE).all() and (four.labels[:, 1:] != IGNORE).any()
    summary = mixed.fit()
    by_size = summary["val_tau_by_size"]
    assert set(by_size) == {4, 2} and by_size[4] == summary["val_tau"] and 1 <= by_size[2] <= 2
    assert mixed.identity()["block_sizes"] == [4, 2]
    with pytest.raises(DFlashError, match="other settings"):
        Trainer(target, root, tmp_path / "mixed", config(block_sizes=(4, 3), epochs=2), device="cpu").maybe_resume()
    plain = Trainer(target, root, tmp_path / "plain", config(), device="cpu")
    assert "block_sizes" not in plain.identity() and plain.config.trained_sizes == (4,)
    with pytest.raises(DFlashError, match=r"block sizes \[8\]"):
        TrainConfig(block_size=4, block_sizes=(4, 8))


@pytest.mark.parametrize("gamma", [0.0, -1.0])
def test_a_gamma_that_is_not_positive_is_refused_not_replaced_by_the_default(gamma):
    with pytest.raises(DFlashError, match="gamma must be positive"):
        TrainConfig(gamma=gamma)


def test_distillation_trains_on_the_targets_distributions_and_a_checkpoint_keeps_it(corpus, tmp_path):
    target, root = corpus
    soft = Trainer(target, root, tmp_path / "soft", config(distill=0.5, epochs=3), device="cpu")
    hard = Trainer(target, root, tmp_path / "hard", config(epochs=3), device="cpu")
    soft.advance(), hard.advance()
    # same seed, same blocks, same start: only the loss differs
    assert soft.history[0]["tau"] == hard.history[0]["tau"] and soft.history[0]["loss"] != hard.history[0]["loss"]
    summary = soft.fit()
    losses = [r["loss"] for r in soft.history]
    assert sum(losses[-5:]) / 5 < sum(losses[:5]) / 5
    assert 1 <= summary["val_tau"] <= 4
    assert soft.identity()["distill"] == 0.5 and "distill" not in hard.identity()
    with pytest.raises(DFlashError, match="other settings"):
        Trainer(target, root, tmp_path / "soft", config(distill=0.2, epochs=3), device="cpu").maybe_resume()


@pytest.mark.parametrize("share", [-0.1, 1.5])
def test_a_distill_share_outside_zero_to_one_is_refused(share):
    with pytest.raises(DFlashError, match="distill is a share of the loss"):
        TrainConfig(distill=share)


def test_the_validation_script_reports_the_trainers_validation_and_zeroes_taps(corpus, tmp_path, capsys, monkeypatch):
    """scripts/validate_drafter.py samples the same held-out blocks as `Trainer.validate` and walks
    the same responses, so with no tap zeroed its figures are the trainer's; zeroing every tap
    leaves the drafter only its block tokens. The script drafts from the drafter's own list, not
    from the one a run on this corpus would choose: here that list keeps every other id of the run's."""
    import runpy
    from pathlib import Path

    from dflash_trt.models.draft_vocab import write_draft_vocab

    target, root = corpus
    trainer = Trainer(target, root, tmp_path / "run", config(epochs=4), device="cpu")
    path = trainer.export(trainer.fit())
    full = trainer.validate(walk_tokens=128)
    kept = trainer.drafter.draft_vocab[::2]  # every other id the run chose
    write_draft_vocab(path, kept, "test")
    trainer.use_draft_vocab(kept)
    expected = trainer.validate(walk_tokens=128)
    assert expected["val_tau"] < full["val_tau"]  # the list matters here
    script = Path(__file__).resolve().parents[2] / "scripts" / "validate_drafter.py"
    target_dir = str(target.model.config._name_or_path)
    argv = ["validate_drafter.py", "--corpus", str(root), "--target", target_dir, "--draft", str(path), "--walk",
            "--zero-taps", "", "--zero-taps", "1,2"]
    monkeypatch.setattr("sys.argv", argv)
    runpy.run_path(str(script), run_name="__main__")
    plain, blind = (json.loads(line) for line in capsys.readouterr().out.splitlines())
    assert plain["zeroed_taps"] == [] and blind["zeroed_taps"] == [1, 2]
    assert plain["sequences"] == len(trainer.val)
    assert plain["tau_block"] == round(expected["val_tau"], 3)
    assert plain["tau_decode"] == round(expected["val_tau_decode"], 3)
    assert blind != plain

    monkeypatch.setattr("sys.argv", [*argv[:7], "--zero-taps", "5"])
    with pytest.raises(SystemExit):
        runpy.run_path(str(script), run_name="__main__")
    assert "--zero-taps [5]: the drafter taps [1, 2]" in capsys.readouterr().err

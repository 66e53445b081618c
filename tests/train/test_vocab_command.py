"""`dflash-trt draft-vocab`: counts the corpora's training responses, writes the list, reports coverage."""

import json
import shutil

import torch
from click.testing import CliRunner

from dflash_trt.cli import main
from dflash_trt.models.checkpoints import load_drafter
from dflash_trt.models.draft_vocab import DRAFT_VOCAB_FILE
from dflash_trt.train.data import write_shard


def corpus(root, responses, held=()):
    """One shard: prompt [1, 2] then each response; `held` rows are listed as held out."""
    root.mkdir()
    write_shard(root / "shard-00000.safetensors", [[1, 2]] * len(responses), [(r, None) for r in responses])
    (root / "split.json").write_text(json.dumps({"val_share": 0.05, "shards": ["shard-00000"],
                                                 "validation": [f"shard-00000:{i}" for i in held]}))
    return root


def test_draft_vocab_keeps_the_most_frequent_training_response_tokens(tiny_pairs, tmp_path):
    draft = shutil.copytree(tiny_pairs["qwen3"][1], tmp_path / "draft")
    first = corpus(tmp_path / "a", [[5, 5, 6, 9], [9, 9, 9, 200]], held=(1,))  # row 1 is held out: not counted
    second = corpus(tmp_path / "b", [[6, 5, 40], [250, 250, 250, 250]], held=(1,))
    run = CliRunner().invoke(main, ["draft-vocab", str(draft), "--corpus", str(first), "--corpus", str(second),
                                    "--size", "2"])
    assert run.exit_code == 0, run.output
    assert load_drafter(draft).draft_vocab.tolist() == [5, 6]  # counts 3, 2; then 9 and 40 once
    assert "cover 71.43% of the 7 training response tokens and 0.00% of the held-out ones" in run.output
    assert torch.equal(load_drafter(draft).state_dict()["fc.weight"], load_drafter(tiny_pairs["qwen3"][1]).state_dict()["fc.weight"])
    run = CliRunner().invoke(main, ["draft-vocab", str(draft), "--corpus", str(first), "--size", "0"])
    assert run.exit_code == 0 and not (draft / DRAFT_VOCAB_FILE).exists()


def test_draft_vocab_refuses_a_folder_that_is_not_a_drafter_before_reading_corpora(tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "c").mkdir()  # no shards: never reached
    run = CliRunner().invoke(main, ["draft-vocab", str(tmp_path / "empty"), "--corpus", str(tmp_path / "c")])
    assert run.exit_code != 0 and "no config.json" in run.output
    assert len(run.output.strip().splitlines()) == 1

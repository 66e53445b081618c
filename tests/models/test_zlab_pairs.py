"""The z-lab drafters' published configs (tests/data/zlab, no weights) against their targets' configs:
each pair is accepted from config.json alone, and a pair that does not match is refused in one line
naming the field."""

import json
import shutil
from pathlib import Path

import pytest

from dflash_trt.errors import DFlashError
from dflash_trt.models.checkpoints import check_pair_configs, read_draft_config

ZLAB = Path(__file__).resolve().parent.parent / "data" / "zlab"
PAIRS = {"Qwen3-4B": "Qwen3-4B-DFlash-b16", "Qwen3-8B": "Qwen3-8B-DFlash-b16",
         "Qwen3.5-27B": "Qwen3.5-27B-DFlash", "Qwen3.5-35B-A3B": "Qwen3.5-35B-A3B-DFlash"}


def target(name):
    return str(ZLAB / "targets" / name)


def drafter(name):
    return ZLAB / "drafters" / name


@pytest.mark.parametrize("target_name", list(PAIRS))
def test_each_published_pair_is_accepted_from_its_configs(target_name):
    config, draft = check_pair_configs(target(target_name), drafter(PAIRS[target_name]))
    assert draft.hidden_size == config.hidden_size and draft.block_size == 16
    assert max(draft.target_layer_ids) < config.num_hidden_layers and draft.mask_token_id < config.vocab_size


def test_the_fields_the_drafters_publish_are_read_as_published():
    """Top-level block_size (b16, 27B) and the newer nested one (35B-A3B); sliding layers."""
    small = read_draft_config(drafter("Qwen3-4B-DFlash-b16"))
    assert (small.num_layers, small.target_layer_ids, small.mask_token_id, small.num_target_layers) == (
        5, (1, 9, 17, 25, 33), 151669, 36)
    moe = read_draft_config(drafter("Qwen3.5-35B-A3B-DFlash"))
    assert (moe.num_layers, moe.block_size, moe.mask_token_id, moe.vocab_size) == (6, 16, 248077, 248320)
    assert [moe.layer_window(i) for i in range(6)] == [4096] * 5 + [None]
    dense = read_draft_config(drafter("Qwen3.5-27B-DFlash"))
    assert (dense.block_size, dense.num_target_layers, dense.layer_window(0), dense.layer_window(4)) == (
        16, 64, 2048, None)


def test_the_qwen3_5_targets_are_read_as_their_text_models():
    config, _ = check_pair_configs(target("Qwen3.5-35B-A3B"), drafter("Qwen3.5-35B-A3B-DFlash"))
    assert config.model_type == "qwen3_5_moe_text" and config.layer_types.count("full_attention") == 10
    config, _ = check_pair_configs(target("Qwen3.5-27B"), drafter("Qwen3.5-27B-DFlash"))
    assert config.model_type == "qwen3_5_text"


@pytest.mark.parametrize("target_name", list(PAIRS))
def test_every_other_drafter_is_refused_naming_the_field(target_name):
    for other in PAIRS.values():
        if other == PAIRS[target_name]:
            continue
        with pytest.raises(DFlashError, match="drafter hidden_size=.* but the target's is") as err:
            check_pair_configs(target(target_name), drafter(other))
        assert "\n" not in str(err.value)


def edited_target(tmp_path, name, **text):
    """A copy of a fixture target with fields of its text model changed."""
    raw = json.loads((ZLAB / "targets" / name / "config.json").read_text())
    (raw.get("text_config") or raw).update(text)
    out = tmp_path / name
    shutil.copytree(ZLAB / "targets" / name, out)
    (out / "config.json").write_text(json.dumps(raw))
    return str(out)


@pytest.mark.parametrize("target_name, change, message", [
    ("Qwen3.5-35B-A3B", {"num_hidden_layers": 36}, "target_layer_ids .*: layer 37 is outside the target's layers 0..35"),
    ("Qwen3.5-27B", {"num_hidden_layers": 60}, "drafter num_target_layers=64 but the target has 60 layers"),
    ("Qwen3.5-35B-A3B", {"vocab_size": 151936}, "drafter mask_token_id=248077 is outside the target vocabulary"),
    ("Qwen3-8B", {"vocab_size": 152064}, "drafter vocab_size=151936 but the target's is 152064"),
    ("Qwen3-4B", {"hidden_size": 4096}, "drafter hidden_size=2560 but the target's is 4096"),
])
def test_a_target_that_differs_in_one_field_is_refused_naming_it(tmp_path, target_name, change, message):
    with pytest.raises(DFlashError, match=message) as err:
        check_pair_configs(edited_target(tmp_path, target_name, **change), drafter(PAIRS[target_name]))
    assert "\n" not in str(err.value)

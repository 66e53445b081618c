import json

import pytest
from factories import draft_config_dict

from dflash_trt.errors import DFlashError
from dflash_trt.models.draft_config import DraftConfig, default_target_layer_ids


def test_top_level_and_nested_fields_parse_the_same():
    nested = DraftConfig.from_dict(draft_config_dict(nested=True, block_size=8))
    flat = DraftConfig.from_dict(draft_config_dict(nested=False, block_size=8))
    assert (nested.block_size, nested.target_layer_ids, nested.mask_token_id) == (8, (1, 2), 259)
    assert (flat.block_size, flat.target_layer_ids, flat.mask_token_id) == (8, (1, 2), 259)


def test_default_layer_ids_follow_the_reference_rule():
    from dflash.model import build_target_layer_ids

    for n_target, n_taps in [(36, 5), (12, 3), (30, 5), (8, 1), (64, 5)]:
        assert default_target_layer_ids(n_target, n_taps) == build_target_layer_ids(n_target, n_taps)
    raw = draft_config_dict(target_layer_ids=None, layers=5)
    raw["dflash_config"]["num_target_layers"] = 36
    assert DraftConfig.from_dict(raw).target_layer_ids == (1, 9, 17, 25, 33)


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda r: r["dflash_config"].pop("mask_token_id"), "mask_token_id"),
        (lambda r: r["dflash_config"].update(block_size=1), "block_size"),
        (lambda r: r.pop("hidden_size"), "hidden_size"),
        (lambda r: r["dflash_config"].pop("target_layer_ids"), "target_layer_ids or num_target_layers"),
    ],
)
def test_bad_configs_get_one_line_errors(change, message):
    raw = draft_config_dict()
    change(raw)
    with pytest.raises(DFlashError, match=message) as err:
        DraftConfig.from_dict(raw)
    assert "\n" not in str(err.value)


def test_round_trip_through_to_dict(tmp_path):
    config = DraftConfig.from_dict(draft_config_dict(block_size=16))
    (tmp_path / "config.json").write_text(json.dumps(config.to_dict()))
    again = DraftConfig.from_dir(tmp_path)
    assert again.block_size == 16 and again.target_layer_ids == config.target_layer_ids
    assert again.arch.hidden_size == config.arch.hidden_size

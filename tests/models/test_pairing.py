"""A drafter for the wrong target, or a broken drafter directory: one clear line, before any work."""

import json

import pytest
import torch
from factories import byte_tokenizer, make_drafter
from safetensors.torch import load_file, save_file

from dflash_trt.errors import DFlashError
from dflash_trt.models.checkpoints import load_drafter, load_target
from dflash_trt.models.draft_config import DraftConfig
from dflash_trt.models.pairing import validate_pair


@pytest.fixture(scope="module")
def qwen3_target(tiny_pairs):
    return load_target(str(tiny_pairs["qwen3"][0]))


def config(**change):
    from factories import draft_config_dict

    return DraftConfig.from_dict(draft_config_dict(**change))


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(hidden_size=32, head_dim=8), "hidden_size=32 but the target's is 64"),
        (dict(target_layer_ids=[1, 4]), "layer 4 is outside the target's layers 0..3"),
        (dict(target_layer_ids=[-1]), "layer -1 is outside"),
        (dict(mask_token_id=264), "mask_token_id=264 is outside the target vocabulary"),
        (dict(vocab_size=1000), "vocab_size=1000 but the target's is 264"),
        (dict(num_target_layers=36), "num_target_layers=36 but the target has 4 layers"),
    ],
)
def test_mismatched_pairs_are_refused(qwen3_target, change, message):
    target, tokenizer = qwen3_target
    with pytest.raises(DFlashError, match=message) as err:
        validate_pair(target, config(**change), tokenizer)
    assert "\n" not in str(err.value)


def test_matching_pair_passes(qwen3_target):
    target, tokenizer = qwen3_target
    validate_pair(target, config(), tokenizer, byte_tokenizer())


def test_different_tokenizer_is_refused(qwen3_target):
    target, tokenizer = qwen3_target
    other = byte_tokenizer()
    other.add_tokens(["<extra>"])
    with pytest.raises(DFlashError, match="tokenizer differs"):
        validate_pair(target, config(), tokenizer, other)


def test_drafter_directory_errors(tmp_path):
    with pytest.raises(DFlashError, match="not a directory"):
        load_drafter(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(DFlashError, match="no config.json"):
        load_drafter(tmp_path / "empty")

    path = make_drafter(tmp_path / "d")
    state = load_file(path / "model.safetensors")

    (path / "model.safetensors").rename(path / "model.bin")
    with pytest.raises(DFlashError, match="pickled"):
        load_drafter(path)
    (path / "model.bin").unlink()
    with pytest.raises(DFlashError, match="no \\*.safetensors"):
        load_drafter(path)

    save_file({k: v for k, v in state.items() if k != "fc.weight"}, str(path / "model.safetensors"))
    with pytest.raises(DFlashError, match="missing fc.weight"):
        load_drafter(path)
    save_file({**state, "lm_head.weight": torch.zeros(2, 2)}, str(path / "model.safetensors"))
    with pytest.raises(DFlashError, match="unexpected lm_head.weight"):
        load_drafter(path)
    save_file({**state, "fc.weight": torch.zeros(64, 64)}, str(path / "model.safetensors"))
    with pytest.raises(DFlashError, match="fc.weight has shape"):
        load_drafter(path)

    (path / "config.json").write_text("{not json")
    with pytest.raises(DFlashError, match="not valid JSON"):
        load_drafter(path)


def test_block_size_below_two_in_checkpoint(tmp_path):
    path = make_drafter(tmp_path / "d")
    raw = json.loads((path / "config.json").read_text())
    raw["dflash_config"]["block_size"] = 1
    (path / "config.json").write_text(json.dumps(raw))
    with pytest.raises(DFlashError, match="block_size is 1"):
        load_drafter(path)


@pytest.fixture
def no_weight_loading(monkeypatch):
    """Make any weight load fail loudly, to prove a check ran before it."""
    from dflash_trt.models import checkpoints

    def forbidden(*args, **kwargs):
        raise AssertionError("weights were loaded before the pairing check")

    monkeypatch.setattr(checkpoints.AutoModelForCausalLM, "from_pretrained", forbidden)
    monkeypatch.setattr(checkpoints, "load_file", forbidden)


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(hidden_size=32, head_dim=8), "hidden_size=32 but the target's is 64"),
        (dict(target_layer_ids=[1, 9]), "layer 9 is outside"),
        (dict(mask_token_id=300), "mask_token_id=300 is outside"),
    ],
)
def test_llm_and_cli_refuse_a_wrong_pair_before_loading_weights(tiny_pairs, tmp_path, no_weight_loading, change, message):
    from click.testing import CliRunner

    from dflash_trt import LLM
    from dflash_trt.cli import main

    target_dir = str(tiny_pairs["qwen3"][0])
    draft = make_drafter(tmp_path / "wrong", **change)
    with pytest.raises(DFlashError, match=message):
        LLM(target=target_dir, draft=str(draft), backend="torch")
    for command in (["generate", "--target", target_dir, "--draft", str(draft), "hi"],
                    ["export", "--target", target_dir, "--draft", str(draft), "-o", str(tmp_path / "out")],
                    ["build", "--target", target_dir, "--draft", str(draft), "-o", str(tmp_path / "out"),
                     "--engine", "onnxruntime"]):
        result = CliRunner().invoke(main, command)
        assert result.exit_code != 0 and message.split(" ")[0] in result.output
        assert "Traceback" not in result.output and len(result.output.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_a_broken_tokenizer_is_an_error_not_a_missing_one(tiny_pairs, tmp_path):
    from dflash_trt.models.checkpoints import load_tokenizer

    draft = make_drafter(tmp_path / "d")
    assert load_tokenizer(str(draft)) is None  # no tokenizer files: fine, nothing to compare
    (draft / "tokenizer.json").write_text("{broken")
    with pytest.raises(DFlashError, match="tokenizer files are present but do not load"):
        load_tokenizer(str(draft))


def test_a_drafter_hub_id_is_fetched_once_with_safe_patterns(tiny_pairs, tmp_path, monkeypatch):
    import huggingface_hub

    from dflash_trt import LLM

    local = make_drafter(tmp_path / "snapshot", block_size=4, target_layer_ids=[1, 2])
    calls = []

    def fake_download(repo_id, allow_patterns):
        calls.append((repo_id, allow_patterns))
        return str(local)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_download)
    llm = LLM(target=str(tiny_pairs["qwen3"][0]), draft="z-lab/tiny-dflash", backend="torch")
    assert llm.drafter is not None and llm.block_size == 4
    assert len(calls) == 1 and calls[0][0] == "z-lab/tiny-dflash"
    assert not any(p.endswith((".bin", ".pt", ".py")) for p in calls[0][1])  # never pickles or code

    def offline(repo_id, allow_patterns):
        raise OSError("We couldn't connect to 'https://huggingface.co'.\nmore detail")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", offline)
    with pytest.raises(DFlashError, match="not fetched from the hub .We couldn't connect") as err:
        LLM(target=str(tiny_pairs["qwen3"][0]), draft="z-lab/missing", backend="torch")
    assert "\n" not in str(err.value)

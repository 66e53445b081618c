"""Qwen3.5 as published (vision-language checkpoints) loads as its text model: same logits as the VL
model on text, no vision weight read, configs checked from config.json, lossless greedy decoding."""

import json

import pytest
import torch
from factories import make_drafter, make_target, make_vl_target
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from transformers import AutoModelForImageTextToText

from dflash_trt import LLM, SamplingParams
from dflash_trt.errors import DFlashError
from dflash_trt.models.checkpoints import check_pair, check_pair_configs, load_target, read_target_config

TEXT_TYPES = {"qwen3_5": "qwen3_5_text", "qwen3_5_moe": "qwen3_5_moe_text"}
IDS = [17, 3, 250, 99, 4, 4, 61, 120, 7, 33, 200, 5]


@pytest.fixture(scope="module")
def vl_targets(tmp_path_factory):
    root = tmp_path_factory.mktemp("vl")
    return {family: make_vl_target(root / family, family, seed=3) for family in TEXT_TYPES}


@pytest.fixture(scope="module")
def drafter(tmp_path_factory):
    return make_drafter(tmp_path_factory.mktemp("vl") / "draft", seed=1, block_size=4, target_layer_ids=[1, 2])


def vl_model(path):
    return AutoModelForImageTextToText.from_pretrained(path, dtype=torch.float32).eval()


def checkpoint_keys(path):
    with safe_open(str(path / "model.safetensors"), "pt") as f:
        return set(f.keys())


@pytest.mark.parametrize("family", list(TEXT_TYPES))
def test_a_vl_checkpoint_loads_as_its_text_model_with_the_vl_logits(vl_targets, family):
    target, tokenizer = load_target(str(vl_targets[family]))
    assert target.model_type == TEXT_TYPES[family] and target.is_stateful and tokenizer is not None
    assert type(target.model).__name__.endswith("ForCausalLM")
    taps = (0, 1, 3)
    logits, features = target.forward(IDS, target.new_cache(), taps)
    with torch.no_grad():
        ref = vl_model(vl_targets[family])(input_ids=torch.tensor([IDS]), output_hidden_states=True)
    torch.testing.assert_close(logits, ref.logits[0], rtol=0, atol=1e-5)
    expected = torch.cat([ref.hidden_states[k + 1][0] for k in taps], dim=-1)
    torch.testing.assert_close(features, expected, rtol=0, atol=1e-5)


@pytest.mark.parametrize("family", list(TEXT_TYPES))
def test_no_vision_weight_is_read_or_held(vl_targets, family, monkeypatch):
    """Every tensor the loader reads from the file is recorded: only the text model's are."""
    import transformers.modeling_utils as modeling_utils

    read: set[str] = set()
    real_open = modeling_utils.safe_open

    class Slice:
        def __init__(self, inner, key):
            self.inner, self.key = inner, key

        def __getitem__(self, index):  # what materializes a lazily opened tensor
            read.add(self.key)
            return self.inner[index]

        def __getattr__(self, name):
            return getattr(self.inner, name)

    class File:
        def __init__(self, *args, **kwargs):
            self.inner = real_open(*args, **kwargs)

        def get_slice(self, key):
            return Slice(self.inner.get_slice(key), key)

        def get_tensor(self, key):
            read.add(key)
            return self.inner.get_tensor(key)

        def __getattr__(self, name):
            return getattr(self.inner, name)

    monkeypatch.setattr(modeling_utils, "safe_open", File)
    target, _ = load_target(str(vl_targets[family]))
    keys = checkpoint_keys(vl_targets[family])
    vision = {k for k in keys if k.startswith("model.visual.")}
    assert vision and read == keys - vision
    names = [n for n, _ in [*target.model.named_parameters(), *target.model.named_buffers()]]
    assert not any("visual" in n for n in names)
    state = load_file(str(vl_targets[family] / "model.safetensors"))
    held = sum(p.numel() for p in target.model.parameters())
    assert held == sum(state[k].numel() for k in keys - vision)


def test_an_lm_head_tied_on_the_vl_model_only_is_tied(tmp_path):
    """Small Qwen3.5s tie the head by the VL config's flag: no lm_head.weight in the file."""
    path = make_vl_target(tmp_path / "tied", "qwen3_5", seed=4, tie_word_embeddings=True)
    assert json.loads((path / "config.json").read_text())["text_config"]["tie_word_embeddings"] is False
    assert "lm_head.weight" not in checkpoint_keys(path)
    target, _ = load_target(str(path))
    assert target.lm_head.weight.data_ptr() == target.model.get_input_embeddings().weight.data_ptr()
    logits, _ = target.forward(IDS, target.new_cache())
    with torch.no_grad():
        ref = vl_model(path)(input_ids=torch.tensor([IDS])).logits[0]
    torch.testing.assert_close(logits, ref, rtol=0, atol=1e-5)


def test_a_vl_checkpoint_without_its_text_weights_is_refused(vl_targets, tmp_path):
    path = tmp_path / "no-head"
    path.mkdir()
    (path / "config.json").write_text((vl_targets["qwen3_5"] / "config.json").read_text())
    state = load_file(str(vl_targets["qwen3_5"] / "model.safetensors"))
    save_file({k: v for k, v in state.items() if k != "lm_head.weight"}, str(path / "model.safetensors"))
    with pytest.raises(DFlashError, match=r"weights missing from the checkpoint \(lm_head.weight; 1 in all\)") as err:
        load_target(str(path))
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("family", list(TEXT_TYPES))
def test_vl_configs_are_read_and_paired_as_their_text_models(vl_targets, drafter, family):
    _, config = read_target_config(str(vl_targets[family]))
    assert config.model_type == TEXT_TYPES[family] and config.vocab_size == 264 and config.num_hidden_layers == 4
    config, draft = check_pair_configs(str(vl_targets[family]), drafter)
    assert config.model_type == TEXT_TYPES[family] and draft.hidden_size == config.hidden_size
    check_pair(str(vl_targets[family]), drafter)  # with the tokenizers, as LLM does
    wide = make_drafter(drafter.parent / "wide", hidden_size=96, target_layer_ids=[1, 2])
    with pytest.raises(DFlashError, match="drafter hidden_size=96 but the target's is 64"):
        check_pair_configs(str(vl_targets[family]), wide)


def test_other_vision_language_checkpoints_are_refused_in_one_line(tmp_path):
    from transformers import LlamaConfig, LlavaConfig

    text = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4)
    LlavaConfig(text_config=text.to_dict()).save_pretrained(tmp_path)
    with pytest.raises(DFlashError, match="target model_type 'llava' is not supported") as err:
        read_target_config(str(tmp_path))
    assert "\n" not in str(err.value)


def test_the_moe_text_family_loads_without_a_vision_tower(tmp_path):
    target, _ = load_target(str(make_target(tmp_path / "moe", "qwen3_5_moe_text", seed=5)))
    assert target.model_type == "qwen3_5_moe_text" and target.model.config.num_experts == 4


def vl_greedy(path, prompt, n):
    """Greedy decoding by the VL model itself, with no cache: the oracle the loaded text model matches."""
    model, ids = vl_model(path), list(prompt)
    with torch.no_grad():
        for _ in range(n):
            ids.append(int(model(input_ids=torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt):]


@pytest.mark.parametrize("family", list(TEXT_TYPES))
def test_speculative_greedy_on_a_vl_target_equals_autoregressive(vl_targets, drafter, family):
    llm = LLM(str(vl_targets[family]), str(drafter), block_size=4, backend="torch")
    assert llm.backend == "torch" and llm.target.model_type == TEXT_TYPES[family]
    params = SamplingParams(max_tokens=16, ignore_eos=True)
    prompt = IDS[:7]
    ar = llm.generate(prompt, params, speculative=False)[0]
    spec = llm.generate(prompt, params, speculative=True)[0]
    assert spec.token_ids == ar.token_ids and len(ar.token_ids) == 16
    assert all(1 <= tau <= 4 for tau in spec.metrics.acceptance_lengths)
    assert ar.token_ids == vl_greedy(vl_targets[family], prompt, 16)


def test_export_checks_the_text_model_type_of_a_vl_target(vl_targets, drafter, tmp_path, monkeypatch):
    """`dflash-trt export` decides from config.json, before loading weights, by the text model's type."""
    from click.testing import CliRunner

    import dflash_trt.export.graphs as graphs
    import dflash_trt.models.checkpoints as checkpoints
    from dflash_trt.cli import main

    checked = []
    monkeypatch.setattr(graphs, "export_refusal", lambda model_type, *_: checked.append(model_type) or "refused here")
    monkeypatch.setattr(checkpoints, "load_target", lambda *a, **k: pytest.fail("weights loaded before the check"))
    result = CliRunner().invoke(main, ["export", "--target", str(vl_targets["qwen3_5_moe"]), "--draft", str(drafter),
                                       "-o", str(tmp_path / "bundle")])
    assert result.exit_code != 0 and "refused here" in result.output
    assert checked == ["qwen3_5_moe_text"]

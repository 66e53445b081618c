"""A model's generation_config.json gives the sampling defaults of requests that leave fields out, as
vLLM's --generation-config auto: offline (LLM.generate, stream, Engine, the CLI) and through bundles."""

import json

import pytest
from click.testing import CliRunner
from factories import make_drafter, make_target

from dflash_trt.cli import main
from dflash_trt.errors import DFlashError
from dflash_trt.export.manifest import read_bundle
from dflash_trt.models.generation_defaults import sampling_defaults
from dflash_trt.runtime.llm import LLM
from dflash_trt.spec.sampling import SamplingParams

# as a model's creator ships them (Qwen3's kind), in transformers' names
SHIPPED = {"do_sample": True, "temperature": 0.6, "top_p": 0.9, "top_k": 20, "max_new_tokens": 6,
           "repetition_penalty": 1.2}
DEFAULTS = {"temperature": 0.6, "top_p": 0.9, "top_k": 20, "max_tokens": 6, "repetition_penalty": 1.2}


def ship(directory, **fields):
    config = json.loads((directory / "generation_config.json").read_text())
    (directory / "generation_config.json").write_text(json.dumps({**config, **fields}))
    return directory


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("generation-defaults")
    return (ship(make_target(root / "target", "qwen3", seed=3), **SHIPPED),
            make_drafter(root / "draft", seed=3, block_size=4, target_layer_ids=[1, 2]))


def test_the_shipped_config_gives_vllm_s_six_fields_under_sampling_params_names(pair, tiny_pairs):
    target = pair[0]
    assert sampling_defaults(target) == DEFAULTS
    assert sampling_defaults(target, "vllm") == {}
    assert sampling_defaults(tiny_pairs["qwen3"][0]) == {}  # a config with no sampling fields: none
    # another directory's file, and overrides over what was found (vLLM's -1: no top-k)
    assert sampling_defaults(tiny_pairs["qwen3"][0], str(target)) == DEFAULTS
    assert sampling_defaults(target, "auto", '{"temperature": 0.2, "top_k": -1}') == {
        **DEFAULTS, "temperature": 0.2, "top_k": 0}
    assert sampling_defaults(target, "vllm", {"min_p": 0.1}) == {"min_p": 0.1}


def test_bad_defaults_are_one_line_naming_where_they_came_from(pair, tmp_path):
    target = pair[0]
    cases = [
        (dict(overrides='{"do_sample": true}'), "--override-generation-config: 'do_sample' is not a sampling default"),
        (dict(overrides="[1]"), "--override-generation-config must be a JSON object"),
        (dict(overrides="{temperature"), "--override-generation-config is not valid JSON"),
        (dict(overrides={"temperature": -1}), "--override-generation-config: SamplingParams.temperature must be >= 0"),
        (dict(setting=str(tmp_path)), f"--generation-config must be auto, vllm or a directory holding a "
                                      f"generation_config.json, got '{tmp_path}'"),
    ]
    for kwargs, message in cases:
        with pytest.raises(DFlashError) as err:
            sampling_defaults(target, kwargs.get("setting", "auto"), kwargs.get("overrides"))
        assert str(err.value).startswith(message), str(err.value)
    bad = ship(make_target(tmp_path / "bad", "qwen3"), top_p=1.5)
    with pytest.raises(DFlashError, match=r"bad's generation config: SamplingParams.top_p must be in \(0, 1\]"):
        sampling_defaults(bad)
    refused = ship(make_target(tmp_path / "refused", "qwen3"), max_new_tokens=0)  # transformers' own refusal
    with pytest.raises(DFlashError, match="refused's generation config: `max_new_tokens` must be greater than 0"):
        sampling_defaults(refused)


@pytest.fixture(scope="module")
def greedy_llm(pair):
    """The pair with its shipped defaults, greedy by override (so that a request's tokens can be compared)."""
    return LLM(str(pair[0]), str(pair[1]), backend="torch", override_generation_config={"temperature": 0})


def test_a_request_without_sampling_params_gets_the_models_defaults_on_every_entry_point(greedy_llm):
    from dflash_trt.runtime.engine import Engine

    llm, prompt = greedy_llm, [5, 6, 7, 8, 90, 207, 251, 263, 24, 131]  # tokens the penalty holds back
    expected = SamplingParams(**{**DEFAULTS, "temperature": 0})
    assert llm.get_default_sampling_params() == expected
    reference = llm.generate(prompt, expected)[0].token_ids
    assert len(reference) == 6  # max_new_tokens, where SamplingParams' own default is 256
    assert llm.generate(prompt)[0].token_ids == reference
    assert list(llm.stream(prompt))[-1].token_ids == reference
    # the repetition penalty is taken too: without it the reply differs
    assert llm.generate(prompt, SamplingParams(max_tokens=6))[0].token_ids != reference
    engine = Engine(llm, max_batch=2)
    try:
        assert engine.generate([prompt])[0].token_ids == reference
    finally:
        engine.shutdown()


def test_vllm_setting_leaves_sampling_params_own_defaults(pair):
    llm = LLM(str(pair[0]), str(pair[1]), backend="torch", generation_config="vllm")
    assert llm.get_default_sampling_params() == SamplingParams()


def test_a_bundle_carries_its_targets_generation_config(pair, tmp_path):
    from dflash_trt.export.bundle import export_bundle
    from dflash_trt.models.checkpoints import load_drafter, load_target

    target, tokenizer = load_target(str(pair[0]))
    bundle = export_bundle(target, load_drafter(pair[1]), tokenizer, tmp_path / "bundle", flavour="slots", check=False)
    assert "generation_config.json" in read_bundle(bundle)["files"]
    assert LLM.from_bundle(bundle).sampling_defaults == DEFAULTS
    assert LLM.from_bundle(bundle, generation_config="vllm").sampling_defaults == {}


def test_the_generate_command_takes_the_defaults_for_the_options_left_out(pair):
    target, draft = map(str, pair)

    def tokens(*options):
        result = CliRunner().invoke(main, ["generate", "--target", target, "--draft", draft, "--backend", "torch",
                                           "--json", "--temperature", "0", *options, "hello"])
        assert result.exit_code == 0, result.output
        reply = result.output[result.output.index('{"text"'):]  # after the stderr progress bars CliRunner mixes in
        return json.loads(reply.splitlines()[0])["token_ids"]

    assert len(tokens()) == 6  # the config's max_new_tokens
    assert len(tokens("--max-tokens", "3")) == 3  # an option given wins
    result = CliRunner().invoke(main, ["generate", "--target", target, "--draft", draft,
                                       "--override-generation-config", '{"max_length": 9}', "hello"])
    assert result.exit_code == 2 and len(result.output.strip().splitlines()) == 1
    assert "'max_length' is not a sampling default" in result.output

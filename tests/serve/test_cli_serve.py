"""`dflash-trt serve` refuses bad inputs and a taken port in one line, before Triton starts."""

import socket

import pytest
from click.testing import CliRunner

from dflash_trt.cli import main


def run(*args):
    result = CliRunner().invoke(main, ["serve", *args])
    return result.exit_code, result.output.strip()


def test_model_and_target_together(tmp_path):
    code, out = run(str(tmp_path), "--target", "x")
    assert code == 2 and out == f"Error: pass MODEL or --target, not both (got '{tmp_path}' and 'x')"


@pytest.mark.parametrize("missing", [True, False])
def test_a_model_that_is_no_bundle_and_no_checkpoint(tmp_path, missing):
    code, out = run(str(tmp_path / "nope" if missing else tmp_path))
    assert code == 2 and out.startswith("Error: ") and len(out.splitlines()) == 1


@pytest.fixture
def served(monkeypatch):
    """The ServeConfig `serve` would start Triton with."""
    configs = []
    monkeypatch.setattr("dflash_trt.serve.server.serve", lambda config, say: configs.append(config))
    return configs


def test_vllm_s_command_line_serves_a_target_with_its_speculative_config(tiny_pairs, served):
    """`serve MODEL --speculative-config '{"method": "dflash", "model": D, "num_speculative_tokens": N}'`
    (vLLM's, TensorRT-Edge-LLM's) is --target MODEL --draft D --block-size N + 1; a bundle directory as
    MODEL is served as a bundle; --enable-auto-tool-choice is taken (tools are parsed whenever the format
    is known)."""
    import json

    target, draft = map(str, tiny_pairs["qwen3"])
    spec = json.dumps({"method": "dflash", "model": draft, "num_speculative_tokens": 7})
    code, out = run(target, "--speculative-config", spec, "--enable-auto-tool-choice", "--no-enable-prefix-caching")
    assert code == 0, out
    (config,) = served
    assert (config.bundle, config.target, config.draft, config.block_size) == (None, target, draft, 8)
    assert config.prefix_caching is False


def test_a_bundle_as_model_is_served_as_a_bundle(tiny_pairs, served, tmp_path):
    from factories import make_drafter, make_target

    from dflash_trt.export.bundle import export_bundle
    from dflash_trt.models.checkpoints import load_drafter, load_target

    target, tokenizer = load_target(str(make_target(tmp_path / "t", "qwen3")))
    drafter = load_drafter(make_drafter(tmp_path / "d", block_size=4, target_layer_ids=[1, 2]))
    bundle = export_bundle(target, drafter, tokenizer, tmp_path / "b", flavour="slots", check=False)
    code, out = run(str(bundle))
    assert code == 0, out
    assert (served[0].bundle, served[0].target) == (bundle, None)


@pytest.mark.parametrize("spec, words", [
    ("{", "not valid JSON"), ("[1]", "must be a JSON object"),
    ('{"method": "eagle3"}', "method 'eagle3': dflash-trt runs dflash drafters"),
    ('{"num_speculative_tokens": 0}', "num_speculative_tokens must be an integer >= 1, got 0"),
    ('{"draft_tensor_parallel_size": 1}', "'draft_tensor_parallel_size' is not supported here"),
    ('{"model": "d"}', "pass the drafter once"), ('{"num_speculative_tokens": 3}', "pass the block once"),
])
def test_a_speculative_config_it_cannot_honour_is_one_line(tiny_pairs, served, spec, words):
    code, out = run("--target", str(tiny_pairs["qwen3"][0]), "--speculative-config", spec, "--draft",
                    str(tiny_pairs["qwen3"][1]), "--block-size", "4")
    if "once" not in words:  # the others fail on their own
        code, out = run("--target", str(tiny_pairs["qwen3"][0]), "--speculative-config", spec)
    assert code == 2 and words in out and len(out.splitlines()) == 1 and not served


def test_bad_target(tmp_path, tiny_pairs):
    code, out = run("--target", str(tmp_path / "missing"), "--draft", str(tiny_pairs["qwen3"][1]))
    assert code == 2 and out.startswith("Error: ") and len(out.splitlines()) == 1


@pytest.mark.parametrize("option, value", [("--max-batch", "0"), ("--max-batch", "-3"), ("--block-size", "1")])
def test_bad_numbers(option, value, tiny_pairs):
    code, out = run("--target", str(tiny_pairs["qwen3"][0]), option, value)
    assert code == 2 and option in out and len(out.splitlines()) == 1


def test_taken_port(tiny_pairs):
    target, draft = tiny_pairs["qwen3"]
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code, out = run("--target", str(target), "--draft", str(draft), "--port", str(port))
    assert code == 2 and f"cannot listen on 127.0.0.1:{port}" in out and "--port" in out


def test_vllm_s_option_names_are_taken_too(tiny_pairs):
    """--max-num-seqs and --max-model-len (vLLM's) are --max-batch and --capacity: checked alike."""
    code, out = run("--target", str(tiny_pairs["qwen3"][0]), "--max-num-seqs", "0")
    assert code == 2 and "--max-batch must be an integer >= 1, got 0" in out
    code, out = run("--target", str(tiny_pairs["qwen3"][0]), "--max-model-len", "1")
    assert code == 2 and "--capacity must be an integer >= 2, got 1" in out


@pytest.mark.parametrize("options, words", [
    (["--generation-config", "nowhere"], "--generation-config must be auto, vllm or a directory holding a "
                                         "generation_config.json, got 'nowhere'"),
    (["--override-generation-config", '{"do_sample": true}'], "'do_sample' is not a sampling default"),
    (["--override-generation-config", '{"top_p": 0}'], "--override-generation-config: SamplingParams.top_p must be"),
])
def test_sampling_defaults_it_cannot_take_are_one_line(tiny_pairs, options, words):
    target, draft = map(str, tiny_pairs["qwen3"])
    code, out = run("--target", target, "--draft", draft, *options)
    assert code == 2 and words in out and len(out.splitlines()) == 1


def test_a_generation_config_the_model_ships_with_a_bad_value_is_one_line(tiny_pairs, tmp_path):
    import json
    import shutil

    target = shutil.copytree(tiny_pairs["qwen3"][0], tmp_path / "target")
    config = json.loads((target / "generation_config.json").read_text())
    (target / "generation_config.json").write_text(json.dumps({**config, "temperature": -0.5}))
    code, out = run("--target", str(target), "--draft", str(tiny_pairs["qwen3"][1]))
    assert code == 2 and len(out.splitlines()) == 1
    assert "target's generation config: SamplingParams.temperature must be >= 0" in out


def test_the_generation_config_settings_reach_the_triton_model(tiny_pairs, served):
    target, draft = map(str, tiny_pairs["qwen3"])
    code, out = run("--target", target, "--draft", draft, "--generation-config", "vllm",
                    "--override-generation-config", '{"temperature": 0.5}')
    assert code == 0, out
    parameters = served[0].model_parameters()
    assert (parameters["generation_config"], parameters["override_generation_config"]) == ("vllm", '{"temperature": 0.5}')


def test_tls_cors_and_log_options_it_cannot_take_are_one_line(tiny_pairs, tmp_path):
    target, draft = map(str, tiny_pairs["qwen3"])
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate\n")
    for options, words in [
        (["--ssl-keyfile", str(junk)], "--ssl-keyfile and --ssl-certfile go together"),
        (["--ssl-keyfile", str(junk), "--ssl-certfile", str(junk)], "not a certificate and its key"),
        (["--root-path", "llm/"], "--root-path must start with / and not end with one"),
        (["--log-stats-interval", "0"], "--log-stats-interval must be a number of seconds > 0"),
        (["--max-log-len", "-1"], "--max-log-len must be >= 0"),
    ]:
        code, out = run("--target", target, "--draft", draft, *options)
        assert code == 2 and words in out and len(out.splitlines()) == 1, out
    code, out = run("--target", target, "--draft", draft, "--allowed-origins", '{"https://app.example": 1}')
    assert code == 2 and "--allowed-origins" in out and "a JSON list of strings" in out


def test_enforce_eager_reaches_the_triton_model(tiny_pairs, served):
    target, draft = map(str, tiny_pairs["qwen3"])
    assert run("--target", target, "--draft", draft)[0] == 0
    assert run("--target", target, "--draft", draft, "--enforce-eager")[0] == 0
    assert [config.model_parameters()["enforce_eager"] for config in served] == ["0", "1"]


def test_the_seed_reaches_the_triton_model_and_a_bad_one_is_one_line(tiny_pairs, served):
    target, draft = map(str, tiny_pairs["qwen3"])
    assert run("--target", target, "--draft", draft, "--seed", "7")[0] == 0
    assert served[0].model_parameters()["seed"] == "7"
    code, out = run("--target", target, "--draft", draft, "--seed", "-2")
    assert code == 2 and out == "Error: seed must be an integer in [0, 2**64) or None, got -2"

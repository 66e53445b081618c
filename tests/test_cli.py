"""The command line: streaming generate, JSON output, --help everywhere, one-line errors."""

import json

import pytest
from click.testing import CliRunner

from dflash_trt.cli import main


@pytest.fixture(scope="module")
def pair_args(tiny_pairs):
    target, draft = tiny_pairs["llama"]
    return ["--target", str(target), "--draft", str(draft), "--backend", "torch"]


def test_generate_streams_text_and_prints_the_summary(pair_args, tiny_pairs):
    from dflash_trt import LLM, SamplingParams

    # pinned: with a random drafter the adaptive default would decode plainly, and print no acceptance
    result = CliRunner().invoke(main, ["generate", *pair_args, "--max-tokens", "12", "--block-size", "4", "hello"])
    assert result.exit_code == 0, result.output
    assert "mean acceptance length" in result.stderr and "B=4" in result.stderr
    target, draft = tiny_pairs["llama"]
    expected = LLM(str(target), str(draft), backend="torch").generate("hello", SamplingParams(max_tokens=12))[0]
    assert len(expected.token_ids) == 12 and expected.text
    assert result.stdout == expected.text + "\n"  # the streamed pieces add up to the reply


def test_generate_json_matches_the_api(pair_args, tiny_pairs):
    from dflash_trt import LLM, SamplingParams

    result = CliRunner().invoke(main, ["generate", *pair_args, "--max-tokens", "10", "--json", "hello"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    target, draft = tiny_pairs["llama"]
    expected = LLM(str(target), str(draft), backend="torch").generate("hello", SamplingParams(max_tokens=10))[0]
    assert data["token_ids"] == expected.token_ids and data["metrics"]["block_size"] == 4
    assert "logprobs" not in data
    asked = CliRunner().invoke(main, ["generate", *pair_args, "--max-tokens", "10", "--json", "--logprobs", "2",
                                      "hello"])
    assert asked.exit_code == 0, asked.output
    want = LLM(str(target), str(draft), backend="torch").generate("hello", SamplingParams(max_tokens=10, logprobs=2))[0]
    got = json.loads(asked.stdout)["logprobs"]
    assert [[t for t, _ in entries] for entries in got] == [list(e) for e in want.logprobs]
    assert all(abs(lp - e[t]) < 1e-5 for entries, e in zip(got, want.logprobs, strict=True) for t, lp in entries)
    refused = CliRunner().invoke(main, ["generate", *pair_args, "--logprobs", "2", "hello"])
    assert refused.exit_code != 0 and "--logprobs goes with --json" in refused.output
    scored = CliRunner().invoke(main, ["generate", *pair_args, "--max-tokens", "2", "--json", "--prompt-logprobs", "1",
                                       "hello world"])
    assert scored.exit_code == 0, scored.output
    want = LLM(str(target), str(draft), backend="torch").generate("hello world",
                                                                  SamplingParams(max_tokens=2, prompt_logprobs=1))[0]
    got = json.loads(scored.stdout)["prompt_logprobs"]
    assert got[0] is None and len(got) == len(want.prompt_token_ids) > 1
    assert [[t for t, _ in entries] for entries in got[1:]] == [list(e) for e in want.prompt_logprobs[1:]]
    penalized = CliRunner().invoke(main, ["generate", *pair_args, "--max-tokens", "10", "--json", "--presence-penalty",
                                          "1.5", "--repetition-penalty", "1.3", "hello"])
    assert penalized.exit_code == 0, penalized.output
    penalized_want = LLM(str(target), str(draft), backend="torch").generate("hello", SamplingParams(
        max_tokens=10, presence_penalty=1.5, repetition_penalty=1.3))[0]
    assert json.loads(penalized.stdout)["token_ids"] == penalized_want.token_ids != expected.token_ids
    refused = CliRunner().invoke(main, ["generate", *pair_args, "--presence-penalty", "3", "hello"])
    assert refused.exit_code != 0 and "presence_penalty must be in [-2, 2]" in refused.output


@pytest.mark.parametrize("extra", [[], ["--json"]])
def test_generate_fails_with_one_line_when_the_target_gives_no_token(poisoned_pair, extra):
    target, draft = poisoned_pair
    # "\x0c" is token 200, after which the poisoned target's logits are NaN
    result = CliRunner().invoke(main, ["generate", "--target", str(target), "--draft", str(draft), "--backend",
                                       "torch", "--max-tokens", "5", *extra, "a\x0cb"])
    one_error_line(result, "the target's logits after the prompt gave no token (NaN logits")


def test_generate_structured_output_follows_the_grammar_as_the_api_does(pair_args, tiny_pairs, tmp_path):
    from dflash_trt import LLM, SamplingParams

    target, draft = tiny_pairs["llama"]
    llm = LLM(str(target), str(draft), backend="torch")
    schema = tmp_path / "schema.json"
    schema.write_text(json.dumps({"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}))
    gbnf = tmp_path / "list.gbnf"
    gbnf.write_text('root ::= "(" [0-9] ("," [0-9])* ")"\n')
    for options, fields in [(["--regex", "[a-c]{2,5}x"], {"structured_output": {"regex": "[a-c]{2,5}x"}}),
                            (["--choice", "yes", "--choice", "no"], {"structured_output": {"choice": ["yes", "no"]}}),
                            (["--json-schema", str(schema)], {"structured_output": {"json": schema.read_text()}}),
                            (["--grammar", str(gbnf)], {"structured_output": {"grammar": gbnf.read_text()}}),
                            (["--thinking-token-budget", "0"], {"thinking_token_budget": 0})]:
        prompt = "hello <think>" if "thinking_token_budget" in fields else "hello"
        result = CliRunner().invoke(main, ["generate", *pair_args, "--max-tokens", "20", "--json", *options, prompt])
        assert result.exit_code == 0, result.output
        want = llm.generate(prompt, SamplingParams(max_tokens=20, **fields))[0]
        assert json.loads(result.stdout)["token_ids"] == want.token_ids
    two = CliRunner().invoke(main, ["generate", *pair_args, "--regex", "a", "--choice", "a", "hello"])
    assert two.exit_code != 0 and "must set exactly one of" in two.output and len(two.output.splitlines()) == 1


def test_no_speculative_runs_without_a_drafter(tiny_pairs):
    target, _ = tiny_pairs["llama"]
    result = CliRunner().invoke(main, ["generate", "--target", str(target), "--no-speculative", "--max-tokens", "5", "x"])
    assert result.exit_code == 0, result.output
    assert "tokens" in result.stderr and "acceptance" not in result.stderr


@pytest.mark.parametrize(
    "args, message",
    [
        (["--draft", "missing-dir"], "drafter 'missing-dir' is not a directory"),
        (["--temperature", "-1"], "SamplingParams.temperature"),
        (["--block-size", "1"], "block_size must be an integer >= 2"),
    ],
)
def test_user_errors_are_one_line(pair_args, args, message):
    target_only = pair_args[:2]
    result = CliRunner().invoke(main, ["generate", *target_only, *args, "x"])
    assert result.exit_code == 2
    assert message in result.stderr
    assert "Traceback" not in result.output
    assert sum(line.startswith("Error") for line in result.stderr.splitlines()) == 1


def one_error_line(result, message: str) -> None:
    assert result.exit_code == 2, result.output
    assert message in result.stderr and "Traceback" not in result.output
    assert sum(line.startswith("Error") for line in result.stderr.splitlines()) == 1


@pytest.mark.parametrize("damage", ["garbage", "truncated"])
def test_a_corrupt_target_checkpoint_is_one_line(tiny_pairs, tmp_path, damage):
    import shutil

    target, draft = tiny_pairs["llama"]
    broken = shutil.copytree(target, tmp_path / "target")
    weights = broken / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(b"\xff" * 64 if damage == "garbage" else data[: len(data) // 2])
    for command in (["generate", "--backend", "torch"], ["export", "-o", str(tmp_path / "out")]):
        result = CliRunner().invoke(main, [command[0], "--target", str(broken), "--draft", str(draft), *command[1:],
                                           *(["x"] if command[0] == "generate" else [])])
        one_error_line(result, f"{weights}: not a readable safetensors file")


@pytest.mark.parametrize("where", ["/proc/forbidden/x", "a-file/x"])
def test_export_to_a_place_that_cannot_be_written_is_one_line_before_loading(tiny_pairs, tmp_path, monkeypatch, where):
    from dflash_trt.models import checkpoints

    def never(*args, **kwargs):
        raise AssertionError("weights loaded before the output was checked")

    monkeypatch.setattr(checkpoints, "load_target", never)
    (tmp_path / "a-file").write_text("")
    out = where if where.startswith("/") else str(tmp_path / where)
    target, draft = tiny_pairs["llama"]
    for command in ("export", "build"):
        result = CliRunner().invoke(main, [command, "--target", str(target), "--draft", str(draft), "-o", out,
                                           *(["--engine", "onnxruntime"] if command == "build" else [])])
        one_error_line(result, f"cannot write {out}")


@pytest.mark.parametrize(
    "command", [[], ["generate"], ["train-drafter"], ["export"], ["inspect"], ["bench"], ["bench-report"], ["pack-corpus"], ["draft-vocab"]]
)
def test_help_everywhere(command):
    result = CliRunner().invoke(main, [*command, "--help"])
    assert result.exit_code == 0 and "Usage:" in result.output


def test_train_drafter_refuses_a_mismatched_start_drafter_before_building_data(tiny_pairs, tmp_path, monkeypatch):
    """The start drafter is checked first: building the corpus can take an hour."""
    import dflash_trt.train.corpus as corpus

    def no_corpus(*args, **kwargs):
        raise AssertionError("the corpus was built before the start drafter was checked")

    monkeypatch.setattr(corpus, "build_corpus", no_corpus)
    target, draft = tiny_pairs["llama"]
    args = ["train-drafter", "--target", str(target), "-o", str(tmp_path / "run"), "--init-drafter", str(draft),
            "--taps", "1,2", "--mask-token-id", "259", "--block-size", "8"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2, result.output
    errors = [line for line in result.stderr.splitlines() if line.startswith("Error")]
    assert errors == [f"Error: {draft}: cannot start from this drafter: its block_size is 4, this run trains 8"]


def test_train_drafter_refuses_distill_on_a_recurrent_target_before_building_data(hybrid_target, tmp_path, monkeypatch):
    import dflash_trt.train.corpus as corpus

    def no_corpus(*args, **kwargs):
        raise AssertionError("the corpus was built before --distill was checked")

    monkeypatch.setattr(corpus, "build_corpus", no_corpus)
    args = ["train-drafter", "--target", str(hybrid_target), "-o", str(tmp_path / "run"), "--distill", "0.5",
            "--taps", "1,2", "--mask-token-id", "259", "--block-size", "4"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2, result.output
    errors = [line for line in result.stderr.splitlines() if line.startswith("Error")]
    assert len(errors) == 1 and "needs an attention-only target; 'qwen3_next' has recurrent layers" in errors[0]
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("fast_bf16", [False, True])
def test_train_drafter_bf16_needs_a_cpu_with_bf16_matmuls(tmp_path, monkeypatch, fast_bf16):
    """Emulated bf16 matmuls made a training step 26x slower than fp32: refused before any work."""
    import torch

    import dflash_trt.models.checkpoints as checkpoints

    def reached_the_target(*args, **kwargs):
        raise RuntimeError("reached load_target")

    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: fast_bf16)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    monkeypatch.setattr(checkpoints, "load_target", reached_the_target)
    result = CliRunner().invoke(main, ["train-drafter", "-o", str(tmp_path / "run"), "--bf16", "--device", "cpu"])
    if fast_bf16:
        assert isinstance(result.exception, RuntimeError) and "reached load_target" in str(result.exception)
    else:
        assert result.exit_code == 2, result.output
        errors = [line for line in result.stderr.splitlines() if line.startswith("Error")]
        assert len(errors) == 1 and "no AVX512-BF16 or AMX" in errors[0] and "without --bf16" in errors[0]
    assert not (tmp_path / "run").exists()


def test_train_drafter_refuses_block_sizes_beyond_the_drafters_before_loading_the_target(tmp_path, monkeypatch):
    import dflash_trt.models.checkpoints as checkpoints

    def reached_the_target(*args, **kwargs):
        raise RuntimeError("reached load_target")

    monkeypatch.setattr(checkpoints, "load_target", reached_the_target)
    result = CliRunner().invoke(main, ["train-drafter", "-o", str(tmp_path / "run"), "--block-sizes", "16,32,1"])
    assert result.exit_code == 2, result.output
    errors = [line for line in result.stderr.splitlines() if line.startswith("Error")]
    assert len(errors) == 1 and "block sizes [32, 1]" in errors[0] and "block size 16" in errors[0]
    assert not (tmp_path / "run").exists()


def test_generate_defaults_to_a_slots_bundle_on_the_onnxruntime_executor(tiny_pairs, tmp_path, monkeypatch):
    """--backend auto with a drafter: the pair is exported once as a slots bundle into the user cache
    and decoded on the C++ onnxruntime executor, greedy-equal to the torch backend."""
    from dflash_trt import LLM, SamplingParams
    from dflash_trt.export.manifest import read_bundle

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    target, draft = tiny_pairs["qwen3"]
    args = ["generate", "--target", str(target), "--draft", str(draft), "--max-tokens", "10", "--json", "hello"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    (bundle,) = (tmp_path / "dflash-trt" / "bundles").iterdir()
    assert read_bundle(bundle, verify_hashes=False)["flavour"] == "slots"
    expected = LLM(str(target), str(draft), backend="torch").generate("hello", SamplingParams(max_tokens=10))[0]
    assert json.loads(result.stdout)["token_ids"] == expected.token_ids


def test_generate_places_the_torch_models_where_asked(tiny_pairs, tmp_path):
    """--device / --dtype pick the torch backend under auto; float16 on the CPU decodes (the slot
    executor's buffers in the models' dtype); a bundle refuses them in one line."""
    target, draft = map(str, tiny_pairs["llama"])
    result = CliRunner().invoke(main, ["generate", "--target", target, "--draft", draft, "--device", "cpu",
                                       "--dtype", "float16", "--max-tokens", "6", "--json", "hello"])
    assert result.exit_code == 0, result.output
    assert len(json.loads(result.stdout)["token_ids"]) == 6
    bad = CliRunner().invoke(main, ["generate", "--bundle", str(tmp_path), "--device", "cpu", "hello"])
    assert bad.exit_code != 0 and "--device, --dtype, --quant and --draft-quant choose how --target is run" in bad.output


@pytest.mark.parametrize(("options", "says"), [
    (["--flavour", "portable"], "--flavour portable has no quantized form yet"),
    (["--dtype", "fp16"], "quantizes a float32 export"),
])
def test_export_quant_the_bundle_cannot_hold_is_one_line_before_loading(tiny_pairs, tmp_path, monkeypatch, options,
                                                                         says):
    from dflash_trt.models import checkpoints

    def never(*args, **kwargs):
        raise AssertionError("weights loaded before --quant was checked")

    monkeypatch.setattr(checkpoints, "load_target", never)
    target, draft = tiny_pairs["llama"]
    result = CliRunner().invoke(main, ["export", "--target", str(target), "--draft", str(draft), "-o",
                                       str(tmp_path / "out"), "--quant", "int4", *options])
    one_error_line(result, says)


def test_generate_int4_awq_is_for_the_onnxruntime_backend(tiny_pairs):
    target, draft = tiny_pairs["llama"]
    result = CliRunner().invoke(main, ["generate", "--target", str(target), "--draft", str(draft), "--backend", "torch",
                                       "--quant", "int4-awq", "hello"])
    one_error_line(result, "quant must be one of int4, int4-awq, fp8, nvfp4 on backend onnxruntime or tensorrt, "
                           "int4 or fp8 or nvfp4 on torch; got quant='int4-awq' on backend 'torch'")


def test_export_quant_int4_writes_a_bundle_inspect_describes_and_generate_runs(tiny_pairs, tmp_path):
    target, draft = tiny_pairs["llama"]
    out = tmp_path / "int4"
    result = CliRunner().invoke(main, ["export", "--target", str(target), "--draft", str(draft), "-o", str(out),
                                       "--quant", "int4"])
    assert result.exit_code == 0, result.output
    shown = CliRunner().invoke(main, ["inspect", str(out)])
    assert shown.exit_code == 0 and ("weights int4: 29 matmuls as com.microsoft.MatMulNBits, scales one float32 per block of 32, by "
                                      "onnxruntime MatMulNBitsQuantizer") in shown.output
    ran = CliRunner().invoke(main, ["generate", "--bundle", str(out), "--max-tokens", "5", "--json", "hello"])
    assert ran.exit_code == 0, ran.output
    assert len(json.loads(ran.stdout)["token_ids"]) == 5


def test_build_quant_is_for_exporting_not_for_a_bundle(tmp_path):
    result = CliRunner().invoke(main, ["build", "--bundle", str(tmp_path), "-o", str(tmp_path / "e"), "--quant", "int4"])
    one_error_line(result, "--quant and --draft-quant are for exporting --target/--draft")

"""`dflash-trt serve` refuses bad inputs and a taken port in one line, before Triton starts."""

import socket

import pytest
from click.testing import CliRunner

from dflash_trt.cli import main


def run(*args):
    result = CliRunner().invoke(main, ["serve", *args])
    return result.exit_code, result.output.strip()


def test_bundle_and_target_together(tmp_path):
    code, out = run(str(tmp_path), "--target", "x")
    assert code == 2 and out == "Error: pass either BUNDLE or --target/--draft, not both"


def test_missing_bundle(tmp_path):
    code, out = run(str(tmp_path / "nope"))
    assert code == 2 and "nope is not a directory" in out and len(out.splitlines()) == 1


def test_not_a_bundle(tmp_path):
    code, out = run(str(tmp_path))
    assert code == 2 and out.startswith("Error: ") and len(out.splitlines()) == 1


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

"""The Triton model repository and the stub's environment, as files."""

import re
import subprocess

import pytest
import torch

from dflash_trt.errors import DFlashError
from dflash_trt.serve.config import ServeConfig
from dflash_trt.serve.repository import write_repository
from dflash_trt.serve.triton import TritonInstall, stub_env


def test_repository_holds_one_decoupled_python_model(tmp_path):
    target = tmp_path / "my target"
    target.mkdir()
    config = ServeConfig(target=str(target), draft='odd "name"', max_batch=3, capacity=99, block_size=4,
                         prefill_chunk=16, draft_rule="drafter", scheduling_policy="priority")
    root = write_repository(tmp_path / "repo", config)
    text = (root / "dflash" / "config.pbtxt").read_text()
    assert 'backend: "python"' in text and "decoupled: true" in text
    params = dict(re.findall(r'key: ("(?:[^"\\]|\\.)*") value \{ string_value: ("(?:[^"\\]|\\.)*") \}', text))
    assert params['"target"'] == f'"{target.resolve()}"'  # a local directory, made absolute
    assert params['"draft"'] == r'"odd \"name\""'
    assert (params['"max_batch"'], params['"capacity"'], params['"block_size"']) == ('"3"', '"99"', '"4"')
    assert params['"prefill_chunk"'] == '"16"'  # model.py hands it to the Engine
    assert params['"draft_rule"'] == '"drafter"'  # and this to the LLM, with the block size
    assert params['"scheduling_policy"'] == '"priority"'  # and this to the Engine
    assert 'name: "priority", data_type: TYPE_INT64' in text
    assert (root / "dflash" / "1" / "model.py").read_text().startswith('"""Triton Python-backend model')


def test_capacity_defaults_to_the_bundle_s_own_and_is_checked():
    """No --capacity: model.py gets "" and takes the LLM's (4096, or a slots-trt bundle's static one)."""
    assert ServeConfig(target="smollm2-135m").model_parameters()["capacity"] == ""
    with pytest.raises(DFlashError, match="--capacity must be an integer >= 2, got 1"):
        ServeConfig(target="smollm2-135m", capacity=1)


def test_an_unknown_scheduling_policy_is_refused_in_one_line():
    with pytest.raises(DFlashError, match="--scheduling-policy must be one of fcfs, priority, got 'lifo'"):
        ServeConfig(target="smollm2-135m", scheduling_policy="lifo")


def test_served_name_defaults_to_the_directory():
    assert ServeConfig(target="/x/models/tiny-llama/").served_name == "tiny-llama"
    assert ServeConfig(target="smollm2-135m").served_name == "smollm2-135m"


def test_stub_env_sees_old_numpy_first(tmp_path):
    numpy_dir = tmp_path / "old"
    (numpy_dir / "numpy").mkdir(parents=True)
    (numpy_dir / "numpy" / "__init__.py").write_text("__version__ = 'stub-only'\n")
    install = TritonInstall(tmp_path, tmp_path, tmp_path, numpy_dir)
    python = stub_env(install, tmp_path / "env") / "python3"
    code = "import importlib.util, numpy; print(numpy.__version__, importlib.util.find_spec('dflash_trt') is not None)"
    out = subprocess.run([str(python), "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["stub-only", "True"]  # and this environment's packages are there too


def test_config_refusals(tmp_path):
    from dflash_trt.errors import DFlashError

    with pytest.raises(DFlashError, match="nothing to serve"):
        ServeConfig()
    with pytest.raises(DFlashError, match="--port"):
        ServeConfig(target="x", port=70000)
    with pytest.raises(DFlashError, match=r"--prefill-chunk must be an integer >= 0 \(0: whole prompts\), got -1"):
        ServeConfig(target="x", prefill_chunk=-1)
    with pytest.raises(DFlashError, match=r"--responses-store must be an integer >= 0, got -1"):
        ServeConfig(target="x", responses_store=-1)
    for text, words in [("{", "not valid JSON"), ("[1]", "must be a JSON object"),
                        ('{"tools": []}', "may not set 'tools'")]:
        with pytest.raises(DFlashError, match=f"--default-chat-template-kwargs: .*{words}"):
            ServeConfig(target="x", default_chat_template_kwargs=text)
    assert ServeConfig(target="x", default_chat_template_kwargs='{"enable_thinking": false}').model_parameters()[
        "default_chat_template_kwargs"] == '{"enable_thinking": false}'


def test_serve_picks_the_backend_for_a_pair_and_refuses_one_for_a_bundle(tmp_path):
    from dflash_trt import DFlashError

    assert ServeConfig(target="smollm2-135m").model_parameters()["backend"] == "auto"
    with pytest.raises(DFlashError, match="--backend is for --target/--draft"):
        ServeConfig(bundle=tmp_path, backend="torch")
    with pytest.raises(DFlashError, match="--backend must be auto, torch or onnxruntime"):
        ServeConfig(target="smollm2-135m", backend="tensorrt")


def test_the_drafter_rule_needs_a_block_size_and_a_bundle_that_returns_what_it_draws_from(tmp_path):
    with pytest.raises(DFlashError, match="--draft-rule must be one of point-mass, drafter"):
        ServeConfig(target="smollm2-135m", draft_rule="typical")
    with pytest.raises(DFlashError, match="--draft-rule drafter needs --block-size"):
        ServeConfig(target="smollm2-135m", draft_rule="drafter")
    from factories import make_drafter, make_target

    from dflash_trt.export.bundle import export_bundle
    from dflash_trt.models.checkpoints import load_drafter, load_target

    target, tokenizer = load_target(str(make_target(tmp_path / "t", "qwen3")))
    drafter = load_drafter(make_drafter(tmp_path / "d", block_size=4, target_layer_ids=[1, 2]))
    bundle = export_bundle(target, drafter, tokenizer, tmp_path / "b", flavour="slots-trt", check=False, capacity=64)
    with pytest.raises(DFlashError, match="needs the draft block graph's draft_logits"):
        ServeConfig(bundle=bundle, block_size=4, draft_rule="drafter")
    assert ServeConfig(bundle=bundle, block_size=4).draft_rule == "point-mass"


def test_a_chat_template_file_and_the_tool_call_parser(tmp_path, tiny_pairs):
    from factories import TOOLS_TEMPLATE

    from dflash_trt.serve.server import front_options

    def tool_parser(config):
        return front_options(config)["tool_parser"]

    target, draft = tiny_pairs["qwen3"]
    template = tmp_path / "tools.jinja"
    template.write_text(TOOLS_TEMPLATE)
    config = ServeConfig(target=str(target), draft=str(draft), chat_template=template)
    assert config.model_parameters()["chat_template"] == str(template.resolve())
    assert tool_parser(config) == "hermes"  # auto: the format the template teaches
    assert tool_parser(ServeConfig(target=str(target), draft=str(draft))) is None  # its own renders no tools
    assert tool_parser(ServeConfig(target=str(target), draft=str(draft), tool_call_parser="qwen3_coder")) == \
        "qwen3_coder"
    assert tool_parser(ServeConfig(target=str(target), draft=str(draft), chat_template=template,
                                   tool_call_parser="none")) is None
    with pytest.raises(DFlashError, match="--tool-call-parser must be one of auto, none, hermes, qwen3_coder, llama3_json"):
        ServeConfig(target=str(target), tool_call_parser="mistral")
    (tmp_path / "binary.jinja").write_bytes(b"\xff\xfe")
    with pytest.raises(DFlashError, match="--chat-template .*binary.jinja: cannot read it as text"):
        ServeConfig(target=str(target), chat_template=tmp_path / "binary.jinja")


def test_the_reasoning_parser_knows_when_the_prompt_opens_a_think_block(tmp_path, tiny_pairs):
    """Qwen3.5's template opens a think block in its generation prompt unless enable_thinking is false."""
    from dflash_trt.serve.server import front_options

    target, draft = tiny_pairs["qwen3"]
    template = tmp_path / "thinking.jinja"
    template.write_text("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
                        "<|im_start|>assistant\n{% if enable_thinking is defined and not enable_thinking %}"
                        "<think>\n\n</think>\n\n{% else %}<think>\n{% endif %}")
    thinking = front_options(ServeConfig(target=str(target), draft=str(draft), chat_template=template,
                                         reasoning_parser="qwen3"))["thinking"]
    assert thinking({}) is True and thinking({"enable_thinking": False}) is False
    # the target's own template opens none (the reply may still begin with <think>)
    assert front_options(ServeConfig(target=str(target), draft=str(draft), reasoning_parser="qwen3"))["thinking"]({}) \
        is False
    assert front_options(ServeConfig(target=str(target), draft=str(draft)))["thinking"] is None
    with pytest.raises(DFlashError, match="--reasoning-parser must be none or qwen3"):
        ServeConfig(target=str(target), reasoning_parser="deepseek_v3")


def test_the_pair_s_placement_and_quantization_reach_the_triton_model_or_are_refused_in_one_line(tmp_path):
    """--device / --dtype / --quant / --draft-quant go to the Triton model's LLM as given; what that LLM
    would refuse (or a bundle, which runs as exported) is refused here, before Triton starts."""
    placed = ServeConfig(target="smollm2-135m", backend="torch", device="cpu", dtype="bfloat16", quant="fp8",
                         model_name="org/name").model_parameters()
    assert [placed[k] for k in ("device", "dtype", "quant", "draft_quant", "served_name")] == [
        "cpu", "bfloat16", "fp8", "", "org/name"]
    assert ServeConfig(target="smollm2-135m").model_parameters()["dtype"] == ""  # the LLM's own default
    for fields, refusal in [
        (dict(bundle=tmp_path, dtype="float16"), "a bundle runs as it was exported"),
        (dict(target="smollm2-135m", backend="onnxruntime", dtype="float16"), "device and dtype place the torch"),
        (dict(target="smollm2-135m", backend="torch", draft_quant="int4"), "draft_quant must be one of"),
        (dict(target="smollm2-135m", backend="torch", quant="int4-awq"), "quant must be one of"),
    ] + [(dict(target="smollm2-135m", device="cuda"), "this PyTorch sees no GPU")] * (not torch.cuda.is_available()):
        with pytest.raises(DFlashError, match=refusal):
            ServeConfig(**fields)

"""backend="tensorrt": engine bundles decoded on the GPU, token-identical to autoregressive decoding on
the same engines and to the onnxruntime backend. Needs an NVIDIA GPU and TensorRT: skipped elsewhere."""

import pytest
import torch

from dflash_trt import LLM, SamplingParams
from dflash_trt.engines.build import build_engines
from dflash_trt.engines.config import BuildConfig

pytestmark = [pytest.mark.gpu, pytest.mark.tensorrt]

# Checked when the module loads, before the session's bundles are exported for a test that cannot run.
if not torch.cuda.is_available():
    pytest.skip("needs an NVIDIA GPU (TensorRT engines run nowhere else)", allow_module_level=True)
pytest.importorskip("tensorrt", reason="full TensorRT is not installed (its libraries are not on PyPI)")


@pytest.fixture(scope="module")
def trt_bundles(bundles, tmp_path_factory):
    root = tmp_path_factory.mktemp("trt")
    made = {}
    if "qwen3-plugin" not in bundles:
        pytest.skip("dflash op library not built (bash scripts/build_plugins.sh)")
    for name, (source, *_) in (("portable", bundles["qwen3"]), ("plugin", bundles["qwen3-plugin"])):
        build_engines(source, root / name, BuildConfig(engine="tensorrt", max_seq_len=256))
        made[name] = root / name
    return made


@pytest.mark.parametrize("flavour", ["portable", "plugin"])
@pytest.mark.parametrize("block", [2, 4])
def test_greedy_tensorrt_equals_autoregressive_and_onnxruntime(trt_bundles, bundles, flavour, block):
    ours = LLM.from_bundle(trt_bundles[flavour], block_size=block)
    assert ours.backend == "tensorrt"
    reference = LLM.from_bundle(bundles["qwen3"][0], block_size=block)
    params = SamplingParams(max_tokens=32, ignore_eos=True)
    for prompt in ["hello there", [5, 6, 7]]:
        spec = ours.generate(prompt, params)[0]
        assert spec.token_ids == ours.generate(prompt, params, speculative=False)[0].token_ids
        assert spec.token_ids == reference.generate(prompt, params)[0].token_ids


def test_a_sequence_beyond_the_engines_max_seq_len_is_refused(trt_bundles):
    from dflash_trt.errors import DFlashError

    llm = LLM.from_bundle(trt_bundles["portable"])
    with pytest.raises(DFlashError, match="beyond the engine's --max-seq-len 256"):
        llm.generate([1] * 300, SamplingParams(max_tokens=4))

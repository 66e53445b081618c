"""float16 slots bundles on the C++ onnxruntime executor (csrc/slot_executor.cpp moves caches,
features and conv states as bundle-dtype bytes): phase logits follow the float32 torch target, and
greedy DFlash output equals plain decoding (block 1) through the same float16 graphs, for each
request alone and at concurrency 3, attention-only and hybrid targets."""

import numpy as np
import pytest
from factories import make_drafter, make_target
from scheduler_checks import decode_on

from dflash_trt.export.bundle import export_bundle
from dflash_trt.models.checkpoints import load_drafter, load_target
from dflash_trt.runtime.torch_backend import TorchTargetSession

PROMPTS = [[1, 2, 3], [4, 0, 2, 2, 1, 3, 0], [2], [3, 3, 1, 0, 4]]
# float16 keeps 11 significant bits: logits of these tiny targets (|l| < 10) agree to about 1e-2
HALF_ATOL = 3e-2


@pytest.fixture(scope="module", params=["qwen3", "qwen3_5_text"])
def half(ort, request, tmp_path_factory):
    """(float16 slots bundle, float32 TargetModel) over 6 tokens (MASK is 5): greedy drafts are often
    accepted, so commit keeps every length."""
    root = tmp_path_factory.mktemp(f"{request.param}-half")
    target_dir = make_target(root / "target", request.param, seed=5, tokenizer=False, vocab_size=6)
    draft_dir = make_drafter(root / "draft", seed=5, block_size=4, target_layer_ids=[1, 2], mask_token_id=5)
    target, _ = load_target(str(target_dir))
    bundle = export_bundle(target, load_drafter(draft_dir), None, root / "bundle", flavour="slots",
                           dtype="float16", check=False)
    return bundle, target


def run(core, ort, bundle, prompts, block_size, max_batch=3):
    return decode_on(core, ort.ort_executor(bundle, max_batch=max_batch, capacity=64), prompts, block_size, max_batch)


def test_the_executor_allocates_float16_slots_and_its_logits_follow_the_float32_target(ort, half):
    bundle, target = half
    config = ort.executor_config(bundle, max_batch=2, capacity=32)
    assert config.dtype == "float16"
    executor = ort.ort_executor(bundle, max_batch=2, capacity=32)
    prompt, block = PROMPTS[1], [1, 4, 0, 2]
    (prefill,) = executor.prefill_logits([1], [prompt])
    (verify,) = executor.verify_logits([1], [block])
    session = TorchTargetSession(target, ())
    np.testing.assert_allclose(prefill, session.prefill(prompt)[0][None].numpy(), atol=HALF_ATOL, rtol=0)
    np.testing.assert_allclose(verify, session.forward(block)[0].numpy(), atol=HALF_ATOL, rtol=0)
    executor.commit([1], [2])
    assert executor.committed(1) == len(prompt) + 2


def test_greedy_dflash_on_float16_slots_equals_plain_decoding_alone_and_batched(core, ort, half):
    bundle, _ = half
    plain = [run(core, ort, bundle, [p], 1, max_batch=1)[0][0] for p in PROMPTS]
    together, accepted = run(core, ort, bundle, PROMPTS[:3], 4)
    assert together == plain[:3]
    alone = [run(core, ort, bundle, [p], 4, max_batch=1)[0][0] for p in PROMPTS[:3]]
    assert alone == plain[:3]
    # drafts were accepted and rejected, so commits kept every kind of length
    steps = [a for row in accepted for a in row]
    assert max(steps) >= 1 and min(steps) == 0

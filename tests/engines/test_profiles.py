"""Optimization profiles: every dynamic input dim gets (min, opt, max) per phase, shape inputs values."""

from dflash_trt.engines.profiles import covers, input_ranges, profile_dims

SPEC = {"inputs": [
    {"name": "input_ids", "dtype": "int64", "shape": ["batch", "new"]},
    {"name": "logits_from", "dtype": "int64", "shape": []},
    {"name": "past_key_0", "dtype": "float32", "shape": ["batch", 2, "past", 16]},
]}


def test_target_profiles_cover_prefill_and_verify_within_the_sequence_limit():
    phases = profile_dims("target", max_batch=4, max_seq_len=1024, block_size=8)
    assert list(phases) == ["prefill", "verify"]
    prefill = input_ranges(SPEC, phases["prefill"])
    assert prefill["input_ids"] == ([1, 1], [1, 256], [4, 1024])
    assert prefill["past_key_0"] == ([1, 2, 0, 16], [1, 2, 0, 16], [4, 2, 1023, 16])
    assert prefill["logits_from"] == ([0], [255], [1023])  # a value range: logits_from is a shape tensor
    verify = input_ranges(SPEC, phases["verify"])
    assert verify["input_ids"] == ([1, 1], [1, 8], [4, 8]) and verify["logits_from"] == ([0], [0], [0])


def test_a_step_runs_on_a_profile_whose_box_holds_it():
    phases = profile_dims("draft_block", max_batch=1, max_seq_len=512, block_size=16)
    draft = phases["draft"]
    assert covers(draft, {"batch": 1, "block": 16, "context": 512})
    assert not covers(draft, {"batch": 1, "block": 17, "context": 10})
    assert not covers(draft, {"batch": 2, "block": 4, "context": 10})
    step = profile_dims("draft_context", 1, 512, 4)["step"]
    assert covers(step, {"batch": 1, "new": 4}) and not covers(step, {"batch": 1, "new": 5})

"""Output constraints in the core (csrc/constraint.h): each position's allowed tokens, asked of the
request's constraint with the drafts before it, turn the rest to -inf before any decision. Against a
constraint written apart (tests/no_recent.py) and its greedy autoregressive reference: DFlash and
plain decoding on the onnxruntime executor give the reference's replies with drafts accepted; a seeded
sampled reply is the same with DFlash, plainly and in a batch; the mask rule at the kernel's thread
strides."""

import numpy as np
import pytest
from no_recent import NoRecent, no_recent_greedy
from test_penalties import PROMPTS, pair  # noqa: F401  (the 6-token pair over which drafts get accepted)
from test_penalties import decode as decode_adjusted

VOCAB = 6


def decode(core, ort, bundle, prompts, max_block, constrained=(True, True, True), **params):
    """Each prompt's tokens, the drafts accepted in all, and the constraints (None where a request has
    none), added at once to a fresh scheduler."""
    rules = [NoRecent(VOCAB, p) if c else None for p, c in zip(prompts, constrained, strict=False)]
    tokens, accepted = decode_adjusted(core, ort, bundle, prompts, max_block, rules, **params)
    return tokens, accepted, rules


def test_greedy_decoding_under_a_constraint_equals_its_autoregressive_reference(core, ort, pair):  # noqa: F811
    bundle, target = pair
    expected = [no_recent_greedy(target, prompt, 16) for prompt in PROMPTS]
    free, _, _ = decode(core, ort, bundle, PROMPTS, 0, (False,) * 3, max_tokens=16)
    assert free != expected  # unconstrained, these replies repeat recent tokens
    dflash, accepted, rules = decode(core, ort, bundle, PROMPTS, 0, max_tokens=16)
    plain, _, _ = decode(core, ort, bundle, PROMPTS, 1, max_tokens=16)
    assert dflash == expected and plain == expected
    assert accepted > 0  # drafts were verified against constrained positions, and kept
    assert all(rule.calls > 0 for rule in rules)


def test_a_constrained_request_beside_free_ones_changes_only_itself(core, ort, pair):  # noqa: F811
    bundle, target = pair
    free, _, _ = decode(core, ort, bundle, PROMPTS, 0, (False,) * 3, max_tokens=16)
    mixed, _, rules = decode(core, ort, bundle, PROMPTS, 0, (False, True, False), max_tokens=16)
    assert mixed[0] == free[0] and mixed[2] == free[2]
    assert mixed[1] == no_recent_greedy(target, PROMPTS[1], 16) and rules[0] is None


def test_a_seeded_sampled_constrained_request_is_the_same_with_dflash_plainly_and_in_a_batch(core, ort, pair):  # noqa: F811
    bundle, _ = pair
    sampled = dict(max_tokens=20, temperature=0.9, top_p=0.95, seed=3)
    alone, _, _ = decode(core, ort, bundle, PROMPTS[:1], 0, **sampled)
    batched, accepted, _ = decode(core, ort, bundle, PROMPTS, 0, **sampled)
    plain, _, _ = decode(core, ort, bundle, PROMPTS, 1, **sampled)
    assert batched[0] == alone[0] and batched == plain
    assert accepted > 0
    assert all(t not in reply[i - 2:i] for reply in batched for i, t in enumerate(reply) if i >= 2)  # the rule held


@pytest.mark.parametrize("threads", [1, 7, 256])
def test_masked_tokens_go_to_minus_infinity_at_every_thread_stride(core, threads):
    rng = np.random.default_rng(threads)
    vocab, positions = 70, 3  # three words a position, the last partly used
    logits = rng.standard_normal((positions, vocab)).astype(np.float32)
    allowed = rng.random((positions, vocab)) < 0.3
    masks = np.zeros((positions, 3), dtype=np.uint32)
    for k, t in zip(*np.nonzero(allowed), strict=True):
        masks[k, t // 32] |= np.uint32(1 << (t % 32))
    got = core.penalized_logits(logits, [], [0, 1, 2], core.SamplingParams(), 0, threads, masks)
    assert np.array_equal(got[allowed], logits[allowed]) and np.isneginf(got[~allowed]).all()


def test_a_constraint_that_breaks_its_protocol_is_an_error_not_a_silent_decode(core, ort, pair):  # noqa: F811
    class Wrong(NoRecent):
        def masks(self, drafts, may_replace):
            k, masks, drafts = super().masks(drafts, may_replace)
            return k + 1, masks, drafts  # one mask short

    bundle, _ = pair
    sched = core.Scheduler(ort.ort_executor(bundle, max_batch=3, capacity=64),
                           core.SchedulerConfig(max_batch=3, capacity=64, block_size=4, engine_seed=0))
    sched.add_request(PROMPTS[0], core.RequestParams(max_tokens=4, ignore_eos=True, constraint=Wrong(VOCAB, [0])))
    with pytest.raises(Exception, match=r"constraint(.s masks\(\))? gave"):
        while sched.has_work:
            sched.step()


def test_drafts_are_replaceable_except_where_the_executor_drew_them_from_q(core, pair):  # noqa: F811
    """The core lets a constraint replace refused drafts (constraint.h) on greedy rows and on T>0 rows
    whose drafts are the drafter's argmax, never on T>0 rows drawn from q (the drafter rule), whose
    acceptance reads q of the drafts as drawn."""
    from dflash_trt.runtime.ort_executor import SlotBundle

    class Asked(NoRecent):
        def masks(self, drafts, may_replace):
            if drafts:
                self.asked.add(may_replace)
            return super().masks(drafts, may_replace)

    bundle, _ = pair
    for rule, sampled, want in [("point-mass", False, {True}), ("point-mass", True, {True}),
                                ("drafter", False, {True}), ("drafter", True, {False})]:
        sched = core.Scheduler(SlotBundle(bundle).executor(1, 64, draft_rule=rule),
                               core.SchedulerConfig(max_batch=1, capacity=64, block_size=4, engine_seed=0))
        rule_of = Asked(VOCAB, PROMPTS[0])
        rule_of.asked = set()
        sampling = dict(temperature=0.9, seed=1) if sampled else {}
        sched.add_request(PROMPTS[0], core.RequestParams(max_tokens=8, ignore_eos=True, constraint=rule_of,
                                                         **sampling))
        while sched.has_work:
            sched.step()
        assert rule_of.asked == want, (rule, sampled)

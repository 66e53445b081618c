"""The decision kernel's block code (csrc/decide.h with a CUDA block's threads) run on host threads
(csrc/host_block.h: barriers for __syncthreads, atomics for shared-memory atomics, the bitonic sort the
kernel uses): with any thread count it gives the host entry points' probabilities and tokens. This proves
the block algorithm and its barriers on a CPU, not the CUDA build (the GPU check's `gpu` tests do that)."""

import numpy as np
import pytest

PARAMS = [dict(temperature=1.0), dict(temperature=0.7, top_k=5), dict(temperature=1.0, top_k=40),
          dict(temperature=0.8, top_p=0.9), dict(temperature=1.3, top_k=100, top_p=0.5),
          dict(temperature=10.0, top_p=0.95),  # nearly flat: the nucleus holds most of the row
          dict(temperature=1.0, top_p=1e-4), dict(temperature=0.9, top_k=8, top_p=0.85)]


def rows(seed, vocab, count=3):
    """Peaked rows, and rows on a 0.25 grid (exact ties, the maximum tied too)."""
    rng = np.random.default_rng(seed)
    peaked = rng.standard_cauchy((count, vocab)).astype(np.float32)
    tied = np.round(rng.normal(0.0, 2.0, (count, vocab)) * 4) / 4
    tied[:, 3] = tied[:, 7] = tied.max(axis=1)
    return np.concatenate([peaked, tied.astype(np.float32)])


@pytest.mark.parametrize("threads", [1, 3, 32, 64])
@pytest.mark.parametrize("params", PARAMS, ids=lambda p: ",".join(f"{k}={v}" for k, v in p.items()))
def test_the_block_code_gives_the_hosts_probabilities_on_any_thread_count(core, params, threads):
    sampling = core.SamplingParams(**params)
    for vocab in (8, 1000, 1537):
        for row in rows(vocab, vocab):
            got = core.block_probs(row[None], sampling, threads)
            assert np.array_equal(got, core.target_probs(row[None], sampling)[0])


@pytest.mark.parametrize("params", [PARAMS[3], PARAMS[4]], ids=lambda p: ",".join(f"{k}={v}" for k, v in p.items()))
@pytest.mark.parametrize("blocks", [1, 8])
def test_the_block_code_gives_the_hosts_probabilities_as_a_cluster(core, params, blocks):
    """More threads than a CUDA block holds, as the cluster kernel runs it on a GPU (8 blocks of 512):
    600 here, not a multiple of the maximum's fold, in one group or in 8 whose radix bins are added apart
    and gathered after each pass (the chunk walkers, as in every block test here, numbered in reverse of
    the ids)."""
    sampling = core.SamplingParams(**params)
    for row in rows(11, 1537, count=1):
        got = core.block_probs(row[None], sampling, 600, blocks=blocks)
        assert np.array_equal(got, core.target_probs(row[None], sampling)[0])


@pytest.mark.parametrize("threads", [1, 7, 64])
@pytest.mark.parametrize("params", PARAMS[:6], ids=lambda p: ",".join(f"{k}={v}" for k, v in p.items()))
def test_the_block_code_decides_what_the_host_decides(core, params, threads):
    logits = rows(threads, 700, count=2)  # 4 rows: three drafts and the bonus
    sampling = core.SamplingParams(seed=5, **params)
    for request in range(6):
        # drafts that are the host's own picks, then not: verdicts of every length occur
        picks = [core.sample(logits[j], sampling, request, 30 + j) for j in range(3)]
        drafts = [p if (j + request) % 4 else (p + 1) % 700 for j, p in enumerate(picks)]
        want = core.accept(drafts, logits, sampling, request, 30)
        assert core.block_accept(drafts, logits, sampling, request, 30, threads) == tuple(want)


@pytest.mark.parametrize("threads", [1, 7, 64])
@pytest.mark.parametrize("params", PARAMS[:6], ids=lambda p: ",".join(f"{k}={v}" for k, v in p.items()))
def test_the_drafter_rules_block_code_draws_and_decides_what_the_host_does(core, params, threads):
    """What dflash_draw_drafts and dflash_target_tokens run for the drafter-distribution rule (decide.h's
    draft_row_by, drafter_position_by), a block per draw and per verify position: the host's drafts, kept
    count and next token, over the whole vocabulary and a draft vocabulary of every third id."""
    sampling = core.SamplingParams(seed=9, **params)
    target = rows(threads, 300, count=2)  # 4 rows: three drafts, then the bonus
    noise = np.random.default_rng(threads).normal(0.0, 0.3, (3, 300)).astype(np.float32)
    kept = set()
    for request in range(8):
        for draft_vocab in ([], list(range(0, 300, 3))):
            columns = draft_vocab or list(range(300))
            draft = np.ascontiguousarray((target[:3] + noise)[:, columns])  # near the target: drafts are often kept
            want = core.drafter_step(target, draft, sampling, request, 40, draft_vocab)
            assert core.drafter_step(target, draft, sampling, request, 40, draft_vocab, threads) == want
            kept.add(want[1])
    assert len(kept) > 1  # blocks cut at different positions


@pytest.mark.parametrize("threads", [1, 7, 64])
@pytest.mark.parametrize("params", PARAMS[:6], ids=lambda p: ",".join(f"{k}={v}" for k, v in p.items()))
def test_the_selector_walks_block_code_draws_what_the_host_does(core, params, threads):
    """A DFlash2 selector's walk under the rule (decide.h's selector_walk_by, one block per row in
    dflash_draw_drafts): the host's draft ids and q, on scores with ties."""
    rng = np.random.default_rng(threads)
    n, k, width = 5, 6, 40
    sampling = core.SamplingParams(seed=4, **params)
    drafts = set()
    for request in range(6):
        scores = (np.round(rng.normal(0.0, 1.5, (n, k, k)) * 2) / 2).astype(np.float32)
        columns = np.stack([rng.permutation(width)[:k] for _ in range(n)]).astype(np.int64)
        want_ids, want_q = core.selector_drafts(scores, columns, width, sampling, request, 12)
        got_ids, got_q = core.selector_drafts(scores, columns, width, sampling, request, 12, threads)
        assert got_ids == want_ids and np.array_equal(got_q, want_q)
        assert np.allclose(want_q.sum(axis=1), 1.0, atol=1e-6)
        drafts.add(tuple(want_ids))
    assert len(drafts) > 1


@pytest.mark.parametrize("threads", [1, 16])
def test_a_candidate_set_that_misses_the_nucleus_falls_back_to_the_whole_row(core, threads):
    # a negative margin picks candidates lighter than top_p and no tokens that stay whatever their
    # order: the nucleus never ends among the candidates, and the walk goes on over the whole row
    sampling = core.SamplingParams(temperature=1.0, top_p=0.9)
    for row in rows(3, 500):
        want = core.target_probs(row[None], sampling)[0]
        assert np.array_equal(core.block_probs(row[None], sampling, threads, margin=-0.5), want)


@pytest.mark.parametrize("threads", [1, 16])
def test_a_nucleus_of_thousands_walked_in_chunks_ends_where_the_hosts_does(core, threads):
    # near-flat rows: with no margin the walk runs over ~9,000 sorted tokens, split across the fixed
    # chunks; the host's default path sums the sure part first and sorts only the tokens near the end
    sampling = core.SamplingParams(temperature=50.0, top_p=0.9)
    flat = np.random.default_rng(11).normal(0.0, 1.0, (3, 10_000)).astype(np.float32)
    for row in flat:
        want = core.target_probs(row[None], sampling)[0]
        assert 8_000 < np.count_nonzero(want) < 10_000
        assert np.array_equal(core.block_probs(row[None], sampling, threads, margin=-0.5), want)


def test_the_block_comparison_can_fail(core):
    row = rows(0, 300)[3]  # a tied row: a wide nucleus
    assert not np.array_equal(core.block_probs(row[None], core.SamplingParams(temperature=1.0, top_p=0.5), 8),
                              core.target_probs(row[None], core.SamplingParams(temperature=1.0, top_p=0.9))[0])


def test_a_thread_count_past_the_blocks_is_one_line(core):
    from dflash_trt.errors import DFlashError

    with pytest.raises(DFlashError, match=r"threads must be in \[1, 4096\]"):
        core.block_probs(np.zeros((1, 4), np.float32), core.SamplingParams(temperature=1.0), 4097)

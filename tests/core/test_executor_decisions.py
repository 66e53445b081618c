"""The slot executor's decisions against the host rules (csrc/decide.h through _core.accept /
_core.sample) on chosen logits with ties: greedy, temperature, top-k and top-p.

Its target graph is a table of logits we choose (a Python graph writing them into the executor's
buffer), so a phase decides exactly the rows the host rules are given. On the host this checks
which logits row each decision reads; on a GPU (marked `gpu`, skipped where PyTorch sees none) the
decision kernel (csrc/decide_kernel.cu) decides them where they are."""

import numpy as np
import pytest
import torch

from dflash_trt.runtime.torch_graphs import TorchGraph

DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU that PyTorch sees")])]

VOCAB, ROWS, BLOCK = 1000, 3, 5


class LogitsTarget(torch.nn.Module):
    """The target graph's I/O (one attention layer, no drafter); its logits are `table` [ROWS, BLOCK, V]."""

    def __init__(self):
        super().__init__()
        self.table = None

    def forward(self, input_ids, cache_lengths, query_lengths, logits_index, key, value):
        n, r = logits_index.shape
        return self.table[:n, :r], input_ids.new_zeros(*input_ids.shape, 0, dtype=torch.float32), key, value


class LogitsGraphs:
    def __init__(self, device):
        self.target, self.device, self.stream = LogitsTarget(), torch.device(device), None

    def version(self):
        return "logits table"

    def use_stream(self, handle):
        self.stream = torch.cuda.ExternalStream(handle)

    def open(self, name):
        assert name == "target"
        inputs = ["input_ids", "cache_lengths", "query_lengths", "logits_index", "cache_key_0", "cache_value_0"]
        outputs = ["logits", "features", "cache_key_out_0", "cache_value_out_0"]
        return TorchGraph(self.target, inputs, outputs, self.device, self.stream)


def executor(core, graphs, vocab=VOCAB, max_batch=ROWS):
    config = core.ExecutorConfig()
    config.target_path, config.library_path = "target", "torch"
    config.max_batch, config.capacity, config.vocab = max_batch, 64, vocab
    config.target_layers, config.attention_layers = 1, [0]
    config.target_kv_heads, config.target_head_dim = 1, 8
    return core.PyGraphExecutor(config, graphs, graphs.device.type)


def tied_logits(seed):
    """Logits on a 0.25 grid (many exact ties, the maximum tied too), as float32 [ROWS, BLOCK, V]."""
    rng = np.random.default_rng(seed)
    logits = np.round(rng.normal(0.0, 2.0, (ROWS, BLOCK, VOCAB)) * 4) / 4
    logits[:, :, 7] = logits[:, :, 3] = logits.max(axis=2)  # the argmax is a tie: the first index wins
    return logits.astype(np.float32)


PARAMS = [dict(), dict(temperature=0.7), dict(temperature=1.0, top_k=40), dict(temperature=0.8, top_p=0.9),
          dict(temperature=1.3, top_k=100, top_p=0.5)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("params", PARAMS, ids=lambda p: ",".join(f"{k}={v}" for k, v in p.items()) or "greedy")
def test_each_decision_equals_the_host_rules_on_its_own_logits(core, params, device):
    if device == "cuda" and not core.HAS_DEVICE_DECIDE:
        pytest.fail("dflash_trt._core was built without the decision kernel on a GPU machine (nvcc missing?)")
    graphs = LogitsGraphs(device)
    ex = executor(core, graphs)
    for seed in range(4):
        logits = tied_logits(seed)
        sampling = [core.RowSampling(core.SamplingParams(seed=seed * 10 + i, **params), stream=i, position=20 + i)
                    for i in range(ROWS)]
        graphs.target.table = torch.from_numpy(logits[:, :1].copy()).to(device)  # a prefill: one row per row
        rows = list(range(ROWS))
        first = ex.prefill(rows, [[1, 2, 3]] * ROWS, sampling)
        assert first == [core.sample(logits[i, 0], s.sampling, i, 20 + i) for i, s in enumerate(sampling)]
        # blocks whose drafts are mostly the host's own picks, so verdicts of every length occur
        blocks = []
        for i in range(ROWS):
            drafts = [int(np.argmax(logits[i, j])) if (j + seed) % 3 else 0 for j in range(BLOCK - 1)]
            blocks.append([first[i], *drafts])
        graphs.target.table = torch.from_numpy(logits).to(device)
        got = ex.verify(rows, blocks, sampling)
        want = [core.accept(blocks[i][1:], logits[i], sampling[i].sampling, i, 20 + i) for i in range(ROWS)]
        assert got == [tuple(w) for w in want]
        ex.commit(rows, [0] * ROWS)
        for row in rows:
            ex.release(row)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("count", [ROWS, 8], ids=["few-pairs", "many-pairs"])
@pytest.mark.parametrize("params", PARAMS, ids=lambda p: ",".join(f"{k}={v}" for k, v in p.items()) or "greedy")
def test_decisions_over_a_real_vocabulary_equal_the_host_rules(core, params, count, device):
    """Qwen3's 151,936 tokens (rows whose top few thousand tokens carry most of the mass, and every other
    position one token holding nearly all of it, as a trained model's often do): the device's radix
    passes, candidate search and sort at the size they were written for. On a GPU of SM 9.0 or later,
    3 rows' 15 (row, position) pairs are decided by a cluster of blocks each, 8 rows' 40 by a block each
    (csrc/cuda_device.cpp's kWidePairs)."""
    vocab = 151936
    graphs = LogitsGraphs(device)
    ex = executor(core, graphs, vocab, max_batch=count)
    rng = np.random.default_rng(3)
    logits = (rng.standard_normal((count, BLOCK, vocab)) * 3).astype(np.float32)
    logits[:, 1::2, 17] += 25.0
    sampling = [core.RowSampling(core.SamplingParams(seed=7 + i, **params), stream=i, position=50 + i)
                for i in range(count)]
    graphs.target.table = torch.from_numpy(logits[:, :1].copy()).to(device)
    rows = list(range(count))
    first = ex.prefill(rows, [[1, 2, 3]] * count, sampling)
    assert first == [core.sample(logits[i, 0], s.sampling, i, 50 + i) for i, s in enumerate(sampling)]
    # drafts: the target's own picks, then a miss: verdicts past the first position occur
    blocks = [[first[i], *(core.sample(logits[i, j], sampling[i].sampling, i, 50 + i + j) if (j + i) % 3 < 2 else 5
                            for j in range(BLOCK - 1))] for i in rows]
    graphs.target.table = torch.from_numpy(logits).to(device)
    got = ex.verify(rows, blocks, sampling)
    assert got == [tuple(core.accept(blocks[i][1:], logits[i], sampling[i].sampling, i, 50 + i)) for i in rows]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("params", [dict(), dict(temperature=0.8, top_p=0.9)], ids=["greedy", "sampled"])
def test_logprobs_are_decided_with_the_tokens_as_the_host_rule_gives_them(core, params, device):
    """Each decided token's entries (its own, then the top 3), from the decision's logits rows."""
    graphs = LogitsGraphs(device)
    ex = executor(core, graphs)
    logits = tied_logits(5)
    sampling = [core.RowSampling(core.SamplingParams(seed=i, logprobs=3, **params), stream=i, position=9)
                for i in range(ROWS)]
    graphs.target.table = torch.from_numpy(logits[:, :1].copy()).to(device)
    rows = list(range(ROWS))
    first = ex.prefill(rows, [[1, 2, 3]] * ROWS, sampling)
    def same(got, want):  # ids exactly; values within the device's expf rounding
        assert [t for t, _ in got] == [t for t, _ in want]
        np.testing.assert_allclose([v for _, v in got], [v for _, v in want], rtol=0, atol=1e-5)

    for i in rows:
        same(ex.logprobs(i), core.logprobs(logits[i, :1], first[i], 3))
    blocks = [[first[i], *(int(np.argmax(logits[i, j])) if (i + j) % 3 else 0 for j in range(BLOCK - 1))]
              for i in rows]
    graphs.target.table = torch.from_numpy(logits).to(device)
    verdicts = ex.verify(rows, blocks, sampling)
    for i, (accepted, next_token) in enumerate(verdicts):
        decided = blocks[i][1:1 + accepted] + [next_token]
        same(ex.logprobs(i), [e for j, t in enumerate(decided) for e in core.logprobs(logits[i, j:j + 1], t, 3)])

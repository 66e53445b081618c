"""The slots flavour (graph contract 2) of the hybrid families on onnxruntime, driven as the batched
runtime drives it: ragged rows, K/V written in place, linear-attention states read from the rows'
slots and chosen back at commit. Every row equals HF's own forward over its whole sequence, and a
commit of any length continues exactly as a plain decode would."""

import numpy as np
import onnxruntime as ort
import pytest
import torch
from factories import export_tiny_slots_bundle

from dflash_trt.export.delta_rule import delta_rule_scan
from dflash_trt.export.manifest import read_bundle
from dflash_trt.models.checkpoints import load_target

ATOL = 1e-4
CAPACITY = 32
PROMPTS = [[3, 17, 99, 4, 250], [8], [40, 41, 42, 43, 44, 45, 46, 47, 48]]
BLOCKS = [[7, 200, 13, 90], [61, 2], [5, 5, 150]]


@pytest.fixture(scope="module", params=["qwen3_5_text", "qwen3_next"])
def hybrid_slots(request, tmp_path_factory):
    """(slots bundle exported with the polygraphy check, TargetModel)."""
    root = tmp_path_factory.mktemp(f"hybrid-slots-{request.param}")
    bundle = export_tiny_slots_bundle(root, family=request.param, check=True)
    return bundle, load_target(str(root / request.param))[0]


class Rows:
    """The runtime's side of contract 2 for a batch of rows: K/V slot buffers bound in place (garbage
    past each row's length), per-row state slots, commit = a length and a state copy."""

    def __init__(self, bundle, batch):
        manifest = read_bundle(bundle)
        self.spec = manifest["graphs"]["target"]
        self.session = ort.InferenceSession(str(bundle / "target.onnx"), providers=["CPUExecutionProvider"])
        rng = np.random.default_rng(3)
        self.buffers = {}
        for io in self.spec["inputs"][4:]:
            shape = [batch if d == "batch" else CAPACITY if d == "capacity" else d for d in io["shape"]]
            fill = 1e4 * rng.choice([-1.0, 1.0], shape) if io["name"].startswith("cache_") else np.zeros(shape)
            self.buffers[io["name"]] = fill.astype(np.float32)
        self.lengths = np.zeros(batch, np.int64)
        self.pending = None

    def step(self, tokens: list[list[int]], rows: list[list[int]]):
        """Feed tokens[b] after row b's committed prefix; logits/states at positions rows[b]."""
        new = max(map(len, tokens))
        ids = np.array([t + [0] * (new - len(t)) for t in tokens], np.int64)
        index = np.array(rows, np.int64)
        binding = self.session.io_binding()
        for name, value in {"input_ids": ids, "cache_lengths": self.lengths,
                            "query_lengths": np.array([len(t) for t in tokens], np.int64), "logits_index": index}.items():
            binding.bind_cpu_input(name, value)
        values = {}
        for name, buffer in self.buffers.items():
            values[name] = ort.OrtValue.ortvalue_from_numpy(buffer)
            binding.bind_ortvalue_input(name, values[name])
        outputs = [io["name"] for io in self.spec["outputs"]]
        for name in outputs:
            if name.startswith("cache_"):  # in place
                binding.bind_ortvalue_output(name, values[name.replace("_out_", "_")])
            else:
                binding.bind_output(name)
        self.session.run_with_iobinding(binding)
        got = dict(zip(outputs, binding.get_outputs(), strict=True))
        self.pending = {name: got[name].numpy() for name in outputs
                        if name.startswith(("conv_state_out", "recurrent_state_out", "conv_inputs", "delta_inputs"))}
        self.fed = [len(t) for t in tokens]
        return got["logits"].numpy(), got["features"].numpy()

    def commit(self, kept: list[int]):
        """Row b keeps kept[b] tokens of the last step: the returned states when it keeps them all, else
        its slot's states advanced over the kept positions' inputs by delta_rule_scan (the recurrence
        the graphs export, run in PyTorch) and the conv window's columns."""
        for name in [n for n in self.pending if n.startswith("conv_state_out")]:
            layer = name.rsplit("_", 1)[1]
            conv, recurrent = self.buffers[f"conv_state_{layer}"], self.buffers[f"recurrent_state_{layer}"]
            for b, keep in enumerate(kept):
                if keep == self.fed[b]:
                    conv[b] = self.pending[name][b]
                    recurrent[b] = self.pending[f"recurrent_state_out_{layer}"][b]
                elif keep > 0:
                    window = np.concatenate([conv[b], self.pending[f"conv_inputs_{layer}"][b]], axis=1)
                    conv[b] = window[:, keep:keep + conv.shape[2]]
                    recurrent[b] = rebuilt(recurrent[b], self.pending[f"delta_inputs_{layer}"][b, :keep])
        self.lengths += np.array(kept, np.int64)


def rebuilt(state, inputs):
    """The recurrent state [Hv, Dk, Dv] after the positions `inputs` [t, Hk*Dk + Hv*Dv + 2*Hv] feed it."""
    heads, dk, dv = state.shape
    key_heads = (inputs.shape[1] - heads * (dv + 2)) // dk
    key, value, g, beta = np.split(torch.tensor(inputs)[None], np.cumsum([key_heads * dk, heads * dv, heads]), axis=-1)
    t = inputs.shape[0]
    _, states = delta_rule_scan(torch.zeros(1, t, key_heads, dk), key.reshape(1, t, key_heads, dk),
                                value.reshape(1, t, heads, dv), g, beta, torch.tensor(state)[None], torch.tensor(t - 1))
    return states[0, -1].numpy()


def hf(target, ids):
    """HF's forward over ids from empty -> (logits [n, V], features of taps 1, 2 [n, F], cache)."""
    cache = target.new_cache().kv
    with torch.no_grad():
        out = target.model(torch.tensor([ids]), past_key_values=cache, use_cache=True, output_hidden_states=True)
    return out.logits[0].numpy(), torch.cat([out.hidden_states[k + 1][0] for k in (1, 2)], -1).numpy(), cache


def assert_row_states(rows, target, b, cache):
    linear = [i for i, t in enumerate(target.config.layer_types) if t == "linear_attention"]
    for layer in linear:
        np.testing.assert_allclose(rows.buffers[f"conv_state_{layer}"][b],
                                   cache.get_conv_state(layer, state_idx=0)[0, :, 1:].numpy(), atol=ATOL, rtol=0)
        np.testing.assert_allclose(rows.buffers[f"recurrent_state_{layer}"][b],
                                   cache.get_recurrent_state(layer, state_idx=0)[0].numpy(), atol=ATOL, rtol=0)


@pytest.mark.parametrize("kept", [[1, 1, 1], [2, 2, 3], [4, 1, 2]])
def test_ragged_rows_equal_hf_through_prefill_verify_partial_commit_and_on(hybrid_slots, kept):
    bundle, target = hybrid_slots
    rows = Rows(bundle, len(PROMPTS))
    last = [[len(p) - 1] for p in PROMPTS]
    logits, features = rows.step(PROMPTS, last)
    rows.commit([len(p) for p in PROMPTS])
    for b, prompt in enumerate(PROMPTS):
        ref_logits, ref_features, cache = hf(target, prompt)
        np.testing.assert_allclose(logits[b, 0], ref_logits[-1], atol=ATOL, rtol=0)
        np.testing.assert_allclose(features[b, :len(prompt)], ref_features, atol=ATOL, rtol=0)
        assert not features[b, len(prompt):].any()  # padding rows' features are zero
        assert_row_states(rows, target, b, cache)
    width = max(map(len, BLOCKS))
    every = [list(range(len(block))) + [len(block) - 1] * (width - len(block)) for block in BLOCKS]
    logits, _ = rows.step(BLOCKS, every)  # a verify: every position, ragged
    for b, (prompt, block) in enumerate(zip(PROMPTS, BLOCKS, strict=True)):
        np.testing.assert_allclose(logits[b, :len(block)], hf(target, prompt + block)[0][len(prompt):], atol=ATOL,
                                   rtol=0)
    rows.commit(kept)
    follow = [[9, 180], [33], [1, 2, 3]]
    logits, _ = rows.step(follow, [list(range(len(f))) + [len(f) - 1] * (3 - len(f)) for f in follow])
    for b, (prompt, block) in enumerate(zip(PROMPTS, BLOCKS, strict=True)):
        sequence = prompt + block[:kept[b]]
        assert rows.lengths[b] == len(sequence)
        assert_row_states(rows, target, b, hf(target, sequence)[2])  # the commit chose position kept - 1
        np.testing.assert_allclose(logits[b, :len(follow[b])], hf(target, sequence + follow[b])[0][len(sequence):],
                                   atol=ATOL, rtol=0)


def test_the_states_at_every_kept_length_equal_hf(hybrid_slots):
    """A commit of each length 1 .. len(block) from the same verify (the whole block: the graph's own
    states; fewer: rebuilt from the slot's and the kept positions' inputs) equals HF's states there."""
    bundle, target = hybrid_slots
    rows = Rows(bundle, len(PROMPTS))
    rows.step(PROMPTS, [[len(p) - 1] for p in PROMPTS])
    rows.commit([len(p) for p in PROMPTS])
    width = max(map(len, BLOCKS))
    rows.step(BLOCKS, [list(range(len(block))) + [len(block) - 1] * (width - len(block)) for block in BLOCKS])
    before = {name: buffer.copy() for name, buffer in rows.buffers.items() if not name.startswith("cache_")}
    lengths = rows.lengths.copy()
    for j in range(1, width + 1):
        kept = [min(j, len(block)) for block in BLOCKS]
        rows.buffers.update({name: buffer.copy() for name, buffer in before.items()})
        rows.lengths = lengths.copy()
        rows.commit(kept)
        for b, (prompt, block) in enumerate(zip(PROMPTS, BLOCKS, strict=True)):
            assert_row_states(rows, target, b, hf(target, prompt + block[:kept[b]])[2])

"""Running a slots-flavour target graph (graph contract 2) as the batched runtime does, and its
references, shared by the slots tests of every exportable family (tests/export)."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import torch

from dflash_trt.export.graphs import TargetGraph
from dflash_trt.export.slot_graphs import slot_kv_names

CAPACITY = 40


class Slots:
    """What the runtime does: one numpy buffer per cache, bound as input and output of every step."""

    def __init__(self, bundle, target, batch, garbage=1e4, path="target.onnx", capacity=CAPACITY):
        self.session = ort.InferenceSession(str(bundle / path), providers=["CPUExecutionProvider"])
        cfg = target.config
        shape = (batch, cfg.num_key_value_heads, capacity, cfg.head_dim)
        g = np.random.default_rng(7)
        self.caches = [(garbage * g.choice([-1.0, 1.0], shape)).astype(np.float32) for _ in range(2 * target.num_layers)]
        self.layers = target.num_layers

    def step(self, ids, cache_lengths, query_lengths, logits_index):
        binding = self.session.io_binding()
        feed = {"input_ids": np.asarray(ids, np.int64), "cache_lengths": np.asarray(cache_lengths, np.int64),
                "query_lengths": np.asarray(query_lengths, np.int64), "logits_index": np.asarray(logits_index, np.int64)}
        for name, value in feed.items():
            binding.bind_cpu_input(name, value)
        binding.bind_output("logits")
        binding.bind_output("features")
        for cache, name, out in zip(self.caches, slot_kv_names(self.layers), slot_kv_names(self.layers, "_out"), strict=True):
            value = ort.OrtValue.ortvalue_from_numpy(cache)  # wraps the numpy memory: no copy
            binding.bind_ortvalue_input(name, value)
            binding.bind_ortvalue_output(out, value)
        self.session.run_with_iobinding(binding)
        outputs = binding.get_outputs()
        # in place: every cache output is the very buffer its input was
        assert [o.data_ptr() for o in outputs[2:]] == [c.ctypes.data for c in self.caches]
        return outputs[0].numpy(), outputs[1].numpy()


def v1_present(target, taps, ids):
    """Contract 1's present K/V for `ids` from an empty cache (TargetGraph in PyTorch)."""
    cfg = target.config
    empty = [torch.zeros(1, cfg.num_key_value_heads, 0, cfg.head_dim)] * (2 * target.num_layers)
    with torch.no_grad():
        _, _, *present = TargetGraph(target, taps)(torch.tensor([ids]), torch.zeros(1, dtype=torch.long),
                                                   torch.tensor(len(ids) - 1), *empty)
    return [p[0].numpy() for p in present]


def reference(target, taps, ids):
    """The HF model's logits and tapped features for `ids` (the torch backend's forward)."""
    logits, features = target.forward(list(ids), target.new_cache(), taps)
    return logits.numpy(), features.numpy()


def assert_row_equals_reference(target, taps, slots: Slots, logits, features, row: int, sequence: list[int],
                                committed: int, atol: float) -> None:
    """Row `row` of a slots step that fed `sequence[committed:]` after `committed` cached tokens: its
    logits, features and the K/V rows it wrote equal HF's and contract 1's for the whole `sequence`."""
    new = len(sequence) - committed
    ref_logits, ref_features = reference(target, taps, sequence)
    np.testing.assert_allclose(logits[row, :new], ref_logits[committed:], atol=atol, rtol=0)
    np.testing.assert_allclose(features[row, :new], ref_features[committed:], atol=atol, rtol=0)
    for cache, present in zip(slots.caches, v1_present(target, taps, sequence), strict=True):
        np.testing.assert_allclose(cache[row, :, committed : committed + new], present[:, committed:], atol=atol, rtol=0)


def prefilled_slots(bundle, target, taps, committed: list[int], new: int, garbage: float, seed: int):
    """Slots whose row b holds `committed[b]` random tokens' K/V (contract 1's, so the graph's own),
    garbage past them -> (slots, the prefixes, random ids [rows, new] for the next step)."""
    g = torch.Generator().manual_seed(seed)
    prefixes = [torch.randint(0, target.vocab_size, (p,), generator=g).tolist() for p in committed]
    ids = torch.randint(0, target.vocab_size, (len(committed), new), generator=g).numpy()
    slots = Slots(bundle, target, len(committed), garbage)
    for row, prefix in enumerate(prefixes):
        for cache, present in zip(slots.caches, v1_present(target, taps, prefix) if prefix else [], strict=False):
            cache[row, :, : len(prefix)] = present
    return slots, prefixes, ids

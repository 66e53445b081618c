"""LLM: the Python entry point. Load a (target, drafter) pair once, then generate."""

from __future__ import annotations

import dataclasses
import random
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from dflash_trt.errors import DFlashError
from dflash_trt.export.manifest import DRAFT_QUANTS, QUANTS, TORCH_QUANTS
from dflash_trt.models import embedded
from dflash_trt.models.chat import encode_chat, encode_prompt
from dflash_trt.models.generation_defaults import sampling_defaults
from dflash_trt.models.tokenizers import TextStream, load_tokenizer
from dflash_trt.runtime.beam_search import BeamSearchOutput, BeamSearchParams, beam_search
from dflash_trt.runtime.batch_runner import DEFAULT_CAPACITY, DEFAULT_MAX_BATCH, BatchRunner, check_batching, check_fits
from dflash_trt.runtime.outputs import Prompt, RequestOutput
from dflash_trt.runtime.prompts import RawText, from_dict
from dflash_trt.runtime.vllm_names import either, speculative_fields
from dflash_trt.spec.sampling import SamplingParams

BACKENDS = ("torch", "onnxruntime", "tensorrt")
AUTO = "auto"  # draft=AUTO: the drafter shipped for the target alias, if there is one; backend=AUTO: below


def resolve_backend(backend: str, target: str, draft: str | None, device: str | None = None,
                    dtype: str | None = None, quantized: bool = False) -> str:
    """backend AUTO -> the fastest path this machine has for the pair: "onnxruntime" for quantized
    weights (the int4 graphs run there); "torch" where a model placement is asked for (device, dtype)
    or PyTorch sees a GPU (the export's graphs in PyTorch on CUDA behind the C++ slot executor, with
    CUDA graphs); else "onnxruntime" for a pair with a drafter (a slots bundle exported once into the
    user cache, on the C++ executor: the fastest CPU path) and "torch" for a target alone. Any other
    name as given."""
    if backend != AUTO:
        return backend
    if quantized:
        return "onnxruntime"
    import torch

    if device is not None or dtype is not None or torch.cuda.is_available():
        return "torch"
    if draft == AUTO:
        return "torch" if embedded.default_drafter(target) is None else "onnxruntime"
    return "torch" if draft is None else "onnxruntime"


# Both runtime backends of this build run on the CPU, where a verify's cost grows with its block:
# on our 2-core VM one SmolLM2-135M target token took ~61-72 ms on torch, a 4-token verify 63-76 ms
# and a 16-token one 127-152 ms, so the shipped drafter decodes fastest at B=4
# (docs/bench/smollm2-135m-torch.json, greedy HumanEval: 1.44x at B=4, 0.98x at B=8, 0.77x at
# B=16; onnxruntime 1.28x / 1.18x / 0.88x). Unless asked otherwise a
# request verifies at most this many tokens (a GPU engine, where 16 cost what 1 does, will not cap).
CPU_BLOCK_SIZE = 4


def default_block_size(trained: int) -> int:
    """The verify block size when none is given: the drafter's own, at most CPU_BLOCK_SIZE."""
    return min(trained, CPU_BLOCK_SIZE)


def _check_block_size(block_size) -> None:
    if block_size is not None and (not isinstance(block_size, int) or block_size < 2):
        raise DFlashError(f"block_size must be an integer >= 2, got {block_size!r}")


def _check_draft_rule(rule: str, adaptive: bool) -> None:
    """The draft rule's checks that need no graphs: one line before anything loads, exports or builds."""
    from dflash_trt.runtime.ort_executor import draft_rule_refusal

    refusal = draft_rule_refusal(rule, None)
    if refusal:
        raise DFlashError(refusal)
    if rule == "drafter" and adaptive:
        raise DFlashError("draft_rule 'drafter' needs a fixed block_size: its tokens depend on where each block "
                          "starts, so blocks chosen per step would make a seeded request's tokens depend on its batch")


def torch_placement(device: str | None, dtype: str | None):
    """(torch.device, torch.dtype) of the torch backend's models; one line for anything else."""
    import torch

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device not in ("cpu", "cuda"):
        raise DFlashError(f"device must be 'cpu' or 'cuda', got {device!r}")
    if device == "cuda" and not torch.cuda.is_available():
        raise DFlashError("device 'cuda': this PyTorch sees no GPU (torch.cuda.is_available() is False)")
    dtype = dtype or ("bfloat16" if device == "cuda" else "float32")
    if dtype not in ("float32", "float16", "bfloat16"):
        raise DFlashError(f"dtype must be float32, float16 or bfloat16, got {dtype!r}")
    return torch.device(device), getattr(torch, dtype)


BUNDLE_PLACED = ("--device, --dtype, --quant and --draft-quant choose how --target is run; a bundle runs as it was "
                 "exported")


def placed_backend(backend: str, target: str, draft: str | None, device: str | None, dtype: str | None,
                   quant: str | None, draft_quant: str | None) -> str:
    """The backend that runs the pair (resolve_backend's choice for AUTO), placed and quantized so; one
    line for what it cannot run."""
    backend = resolve_backend(backend, target, draft, device, dtype, quant is not None or draft_quant is not None)
    if backend not in BACKENDS:
        raise DFlashError(f"backend '{backend}' is unknown; choose one of {', '.join(BACKENDS)}")
    if quant is not None and quant not in (TORCH_QUANTS if backend == "torch" else QUANTS):
        raise DFlashError(f"quant must be one of {', '.join(QUANTS)} on backend onnxruntime or tensorrt, "
                          f"{' or '.join(TORCH_QUANTS)} on torch; got quant={quant!r} on backend '{backend}'")
    if draft_quant is not None and (draft_quant not in DRAFT_QUANTS or backend == "torch"):
        raise DFlashError(f"draft_quant must be one of {', '.join(DRAFT_QUANTS)}, on backend onnxruntime or "
                          f"tensorrt; got draft_quant={draft_quant!r} on backend '{backend}'")
    if backend != "torch" and (device is not None or dtype is not None):
        raise DFlashError(f"device and dtype place the torch backend's models; backend '{backend}' runs "
                          f"a bundle in the dtype it was exported with")
    if backend == "torch":
        torch_placement(device, dtype)
    return backend


def engine_seeds(seed: int | None) -> random.Random:
    """What the engine seeds of an LLM's runners are drawn from: `seed` (vLLM's LLM(seed=)), else the OS."""
    if seed is not None and not (isinstance(seed, int) and not isinstance(seed, bool) and 0 <= seed < 2**64):
        raise DFlashError(f"seed must be an integer in [0, 2**64) or None, got {seed!r}")
    return random.Random(seed)


def _one_of(params, sampling_params):
    """`params`, or vLLM's keyword for it; both is refused."""
    if params is not None and sampling_params is not None:
        raise DFlashError("give the sampling parameters once: params or sampling_params (vLLM's name), not both")
    return sampling_params if params is None else params


def _sample(params: SamplingParams, index: int) -> SamplingParams:
    """A prompt's sample `index` as one request: seed + index when seeded (the OpenAI front's choices' rule)."""
    if params.n == 1:
        return params
    return dataclasses.replace(params, n=1, seed=None if params.seed is None else params.seed + index)


def _folded(outputs: list[RequestOutput], owner: list[int]) -> list[RequestOutput]:
    """The requests' outputs -> one per prompt: its first sample's, holding every sample when n > 1."""
    groups: dict[int, list[RequestOutput]] = {}
    for k, out in zip(owner, outputs, strict=True):
        groups.setdefault(k, []).append(out)
    folded = []
    for group in groups.values():
        if len(group) > 1:
            group[0].samples = [out.completion(i) for i, out in enumerate(group)]
        folded.append(group[0])
    return folded


def _prompt_list(prompts) -> list:
    """One prompt (text, or a list of token ids) or several -> a list of them; none is refused."""
    single = isinstance(prompts, (str, dict)) or (
        isinstance(prompts, list) and prompts and all(isinstance(t, int) for t in prompts))
    batch = [prompts] if single else list(prompts)
    if not batch:
        raise DFlashError("no prompts given")
    return batch


class LLM:
    _grammar_tokenizer = None  # llguidance's view of the tokenizer, built at the first structured request

    def __init__(
        self,
        target: str = embedded.DEFAULT_TARGET,
        draft: str | None = AUTO,
        backend: str = AUTO,
        block_size: int | None = None,
        max_batch: int = DEFAULT_MAX_BATCH,
        capacity: int = DEFAULT_CAPACITY,
        prefill_chunk: int = 0,
        device: str | None = None,
        dtype: str | None = None,
        quant: str | None = None,
        draft_quant: str | None = None,
        draft_rule: str = "point-mass",
        prefix_caching: bool = True,
        scheduling_policy: str = "fcfs",
        *,
        model: str | None = None,
        speculative_config: dict | None = None,
        max_model_len: int | None = None,
        max_num_seqs: int | None = None,
        enable_prefix_caching: bool | None = None,
        generation_config: str = "auto",
        override_generation_config: dict | str | None = None,
        seed: int | None = None,
        enforce_eager: bool = False,
    ):
        """`model`, `speculative_config` ({"method": "dflash", "model": drafter, "num_speculative_tokens":
        block_size - 1}), `max_model_len`, `max_num_seqs`, `enable_prefix_caching`: vLLM's names for
        target, draft and block_size, capacity, max_batch, prefix_caching (each setting once).
        `device` and `dtype` place the torch backend's models: "cuda" when PyTorch sees a GPU, else
        "cpu"; bfloat16 on a GPU, float32 on the CPU. A bundle's backend runs the bundle's own.
        `quant` ("int4", backend onnxruntime or tensorrt): the target's weights in 4 bits
        (export/quantize.py); on backend torch "int4", "fp8" or "nvfp4" (runtime/weight_only.py); `draft_quant`
        ("int4", onnxruntime or tensorrt): the drafter's. `backend` "auto":
        resolve_backend's choice. `draft_rule` (ort_executor.DRAFT_RULES): how T>0 requests draft;
        "drafter" needs a fixed `block_size` (and, from a bundle, a slots one). `prefix_caching`: a
        request whose prompt starts with what a finished request's KV slot holds reuses it (BatchRunner).
        `scheduling_policy` "priority": `generate(..., priority=[...])` serves lower values first and
        preempts running requests of a higher value (BatchRunner). `generation_config` ("auto": the
        target's generation_config.json; "vllm": none; a directory holding one) and
        `override_generation_config` (a dict of its names, or JSON): the sampling defaults a request
        without its own SamplingParams gets (vLLM's; models/generation_defaults.py). `seed` (vLLM's):
        the draws of requests that bring no seed of their own follow from it, so a rerun of the same
        calls samples the same tokens (None: they differ run to run). `enforce_eager` (vLLM's): no CUDA
        graphs on a GPU, every decode step launched kernel by kernel (debugging, profiling)."""
        target = either("target", target, embedded.DEFAULT_TARGET, "model", model)
        capacity = either("capacity", capacity, DEFAULT_CAPACITY, "max_model_len", max_model_len)
        max_batch = either("max_batch", max_batch, DEFAULT_MAX_BATCH, "max_num_seqs", max_num_seqs)
        prefix_caching = either("prefix_caching", prefix_caching, True, "enable_prefix_caching", enable_prefix_caching)
        if speculative_config is not None:  # its model in place of draft's default (AUTO: the embedded pair's)
            found, block_size = speculative_fields(speculative_config, None if draft == AUTO else draft, block_size)
            draft = draft if found is None else found
        backend = placed_backend(backend, target, draft, device, dtype, quant, draft_quant)
        _check_block_size(block_size)
        _check_draft_rule(draft_rule, adaptive=block_size is None)
        self._batching(max_batch, capacity, prefill_chunk, prefix_caching, scheduling_policy)
        self._seeds = engine_seeds(seed)
        self.enforce_eager = bool(enforce_eager)
        # PyTorch model code is imported here, on the torch path only: from_bundle never loads it.
        from dflash_trt.models.checkpoints import check_pair, load_drafter, load_target, resolve_draft, resolve_target

        self.sampling_defaults = sampling_defaults(resolve_target(target), generation_config, override_generation_config)
        from dflash_trt.models.pairing import validate_pair
        from dflash_trt.models.target import eos_token_ids
        from dflash_trt.runtime.grouped_attention import use_grouped_attention
        from dflash_trt.runtime.skinny import use_skinny_linears

        if draft == AUTO:
            found = embedded.default_drafter(target)
            draft = None if found is None else str(found)
        elif draft is not None:
            draft = str(resolve_draft(draft))  # a hub id is fetched once, here
        if draft is not None:
            check_pair(target, draft)  # from configs: a wrong pair is refused before any weights load or export
        if backend in ("onnxruntime", "tensorrt"):
            if draft is None:
                raise DFlashError(f"backend '{backend}' runs an exported (target, drafter) bundle: pass draft=DIR")
            from dflash_trt.runtime.bundles import cached_bundle, cached_engines

            if backend == "onnxruntime":
                bundle = cached_bundle(target, draft, quant=quant, draft_quant=draft_quant)
            else:
                # the drafter rule draws from the draft block's distribution: slots-trt exports it when asked
                bundle = cached_engines(target, draft, capacity, max_batch, quant, draft_quant,
                                        draft_distribution=True if draft_rule == "drafter" else None)
            self._load_bundle(bundle, block_size, max_batch)
            self._set_draft_rule(draft_rule)
            return
        self.backend = "torch"
        self.device, self.dtype = torch_placement(device, dtype)
        self.graph_stats = Counter()  # the torch graphs' runs on a GPU: CUDA graphs captured, replayed, eager
        self.draft_kernels: tuple[str, ...] = ()  # dflash:: ops its draft graphs run (set by torch_executor)
        self.target_kernels: tuple[str, ...] = ()  # and its target graph (GatedDeltaRule on a GPU)
        self.target, self.tokenizer = load_target(target, self.dtype)
        self.target.model.to(self.device)
        self.drafter = None
        if draft is not None:
            self.drafter = load_drafter(draft, self.dtype).to(self.device)
            if self.drafter.draft_vocab is not None:
                self.drafter.draft_vocab = self.drafter.draft_vocab.to(self.device)
            validate_pair(self.target, self.drafter.config)  # the loaded embedding may differ from the config
            self.draft_head = self.drafter.head(self.target.lm_head)  # built once, shared by sessions
            use_skinny_linears(self.drafter)
            use_skinny_linears(self.draft_head)
        if quant is not None:  # after the draft head took the float LM head: the drafter stays in float
            from dflash_trt.runtime.weight_only import quantize_target

            quantize_target(self.target.model, quant)
        use_skinny_linears(self.target.model)  # a verify of 2-4 tokens then costs about what 1 does
        use_grouped_attention(self.target.model)  # ...and does not copy the K/V cache per query group
        self.vocab_size = self.target.vocab_size
        self.has_drafter = self.drafter is not None
        # how many token ids the drafter may propose (its draft vocabulary, else the whole vocabulary)
        self.draft_vocab_size = self.draft_head.size if self.drafter is not None else None
        self.block_size = block_size or (default_block_size(self.drafter.config.block_size) if self.drafter else None)
        self.max_block_size = block_size or (self.drafter.config.block_size if self.drafter else None)
        self.adaptive = block_size is None
        self.eos_token_ids = eos_token_ids(self.target, self.tokenizer)
        self._set_draft_rule(draft_rule)

    @classmethod
    def from_bundle(cls, path: str | Path, block_size: int | None = None, max_batch: int | None = None,
                    capacity: int | None = None, prefill_chunk: int = 0, draft_rule: str = "point-mass",
                    prefix_caching: bool = True, scheduling_policy: str = "fcfs", *, generation_config: str = "auto",
                    override_generation_config: dict | str | None = None, seed: int | None = None,
                    enforce_eager: bool = False) -> LLM:
        """Run what `dflash-trt export` or `dflash-trt build` wrote on a C++ executor: a slots (or
        slots-trt) bundle or onnxruntime engines built from one on onnxruntime, TensorRT engines built
        from a slots-trt bundle on the GPU. Portable and plugin bundles (graph contract 1, for engine
        builds) are refused in one line. No PyTorch model code is used.
        `capacity` (tokens per KV slot) defaults to the bundle's own where its graphs fix one
        (slots-trt), else DEFAULT_CAPACITY. TensorRT slots-trt engines also bound the rows per step
        (`max_batch` defaults to theirs) and the prompt tokens per step (prompts longer than their
        prefill profile enter in chunks of it). `generation_config`, `override_generation_config`: as
        LLM's ("auto": the generation_config.json export copied from the target); `seed`, `enforce_eager`:
        as LLM's (TensorRT engines' CUDA graphs)."""
        from dflash_trt.runtime.engine_bundles import bundle_capacity

        _check_block_size(block_size)
        llm = cls.__new__(cls)
        capacity = capacity or bundle_capacity(path) or DEFAULT_CAPACITY
        # the user's values first
        llm._batching(max_batch or DEFAULT_MAX_BATCH, capacity, prefill_chunk, prefix_caching, scheduling_policy)
        llm.sampling_defaults = sampling_defaults(path, generation_config, override_generation_config)
        llm._seeds = engine_seeds(seed)
        llm.enforce_eager = bool(enforce_eager)
        llm._load_bundle(Path(path), block_size, max_batch)
        llm._set_draft_rule(draft_rule)
        return llm

    def _set_draft_rule(self, rule: str) -> None:
        """How T>0 requests draft (DRAFT_RULES); one line for a rule this LLM cannot run, before any request."""
        from dflash_trt.runtime.ort_executor import draft_rule_refusal

        self.draft_rule = rule
        _check_draft_rule(rule, self.adaptive)
        refusal = draft_rule_refusal(rule, None if self.backend == "torch" else self._bundle.manifest)
        if refusal:
            raise DFlashError(refusal)
        if rule == "point-mass":
            return
        if self.backend == "torch" and not self.has_drafter:
            raise DFlashError("draft_rule 'drafter' needs a drafter")

    def _batching(self, max_batch: int, capacity: int, prefill_chunk: int = 0, prefix_caching: bool = True,
                  scheduling_policy: str = "fcfs") -> None:
        """How `generate` runs a list: up to `max_batch` requests at once, each in a KV slot of
        `capacity` tokens (prompt + max_tokens must fit), prompts `prefill_chunk` tokens per step
        (0: whole), reusing finished requests' slots for prompts that start with their tokens
        (`prefix_caching`), admitted by arrival or by priority (`scheduling_policy`)."""
        check_batching(max_batch, capacity, prefill_chunk, scheduling_policy)
        if not isinstance(prefix_caching, bool):
            raise DFlashError(f"prefix_caching must be True or False, got {prefix_caching!r}")
        self.max_batch, self.capacity, self.prefill_chunk = max_batch, capacity, prefill_chunk
        self.prefix_caching, self.scheduling_policy = prefix_caching, scheduling_policy
        self._core: tuple[tuple, BatchRunner] | None = None  # (its settings, the runner): made at first use

    def _load_bundle(self, path: Path, block_size: int | None, max_batch: int | None) -> None:
        """Open a bundle for its C++ executor; `max_batch` None: TensorRT engines' own rows, else the
        value `_batching` was given."""
        from dflash_trt.runtime.ort_executor import SlotBundle

        # contract 2 only: a portable or plugin bundle (contract 1) is for engine builds, refused in one line
        self._bundle = SlotBundle(path)
        rows, chunk = self._bundle.max_rows, self._bundle.max_chunk
        if chunk is not None and self.prefill_chunk > chunk:
            raise DFlashError(f"{path}: its engines prefill at most {chunk} tokens per step; pass prefill_chunk "
                              f"<= {chunk}, or rebuild with a larger --max-seq-len")
        if rows is not None:
            self._bundle.check_limits(max_batch or rows, self.capacity)  # before any request, not at the first
            self._batching(max_batch or rows, self.capacity, self.prefill_chunk or chunk, self.prefix_caching)
        self.backend = "tensorrt" if self._bundle.kind == "tensorrt" else "onnxruntime"
        manifest = self._bundle.manifest
        self.target = self.drafter = None  # no PyTorch models behind this backend
        self.tokenizer = load_tokenizer(str(path))
        self.vocab_size = manifest["target"]["vocab_size"]
        self.has_drafter = True
        self.draft_vocab_size = manifest["draft"].get("draft_vocab_size", self.vocab_size)  # bundles before it: all
        if self.backend == "tensorrt":  # on a GPU a verify of B tokens costs what one does: no CPU cap
            self.block_size = block_size or manifest["block_size"]
        else:
            self.block_size = block_size or default_block_size(manifest.get("block_size", manifest["draft"]["block_size"]))
        # engines bound the block; an exported bundle, the drafter's training
        self.max_block_size = block_size or manifest.get("block_size", manifest["draft"]["block_size"])
        self.adaptive = block_size is None
        if manifest["draft"].get("method") == "dflash2" and self.max_block_size > manifest["draft"]["block_size"]:
            raise DFlashError(f"block_size {self.max_block_size} is larger than this DFlash2 drafter's block "
                              f"({manifest['draft']['block_size']}): its graph walks the selector over that many")
        if self.block_size > manifest.get("block_size", self.block_size):
            raise DFlashError(f"block_size {self.block_size} is larger than the engines were built for "
                              f"({manifest['block_size']}): rebuild with --block-size")
        self.eos_token_ids = tuple(manifest["target"]["eos_token_ids"])

    @property
    def block_size(self) -> int | None:
        """The verify block a speculative request uses when pinned (`block_size=` or set); else the
        drafter's default, and each step chooses its block (adaptive)."""
        return self._block_size

    @block_size.setter
    def block_size(self, value: int | None) -> None:
        self._block_size = value
        self.adaptive = False

    def executor(self, max_batch: int, capacity: int):
        """A new core executor with `max_batch` KV slots of `capacity` tokens: a bundle's C++ executor
        (onnxruntime, TensorRT), or the slot executor over this LLM's torch modules (torch_graphs.py)."""
        if self.backend == "torch":
            from dflash_trt.runtime.torch_graphs import torch_executor

            return torch_executor(self, max_batch, capacity)
        return self._bundle.executor(max_batch, capacity, draft_rule=self.draft_rule,
                                     cuda_graphs=not self.enforce_eager)

    # -- prompts -------------------------------------------------------------------------------

    def get_default_sampling_params(self) -> SamplingParams:
        """What a request without SamplingParams gets (vLLM's): the generation config's defaults over
        SamplingParams' own (greedy, 256 tokens)."""
        return SamplingParams(**self.sampling_defaults)

    def engine_seed(self) -> int:
        """The engine seed of a new core runner (its requests without a seed draw from it): each runner its
        own, since request ids start again in a new one, all following from LLM(seed=)."""
        return self._seeds.getrandbits(64)

    def get_tokenizer(self):
        """The target's tokenizer (vLLM's accessor; None for a target without one)."""
        return self.tokenizer

    def encode(self, prompt: Prompt | dict) -> list[int]:
        """Strings get the chat template when the target has one; token-id lists pass through; vLLM's
        prompt dicts: {"prompt": text} is tokenized as it is (no template), {"prompt_token_ids": ids}."""
        if isinstance(prompt, dict):
            prompt = from_dict(prompt)
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise DFlashError("this target has no tokenizer; pass prompts as lists of token ids")
            raw = isinstance(prompt, RawText)
            ids = self.tokenizer(prompt)["input_ids"] if raw else encode_prompt(self.tokenizer, prompt)
        else:
            ids = list(prompt)
            bad = [t for t in ids if not (isinstance(t, int) and 0 <= t < self.vocab_size)]
            if bad:
                raise DFlashError(f"prompt token id {bad[0]!r} is outside the vocabulary (size {self.vocab_size})")
        if not ids:
            raise DFlashError("prompt is empty")
        return ids

    def constraint(self, params: SamplingParams, prompt_ids: list[int] = ()):
        """What a request's output must follow, for the core: its grammar (runtime/constraints.py), its
        thinking budget (whether `prompt_ids` leave a think block open) and its allowed / bad tokens
        (runtime/token_rules.py), or None without any. The first part may replace a refused draft."""
        from dflash_trt.runtime.token_rules import THINK, UNTHINK, AllOf, ThinkingBudget, TokenRules, bad_word_sequences

        parts = [] if params.structured_output is None else [self._grammar(params)]
        if params.thinking_token_budget is not None:
            start, end = (tuple(self.tokenizer.encode(marker, add_special_tokens=False)) for marker in (THINK, UNTHINK))
            parts.append(ThinkingBudget(self.vocab_size, start, end, params.thinking_token_budget, list(prompt_ids)))
        if params.allowed_token_ids is not None or params.bad_words:
            bad = bad_word_sequences(self.tokenizer, params.bad_words) if params.bad_words else []
            parts.append(TokenRules(self.vocab_size, params.allowed_token_ids, bad))
        return None if not parts else parts[0] if len(parts) == 1 else AllOf(*parts)

    def _grammar(self, params: SamplingParams):
        from dflash_trt.runtime.constraints import GrammarConstraint, grammar_tokenizer

        after, after_id = params.structured_output.after, None
        if after is not None:
            ids = self.tokenizer.encode(after, add_special_tokens=False)
            if len(ids) != 1:
                raise DFlashError(f"structured_output.after {after!r} is {len(ids)} tokens for this tokenizer; "
                                  "it must be one")
            after_id = ids[0]
        if self._grammar_tokenizer is None:  # built once: it reads the whole vocabulary
            self._grammar_tokenizer = grammar_tokenizer(self.tokenizer, self.vocab_size)
        return GrammarConstraint(self._grammar_tokenizer, params.structured_output, self.vocab_size,
                                 (*self.eos_token_ids, *params.stop_token_ids), after_id)

    def text_stream(self, skip_special_tokens: bool = True) -> TextStream | None:
        """A new request's detokenizer; None when the target has no tokenizer (then outputs have no text)."""
        return None if self.tokenizer is None else TextStream(self.tokenizer, skip_special_tokens)

    # -- generation ----------------------------------------------------------------------------

    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        params: SamplingParams | Sequence[SamplingParams] | None = None,
        speculative: bool = True,
        priority: Sequence[int] | None = None,
        *,
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool | Callable = False,
        lora_request: None = None,
    ) -> list[RequestOutput]:
        """Generate for each prompt, up to `max_batch` at once through the C++ core (each request's
        tokens are what it would get alone); returns one output per prompt, in order. `params`: one for
        all, or one per prompt (vLLM's forms; `sampling_params=`, vLLM's name, is the same). `priority`
        (vLLM's; needs scheduling_policy "priority"): one per prompt, lower served first. `use_tqdm`:
        a progress bar of the prompts finished (vLLM's; off by default here; a callable: the bar's class,
        tqdm's signature). `lora_request`: vLLM's, None only (no adapters here)."""
        params = _one_of(params, sampling_params)
        if lora_request is not None:
            raise DFlashError("lora_request: LoRA adapters are not supported (leave it None)")
        batch = _prompt_list(prompts)
        each = list(params) if isinstance(params, (list, tuple)) else [params or self.get_default_sampling_params()] * len(batch)
        if len(each) != len(batch):
            raise DFlashError(f"{len(each)} SamplingParams for {len(batch)} prompts: give one, or one per prompt")
        for one in each:
            self._check_request(one, speculative)
        if priority is not None and len(priority) != len(batch):  # each one is checked with its request
            raise DFlashError(f"{len(priority)} priorities for {len(batch)} prompts: give one per prompt")
        # every prompt is checked before any work; n samples of a prompt are n requests
        owner = [k for k, one in enumerate(each) for _ in range(one.n)]
        samples = [_sample(one, i) for one in each for i in range(one.n)]
        runs = [batch[k] for k in owner]
        ranks = None if priority is None else [priority[k] for k in owner]
        if not use_tqdm:
            return _folded(self._runner().run(runs, samples, speculative, ranks), owner)
        from tqdm.auto import tqdm

        bar_class = use_tqdm if callable(use_tqdm) else tqdm
        with bar_class(total=len(runs), desc="Processed prompts", unit="prompt") as bar:
            return _folded(self._runner().run(runs, samples, speculative, ranks, progress=bar.update), owner)

    def beam_search(self, prompts: Prompt | Sequence[Prompt], params: BeamSearchParams) -> list[BeamSearchOutput]:
        """vLLM's beam search (runtime/beam_search.py) for each prompt -> its beam_width best sequences,
        best first. Each step generates one token per live beam through this LLM's core runner (plain
        steps: a beam's prefix is in a KV slot already, so only its new token is prefilled)."""
        batch = [self.encode(prompt) for prompt in _prompt_list(prompts)]
        check_fits(max(map(len, batch)), params.max_tokens, self.capacity)  # its longest beam, at the end
        decode = None if self.tokenizer is None else (lambda ids: self.tokenizer.decode(ids, skip_special_tokens=True))
        return beam_search(lambda step, sampling: self.generate(step, sampling, speculative=False), batch, params,
                           self.eos_token_ids, decode)

    def reset_prefix_cache(self) -> None:
        """Forget the prompt positions finished requests' slots keep (vLLM's): the next prompts prefill
        whole, as they would arriving first."""
        if self._core is not None:
            self._core[1].forget_cached()

    def _runner(self) -> BatchRunner:
        """The one core runner (one executor, one KV pool) of this LLM, made at first use; plain and
        speculative requests share it. Unless the block size was pinned, each step chooses its block
        (adaptive speculation, plain steps included). Pinning a block afterwards replaces it."""
        pinned = None if self.adaptive or not self.has_drafter else self.block_size
        settings = (pinned, self.prefill_chunk, self.prefix_caching, self.scheduling_policy)
        if self._core is None or self._core[0] != settings:
            self._core = None  # the old runner's KV slots go before the new one's are allocated
            self._core = settings, BatchRunner(self, self.max_batch, self.capacity, block_size=pinned,
                                               prefill_chunk=self.prefill_chunk, prefix_caching=self.prefix_caching,
                                               scheduling_policy=self.scheduling_policy)
        return self._core[1]

    def chat(self, conversations: list, params: SamplingParams | None = None, tools: list[dict] | None = None,
             chat_template_kwargs: dict | None = None, speculative: bool = True, add_generation_prompt: bool = True,
             continue_final_message: bool = False, chat_template: str | None = None,
             documents: list[dict] | None = None, *, sampling_params: SamplingParams | None = None,
             use_tqdm: bool | Callable = False, lora_request: None = None) -> list[RequestOutput]:
        """Reply to a conversation (a list of {"role", "content", ...} turns) or a list of them, each
        through the chat template (`chat_template`, or the tokenizer's) with `tools` (OpenAI tool
        objects), `documents` (a RAG template's, e.g. {"title", "text"}) and the template's extra variables
        (e.g. {"enable_thinking": False}), as `generate` does; one output per conversation.
        `continue_final_message` (with add_generation_prompt=False, vLLM's): the reply continues the last
        message (an assistant's first words) instead of opening a turn. `sampling_params`, `use_tqdm` and
        `lora_request`: as `generate`'s."""
        params = _one_of(params, sampling_params)
        template = chat_template or (self.tokenizer.chat_template if self.tokenizer is not None else None)
        if self.tokenizer is None or not template:
            raise DFlashError("chat needs a tokenizer with a chat template; this target has none (use generate, "
                              "or pass chat_template)")
        for name, given in (("tools", tools), ("documents", documents)):
            if given and name not in template:
                raise DFlashError(f"this chat template does not render {name}")
        if add_generation_prompt and continue_final_message:
            raise DFlashError("continue_final_message needs add_generation_prompt=False (the reply continues the "
                              "last message instead of opening a turn)")
        single = bool(conversations) and isinstance(conversations[0], dict)
        ending = {"add_generation_prompt": add_generation_prompt, "continue_final_message": continue_final_message}
        prompts = [encode_chat(self.tokenizer, turns, tools, {**(chat_template_kwargs or {}), **ending}, documents,
                               chat_template) for turns in ([conversations] if single else conversations)]
        return self.generate(prompts, params, speculative, use_tqdm=use_tqdm, lora_request=lora_request)

    def stream(self, prompt: Prompt, params: SamplingParams | None = None, speculative: bool = True) -> Iterator[RequestOutput]:
        """Yield the output after every step that touched the request (stepping the LLM's core); the last
        has finish_reason set. Closing the iterator early aborts the request."""
        params = params or self.get_default_sampling_params()
        self._check_request(params, speculative)
        return self._runner().stream(prompt, params, speculative)

    def _check_request(self, params: SamplingParams, speculative: bool) -> None:
        if speculative and not self.has_drafter:
            raise DFlashError("speculative=True needs a drafter: pass draft=... or use speculative=False")
        if params.stop and self.tokenizer is None:
            raise DFlashError("stop strings need a tokenizer; this target has none (use stop_token_ids)")
        if params.structured_output is not None and self.tokenizer is None:
            raise DFlashError("structured_output needs a tokenizer; this target has none")
        if params.bad_words and self.tokenizer is None:
            raise DFlashError("bad_words need a tokenizer; this target has none")
        if params.thinking_token_budget is not None and self.tokenizer is None:
            raise DFlashError("thinking_token_budget needs a tokenizer (it finds <think> and </think>); this target "
                              "has none")
        for field, tokens in (("allowed_token_ids", params.allowed_token_ids or ()),
                              ("logit_bias", [token for token, _ in params.logit_bias])):
            outside = [token for token in tokens if token >= self.vocab_size]
            if outside:
                raise DFlashError(f"{field} names token {outside[0]}, outside the target's vocabulary "
                                  f"({self.vocab_size})")

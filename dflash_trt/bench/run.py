"""The benchmark: every (dataset, temperature, block size, concurrency) setting, DFlash vs baseline."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

from dflash_trt.bench import datasets
from dflash_trt.bench.summary import SideSummary, add_step_times, find_mismatches, summarize
from dflash_trt.errors import DFlashError


ADAPTIVE = 0  # block size "auto": each core step chooses its block (adaptive speculation)


@dataclass(frozen=True)
class BenchConfig:
    datasets: tuple[str, ...] = ("humaneval", "mt-bench")
    prompts_file: Path | None = None  # the user's own prompts, benchmarked as dataset "file:<name>"
    num_prompts: int = 10
    max_tokens: int = 128
    block_sizes: tuple[int, ...] = (16,)
    temperatures: tuple[float, ...] = (0.0,)
    concurrency: tuple[int, ...] = (1,)
    draft_rules: tuple[str, ...] = ("point-mass",)  # offline: each rule's LLM runs every setting
    seed: int = 0
    baseline: bool = True
    # offline mode: an exported or engine bundle, or checkpoints run on `backend`
    bundle: Path | None = None
    target: str | None = None
    draft: str | None = None
    backend: str | None = None  # None: auto for checkpoints (runtime/llm.py); a bundle's own (onnxruntime, or TensorRT)
    device: str | None = None  # the torch backend's placement (None: cuda where PyTorch sees a GPU, else cpu)
    dtype: str | None = None  # ... and dtype (None: bfloat16 on a GPU, float32 on the CPU)
    prefix_caching: bool = True  # offline: a prompt starting with a finished request's tokens reuses its slot
    # server mode
    base_url: str | None = None
    baseline_url: str | None = None
    model: str | None = None

    @property
    def mode(self) -> str:
        return "server" if self.base_url else "offline"

    def check(self) -> None:
        """Every user mistake is one line, before any model loads or request is sent."""
        if self.num_prompts < 1 or self.max_tokens < 1:
            raise DFlashError("--num-prompts and --max-tokens must be >= 1")
        if any(b < 2 and b != ADAPTIVE for b in self.block_sizes):
            raise DFlashError(f"block sizes must be >= 2 or auto, got {list(self.block_sizes)}")
        if ADAPTIVE in self.block_sizes and self.mode == "server":
            raise DFlashError("--block-size auto is an offline setting: a server chooses its own blocks")
        if any(t < 0 for t in self.temperatures):
            raise DFlashError(f"temperatures must be >= 0, got {list(self.temperatures)}")
        if any(c < 1 for c in self.concurrency):
            raise DFlashError(f"concurrency must be >= 1, got {list(self.concurrency)}")
        from dflash_trt.runtime.ort_executor import DRAFT_RULES

        unknown = [rule for rule in self.draft_rules if rule not in DRAFT_RULES]
        if unknown or not self.draft_rules:
            raise DFlashError(f"draft rules must be some of {', '.join(DRAFT_RULES)}, got {list(self.draft_rules)}")
        if self.mode == "server" and not self.prefix_caching:
            raise DFlashError("--no-prefix-caching is an offline setting: a server caches as it was started "
                              "(serve --no-prefix-caching)")
        if self.mode == "server" and self.draft_rules != ("point-mass",):
            raise DFlashError("--draft-rule is an offline setting: a server drafts by its own rule (serve --draft-rule)")
        if "drafter" in self.draft_rules and ADAPTIVE in self.block_sizes:
            raise DFlashError("--draft-rule drafter needs fixed block sizes (its tokens depend on where blocks start): "
                              "drop auto from --block-size")
        if self.mode == "server" and (self.target or self.draft or self.bundle):
            raise DFlashError("--base-url benchmarks a running server: drop DIR/--target/--draft (the server has its model)")
        if self.bundle and (self.target or self.draft):
            raise DFlashError("pass either a bundle DIR or --target/--draft, not both")
        if self.bundle and self.backend is not None:
            raise DFlashError(f"a bundle DIR runs on the backend its graphs need (onnxruntime, or tensorrt for "
                              f"TensorRT engines), not --backend '{self.backend}': drop --backend, "
                              "or pass --target/--draft to run the checkpoints on it")
        if (self.device or self.dtype) and (self.bundle or self.mode == "server"
                                            or self.backend not in (None, "auto", "torch")):
            raise DFlashError("--device and --dtype place the torch backend's models (offline, --target/--draft): "
                              "a bundle runs as it was exported, a server as it was started")
        if self.baseline_url and not self.base_url:
            raise DFlashError("--baseline-url needs --base-url (the DFlash server to compare against it)")
        unknown = [name for name in self.datasets if name not in datasets.DATASETS]
        if unknown:
            raise DFlashError(f"dataset '{unknown[0]}' is unknown; choose from {', '.join(datasets.DATASETS)}")
        if self.prompts_file is not None and not self.prompts_file.is_file():
            raise DFlashError(f"prompts file {self.prompts_file} does not exist")


@dataclass
class SettingResult:
    mode: str
    backend: str
    dataset: str
    block_size: int | None  # None: the server's own; 0 (ADAPTIVE): chosen per step, up to max_block_size
    temperature: float
    concurrency: int
    prompts: int
    dflash: SideSummary
    draft_rule: str | None = None  # offline: how T>0 drafts were drawn and kept (None: the server's own)
    baseline: SideSummary | None = None
    speedup: float | None = None  # throughput ratio, DFlash / baseline, same prompts, same run
    decode_speedup: float | None = None
    mismatches: list[dict] | None = None  # greedy only; None: not checked
    outputs: list[str] = field(default_factory=list)
    draft_vocab_size: int | None = None  # token ids the drafter may propose (offline mode; None: unknown)
    max_block_size: int | None = None  # offline: the largest block a step may verify
    # server mode: whether every server forgot its cached prompts after the warm-up (bench/server.py
    # RESETS; False: the timed requests of the warm-up's prompts may be served from its cache)
    prefix_cache_reset: bool | None = None

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> SettingResult:
        baseline = data.get("baseline")
        return cls(**{**data, "dflash": SideSummary.from_dict(data["dflash"]),
                      "baseline": SideSummary.from_dict(baseline) if baseline else None})


def load_prompt_sets(config: BenchConfig) -> dict[str, list[str]]:
    sets = {name: datasets.load_prompts(name, config.num_prompts) for name in config.datasets}
    if config.prompts_file is not None:
        sets[f"file:{config.prompts_file.stem}"] = datasets.load_prompt_file(config.prompts_file)[: config.num_prompts]
    if not sets:
        raise DFlashError("nothing to benchmark: pass --dataset NAME and/or --prompts FILE.jsonl")
    return sets


def compare(result: SettingResult, dflash_records, baseline_records) -> SettingResult:
    if baseline_records is None:
        return result
    if result.baseline.tokens_per_s:
        result.speedup = result.dflash.tokens_per_s / result.baseline.tokens_per_s
    if result.dflash.decode_tokens_per_s and result.baseline.decode_tokens_per_s:
        result.decode_speedup = result.dflash.decode_tokens_per_s / result.baseline.decode_tokens_per_s
    if result.temperature == 0:
        result.mismatches = find_mismatches(dflash_records, baseline_records)
    return result


def run_offline_bench(config: BenchConfig, prompt_sets: dict[str, list[str]]) -> list[SettingResult]:
    """Every setting on each draft rule's LLM (one at a time); the baseline, which drafts nothing, once per
    (dataset, temperature, concurrency), shared by every block size and rule."""
    results, baselines = [], {}
    for rule in config.draft_rules:
        llm = _offline_llm(config, rule)
        for name, prompts in prompt_sets.items():
            for temperature in config.temperatures:
                results += _offline_settings(config, llm, rule, name, prompts, temperature, baselines)
        del llm  # its executor's memory before the next rule's
    order = {rule: i for i, rule in enumerate(config.draft_rules)}  # the table's order: the sweep's, rule last
    return sorted(results, key=lambda r: (list(prompt_sets).index(r.dataset), config.temperatures.index(r.temperature),
                                          config.concurrency.index(r.concurrency),
                                          config.block_sizes.index(r.block_size), order[r.draft_rule]))


def _offline_llm(config: BenchConfig, rule: str):
    from dflash_trt.models import embedded
    from dflash_trt.runtime.engine_bundles import bundle_capacity
    from dflash_trt.runtime.llm import AUTO, LLM

    # the rule refuses an adaptive LLM; each setting then verifies blocks of its own size, up to the largest
    fixed = max(config.block_sizes) if rule == "drafter" else None
    if config.bundle:
        # room for the prompt and the answer, unless the bundle's graphs fix the capacity (slots-trt)
        llm = LLM.from_bundle(config.bundle, capacity=bundle_capacity(config.bundle) or 2 * config.max_tokens + 2048,
                              block_size=fixed, draft_rule=rule, prefix_caching=config.prefix_caching)
    else:
        target, draft = config.target or embedded.DEFAULT_TARGET, config.draft or AUTO
        llm = LLM(target=target, draft=draft, backend=config.backend or AUTO, capacity=2 * config.max_tokens + 2048,
                  block_size=fixed, draft_rule=rule, device=config.device, dtype=config.dtype,
                  prefix_caching=config.prefix_caching)
    if not llm.has_drafter:
        raise DFlashError(f"no drafter for target '{config.target}': pass --draft DIR")
    return llm


def backend_label(llm) -> str:
    """The backend, and for torch where its models run: "torch cuda bfloat16"."""
    if llm.backend != "torch":
        return llm.backend
    return f"torch {llm.device.type} {str(llm.dtype).removeprefix('torch.')}"


def _offline_settings(config: BenchConfig, llm, rule: str, name: str, prompts: list[str], temperature: float,
                      baselines: dict) -> list[SettingResult]:
    from dflash_trt.bench.offline import run_offline
    from dflash_trt.spec.sampling import SamplingParams

    params = SamplingParams(max_tokens=config.max_tokens, temperature=temperature, seed=config.seed)
    results = []
    for concurrency in config.concurrency:
        label = f"{name} T={temperature} C={concurrency}"
        key = name, temperature, concurrency
        if config.baseline and key not in baselines:
            base = run_offline(llm, prompts, params, False, None, f"{label} baseline", concurrency)
            baselines[key] = base, add_step_times(summarize(base[0], base[1], None), base[2])
        base, baseline = baselines.get(key, (None, None))
        for size in config.block_sizes:
            largest = size or llm.max_block_size
            records, wall, times = run_offline(llm, prompts, params, True, size,
                                               f"{label} B={size or 'auto'} {rule}", concurrency)
            result = SettingResult(
                mode="offline", backend=backend_label(llm), dataset=name, block_size=size,
                temperature=temperature, concurrency=concurrency, prompts=len(prompts),
                dflash=add_step_times(summarize(records, wall, largest), times), draft_rule=rule, baseline=baseline,
                outputs=[r.text for r in records], draft_vocab_size=llm.draft_vocab_size, max_block_size=largest,
            )
            results.append(compare(result, records, base[0] if base else None))
    return results


def run_server_bench(config: BenchConfig, prompt_sets: dict[str, list[str]],
                     api_key: str | None = None) -> list[SettingResult]:
    from dflash_trt.bench.server import connect, read_spec_counters, reset_prefix_cache, run_server, warm_up_server

    key = api_key or "none"  # sent as the bearer token to both servers; never written to the record
    endpoint = connect(config.base_url, config.model, key)
    baseline = connect(config.baseline_url, None, key) if config.baseline_url else None
    results = []
    for name, prompts in prompt_sets.items():
        for temperature in config.temperatures:
            for concurrency in config.concurrency:
                label = f"{name} T={temperature} C={concurrency}"
                servers = (endpoint, baseline) if baseline else (endpoint,)
                for server in servers:  # untimed, like offline
                    warm_up_server(server, prompts[:concurrency], temperature, config.seed, concurrency)
                reset = all([reset_prefix_cache(server) for server in servers])  # every one asked
                before = read_spec_counters(endpoint)
                records, wall = run_server(endpoint, prompts, config.max_tokens, temperature, config.seed, concurrency, label)
                after = read_spec_counters(endpoint)
                reported = [tau for r in records for tau in (r.acceptance_lengths or [])]
                side = summarize(records, wall, max(reported) if reported else None)
                if not reported and before and after and after[0] > before[0]:
                    side.mean_acceptance_length = 1 + (after[1] - before[1]) / (after[0] - before[0])
                base = None
                if baseline is not None:
                    base = run_server(baseline, prompts, config.max_tokens, temperature, config.seed, concurrency, f"{label} baseline")
                result = SettingResult(
                    mode="server", backend=endpoint.base_url, dataset=name, block_size=None,
                    temperature=temperature, concurrency=concurrency, prompts=len(prompts), dflash=side,
                    baseline=summarize(base[0], base[1], None) if base else None,
                    outputs=[r.text for r in records], prefix_cache_reset=reset,
                )
                results.append(compare(result, records, base[0] if base else None))
    return results


def run_bench(config: BenchConfig, api_key: str | None = None) -> list[SettingResult]:
    """Every setting of `config`; `api_key`: the servers' bearer token (server mode), kept out of the config
    so that no record carries it."""
    config.check()
    prompt_sets = load_prompt_sets(config)
    if config.mode == "server":
        return run_server_bench(config, prompt_sets, api_key)
    return run_offline_bench(config, prompt_sets)

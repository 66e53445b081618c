"""Bench output: the terminal table, the JSON record (config, versions, hardware), the plot."""

from __future__ import annotations

import datetime
import json
import os
import platform
from dataclasses import asdict
from importlib import metadata
from pathlib import Path

from dflash_trt.bench import datasets
from dflash_trt.bench.run import BenchConfig, SettingResult

SCHEMA = Path(__file__).resolve().parent / "schema.json"
SCHEMA_VERSION = 1
PACKAGES = ("dflash-trt", "torch", "transformers", "onnxruntime", "tensorrt", "openai")


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def environment() -> dict:
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    gpu = None
    try:
        import torch

        if torch.cuda.is_available():
            gpu = torch.cuda.get_device_name(0)
        threads = torch.get_num_threads()
    except ImportError:
        threads = None
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30 if hasattr(os, "sysconf") else None
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "torch_threads": threads,
        "memory_gib": round(memory, 1) if memory else None,
        "gpu": gpu,
        "packages": versions,
    }


def record_sources(config: BenchConfig) -> dict[str, str]:
    """Where each prompt set came from (which source stood in for GSM8K / MATH500)."""
    names = list(config.datasets) + ([f"file:{config.prompts_file.stem}"] if config.prompts_file else [])
    return {name: datasets.SOURCES.get(name, f"user prompts: {config.prompts_file}") for name in names}


def record(config: BenchConfig, results: list[SettingResult], command: str | None = None) -> dict:
    """The JSON document (schema: bench/schema.json). `command`: the command line that made it."""
    return {
        "schema_version": SCHEMA_VERSION,
        "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "command": command,
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(config).items()} | {"mode": config.mode},
        "datasets": record_sources(config),
        "environment": environment(),
        "results": [r.to_dict() for r in results],
    }


def load_results(path: Path) -> list[SettingResult]:
    """The results of a saved record, checked against the schema first."""
    import jsonschema

    from dflash_trt.errors import DFlashError

    try:
        doc = json.loads(path.read_text())
        jsonschema.validate(doc, json.loads(SCHEMA.read_text()))
    except (json.JSONDecodeError, jsonschema.ValidationError) as err:
        raise DFlashError(f"{path} is not a dflash-trt bench record: {str(err).splitlines()[0]}") from None
    return [SettingResult.from_dict(r) for r in doc["results"]]


def _f(value: float | None, spec: str = ".1f", suffix: str = "") -> str:
    return "-" if value is None else f"{value:{spec}}{suffix}"


def _check(result: SettingResult) -> str:
    if result.mismatches is None:
        return "-"
    return "identical" if not result.mismatches else f"MISMATCH x{len(result.mismatches)}"


def block_label(result: SettingResult) -> str:
    """The block size, and the draft rule where it is not point mass ("4 drafter": drafts drawn from q)."""
    if result.block_size is None:
        return "server"
    label = f"auto≤{result.max_block_size}" if result.block_size == 0 else str(result.block_size)
    return f"{label} drafter" if result.draft_rule == "drafter" else label


def table(results: list[SettingResult]) -> str:
    head = ("| dataset | B | T | C | n | τ | base tok/s | DFlash tok/s | speedup | base decode | DFlash decode "
            "| decode speedup | draft ms | verify ms | other ms | overhead % | cached prompt tok | greedy check |")
    rows = [head, "|" + "---|" * 18]
    for r in results:
        d, b = r.dflash, r.baseline
        rows.append(" | ".join([
            f"| {r.dataset}", block_label(r), f"{r.temperature:g}", str(r.concurrency),
            str(r.prompts), _f(d.mean_acceptance_length, ".2f"), _f(b.tokens_per_s if b else None),
            _f(d.tokens_per_s), _f(r.speedup, ".2f", "x"), _f(b.decode_tokens_per_s if b else None),
            _f(d.decode_tokens_per_s), _f(r.decode_speedup, ".2f", "x"), _f(d.draft_ms_per_step, ".1f"),
            _f(d.verify_ms_per_step, ".1f"), _f(d.other_ms_per_step, ".1f"), _f(d.overhead_pct, ".1f"),
            "-" if d.cached_tokens is None else str(d.cached_tokens), _check(r),
        ]) + " |")
    return "\n".join(rows)


def acceptance_lines(results: list[SettingResult], positions: int = 8) -> str:
    """Where drafts stop being accepted: τ histogram and acceptance rate at the first block slots."""
    lines = []
    for r in results:
        d = r.dflash
        if not d.histogram:
            continue
        hist = " ".join(f"{tau}:{count}" for tau, count in d.histogram.items() if count)
        rates = " ".join(f"{rate:.2f}" for rate in d.acceptance_rate_per_position[:positions])
        lines.append(f"{r.dataset} B={block_label(r)} T={r.temperature:g} C={r.concurrency}: τ histogram {hist} | accepted at slot 1..{positions}: {rates}")
    return "\n".join(lines)


def plot(results: list[SettingResult], path: Path) -> None:
    """Throughput and speedup vs concurrency per setting, and the τ histograms."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on servers and CI
    import matplotlib.pyplot as plt

    fig, (ax_tps, ax_speed, ax_hist) = plt.subplots(1, 3, figsize=(16, 4.5))
    if len({r.concurrency for r in results}) == 1:
        _bars(ax_tps, ax_speed, results)  # one concurrency: lines would be single dots
    else:
        _lines(ax_tps, ax_speed, results)
    for r in results:
        if r.dflash.histogram and r.concurrency == min(x.concurrency for x in results):
            taus = list(r.dflash.histogram)
            total = sum(r.dflash.histogram.values())
            ax_hist.plot(taus, [c / total for c in r.dflash.histogram.values()], marker=".",
                         label=_label(r))
    ax_speed.axhline(1.0, color="grey", linewidth=0.8)
    ax_hist.set(title="acceptance length per verify step", xlabel="τ (bonus included)", ylabel="share of steps")
    for ax in (ax_tps, ax_speed, ax_hist):
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _label(r: SettingResult) -> str:
    return f"{r.dataset} B={block_label(r)} T={r.temperature:g}"


def _lines(ax_tps, ax_speed, results: list[SettingResult]) -> None:
    """Throughput and speedup against concurrency, one line per (dataset, block size, temperature)."""
    series: dict[tuple, list[SettingResult]] = {}
    for r in results:
        series.setdefault((r.dataset, r.block_size, r.temperature), []).append(r)
    for rows in series.values():
        rows.sort(key=lambda r: r.concurrency)
        xs = [r.concurrency for r in rows]
        line, = ax_tps.plot(xs, [r.dflash.tokens_per_s for r in rows], marker="o", label=f"{_label(rows[0])} DFlash")
        if all(r.baseline for r in rows):
            ax_tps.plot(xs, [r.baseline.tokens_per_s for r in rows], marker="x", linestyle="--",
                        color=line.get_color(), label=f"{_label(rows[0])} baseline")
        if all(r.speedup for r in rows):
            ax_speed.plot(xs, [r.speedup for r in rows], marker="o", label=_label(rows[0]))
    ax_tps.set(title="output throughput", xlabel="concurrency", ylabel="tokens/s")
    ax_speed.set(title="speedup over baseline", xlabel="concurrency", ylabel="x")


def _bars(ax_tps, ax_speed, results: list[SettingResult]) -> None:
    """Grouped bars per setting: DFlash vs baseline tokens/s, and the speedup."""
    xs = range(len(results))
    labels = [_label(r) for r in results]
    ax_tps.bar([x - 0.2 for x in xs], [r.dflash.tokens_per_s for r in results], 0.4, label="DFlash")
    ax_tps.bar([x + 0.2 for x in xs], [r.baseline.tokens_per_s if r.baseline else 0 for r in results], 0.4,
               label="baseline")
    ax_speed.bar(xs, [r.speedup or 0 for r in results], 0.6)
    for ax in (ax_tps, ax_speed):
        ax.set_xticks(list(xs), labels, rotation=30, ha="right", fontsize=7)
    concurrency = results[0].concurrency
    ax_tps.set(title=f"output throughput (concurrency {concurrency})", ylabel="tokens/s")
    ax_speed.set(title=f"speedup over baseline (concurrency {concurrency})", ylabel="x")


def write_json(doc: dict, path: Path) -> None:
    """Write next to the target, then rename: an interrupted run never leaves a truncated record."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(doc, indent=2) + "\n")
    tmp.replace(path)

"""vLLM's periodic stats lines in the server's log: every interval, from the engine's own counters (the
Prometheus text /metrics serves), its prompt and generation throughput, requests running and waiting, KV
cache usage and prefix cache hit rate, then the speculative decoding line (mean acceptance length,
accepted and drafted throughput, per-position acceptance). An idle interval logs nothing."""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable

from prometheus_client.parser import text_string_to_metric_families

STATS_INTERVAL_S = 10.0  # vLLM's default (VLLM_LOG_STATS_INTERVAL)
PER_POSITION = "vllm:spec_decode_num_accepted_tokens_per_pos_total"


def _read(text: str) -> dict:
    """Prometheus text -> {sample name: value summed over label sets}, and per position {k: accepted}."""
    values: dict = defaultdict(float)
    positions: dict[int, float] = defaultdict(float)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == PER_POSITION:
                positions[int(sample.labels["position"])] += sample.value
            else:
                values[sample.name] += sample.value
    values["positions"] = positions
    return values


class StatsLines:
    """Successive readings of the engine's counters -> the lines for the interval since the last one."""

    def __init__(self):
        self.last: tuple[dict, float] | None = None

    def lines(self, text: str, now: float) -> list[str]:
        """The interval's lines (none for the first reading, nor for an idle interval)."""
        current = _read(text)
        last, self.last = self.last, (current, now)
        if last is None:
            return []
        before, then = last
        seconds = max(now - then, 1e-9)

        def delta(name: str) -> float:
            return current[name] - before[name]

        prompt, generated = delta("vllm:prompt_tokens_total"), delta("vllm:generation_tokens_total")
        running, waiting = current["vllm:num_requests_running"], current["vllm:num_requests_waiting"]
        if not (prompt or generated or running or waiting):
            return []  # vLLM logs an idle interval at debug level only
        queries = delta("vllm:prefix_cache_queries_total")
        hit_rate = 100 * delta("vllm:prefix_cache_hits_total") / queries if queries else 0.0
        out = [f"Avg prompt throughput: {prompt / seconds:.1f} tokens/s, Avg generation throughput: "
               f"{generated / seconds:.1f} tokens/s, Running: {running:.0f} reqs, Waiting: {waiting:.0f} reqs, "
               f"KV cache usage: {100 * current['vllm:kv_cache_usage_perc']:.1f}%, Prefix cache hit rate: "
               f"{hit_rate:.1f}%"]
        drafts = delta("vllm:spec_decode_num_drafts_total")
        if drafts:
            drafted, accepted = delta("vllm:spec_decode_num_draft_tokens_total"), \
                delta("vllm:spec_decode_num_accepted_tokens_total")
            per_position = ", ".join(f"{(current['positions'][k] - before['positions'][k]) / drafts:.3f}"
                                     for k in sorted(current["positions"]))
            out.append(f"SpecDecoding metrics: Mean acceptance length: {1 + accepted / drafts:.2f}, Accepted "
                       f"throughput: {accepted / seconds:.2f} tokens/s, Drafted throughput: {drafted / seconds:.2f} "
                       f"tokens/s, Accepted: {accepted:.0f} tokens, Drafted: {drafted:.0f} tokens, Per-position "
                       f"acceptance rate: {per_position}, Avg Draft acceptance rate: "
                       f"{100 * accepted / drafted if drafted else 0.0:.1f}%")
        return out


async def log_stats(metrics: Callable[[], Awaitable[str]], say: Callable[[str], None], interval: float) -> None:
    """Every `interval` seconds, say the lines of the interval (until cancelled). A reading that fails
    is said once per failure, and the next interval spans from the last good reading."""
    stats = StatsLines()
    while True:
        try:
            text = await metrics()
        except Exception as err:  # the engine's metrics are unreachable: say so, try again next interval
            say(f"stats: cannot read the engine's metrics ({type(err).__name__}: {err})")
        else:
            for line in stats.lines(text, time.monotonic()):
                say(line)
        await asyncio.sleep(interval)

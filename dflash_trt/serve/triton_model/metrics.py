"""The engine's metrics as Triton custom metrics (pb_utils.MetricFamily), with vLLM's names.

Counters carry their `_total` suffix in the name: Triton prints family names as given, and
Prometheus readers (ours in bench/server.py, vLLM dashboards) look for `..._total` samples.
Per-request counters move when a request finishes, before its last response is sent, so a client
that has its reply can read the counters it moved; the gauges follow engine.stats(). A request's
inter-token latencies (one per step that gave it tokens) are observed by the poller thread, not on the
engine's: each observation is a call into Triton, and a long reply has hundreds.
"""

from __future__ import annotations

import threading

COUNTERS = {  # family -> (help, key in a finished request's metrics)
    "vllm:prompt_tokens_total": ("Prompt tokens processed.", "prompt_tokens"),
    "vllm:prefix_cache_queries_total": ("Prompt tokens looked up in the prefix cache.", "prompt_tokens"),
    "vllm:prefix_cache_hits_total": ("Prompt tokens found there (a finished request's KV slot held them).",
                                     "cached_tokens"),
    "vllm:generation_tokens_total": ("Generated tokens.", "output_tokens"),
    "vllm:spec_decode_num_drafts_total": ("Speculative verify steps (drafts).", "num_drafts"),
    "vllm:spec_decode_num_draft_tokens_total": ("Draft tokens proposed.", "num_draft_tokens"),
    "vllm:spec_decode_num_accepted_tokens_total": ("Draft tokens accepted.", "num_accepted_tokens"),
    "vllm:num_preemptions_total": ("Preemptions: a running request gave its KV slot to one of a higher priority "
                                   "(scheduling policy priority).", "num_preemptions"),
}
PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
SUCCESS = "vllm:request_success_total"
GAUGES = {
    "vllm:num_requests_running": ("Requests holding a slot.", "running"),
    "vllm:num_requests_waiting": ("Requests waiting for a slot.", "waiting"),
    "vllm:kv_cache_usage_perc": ("KV cache usage, 0 to 1: the share of KV slots running requests hold.",
                                 "kv_cache_usage"),
}
SECONDS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0]
TOKENS = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000]
HISTOGRAMS = {  # family -> (help, key, buckets)
    "vllm:time_to_first_token_seconds": ("Time to first token.", "time_to_first_token_s", SECONDS),
    "vllm:time_per_output_token_seconds": ("Time per output token after the first.", "time_per_output_token_s", SECONDS),
    "vllm:e2e_request_latency_seconds": ("Request latency, arrival to last token.", "e2e_latency_s", SECONDS),
    "vllm:request_time_per_output_token_seconds": ("A request's mean time per output token after the first.",
                                                   "time_per_output_token_s", SECONDS),
    "vllm:request_queue_time_seconds": ("Time a request waited for a KV slot.", "queue_time_s", SECONDS),
    "vllm:request_prefill_time_seconds": ("Time from a request's first step to its first token.", "prefill_time_s",
                                          SECONDS),
    "vllm:request_decode_time_seconds": ("Time from a request's first token to its last.", "decode_time_s", SECONDS),
    "vllm:request_inference_time_seconds": ("Time from a request's first step to its last token.",
                                            "inference_time_s", SECONDS),
    "vllm:request_prompt_tokens": ("Prompt tokens per request.", "prompt_tokens", TOKENS),
    "vllm:request_generation_tokens": ("Generated tokens per request.", "output_tokens", TOKENS),
}


ITL = "vllm:inter_token_latency_seconds"


class EngineMetrics:
    def __init__(self, pb_utils, model_name: str):
        self.labels = {"model_name": model_name}
        kind = pb_utils.MetricFamily
        self.families = []  # a family must outlive its metrics (Triton refuses updates otherwise)

        def family(name, help_text, kind_value):
            self.families.append(kind(name=name, description=help_text, kind=kind_value))
            return self.families[-1]

        self.counters = [(key, family(name, text, kind.COUNTER).Metric(labels=self.labels))
                         for name, (text, key) in COUNTERS.items()]  # two families may count one key
        self.per_pos_family = family(PER_POS, "Draft tokens accepted, by position in the block.", kind.COUNTER)
        self.per_pos = []  # one metric per block position, made as positions first appear
        self.success = family(SUCCESS, "Finished requests, by finish reason.", kind.COUNTER)
        self.by_reason = {}
        self.gauge = {key: family(name, text, kind.GAUGE).Metric(labels=self.labels)
                      for name, (text, key) in GAUGES.items()}
        self.histograms = [(key, family(name, text, kind.HISTOGRAM).Metric(labels=self.labels, buckets=buckets))
                           for name, (text, key, buckets) in HISTOGRAMS.items()]  # two may observe one key
        self.itl = family(ITL, "Time between the steps that give a request tokens.", kind.HISTOGRAM).Metric(
            labels=self.labels, buckets=SECONDS)
        self.gaps: list[float] = []  # inter-token latencies not yet observed
        self.gaps_lock = threading.Lock()

    def finished(self, metrics: dict | None, reason: str) -> None:
        metrics = metrics or {}
        for key, counter in self.counters:
            if metrics.get(key):
                counter.increment(metrics[key])
        for k, count in enumerate(metrics.get("accepted_per_position") or []):
            if k == len(self.per_pos):
                self.per_pos.append(self.per_pos_family.Metric(labels={**self.labels, "position": str(k)}))
            if count:
                self.per_pos[k].increment(count)
        if reason not in self.by_reason:
            self.by_reason[reason] = self.success.Metric(labels={**self.labels, "finished_reason": reason})
        self.by_reason[reason].increment(1)
        for key, histogram in self.histograms:
            if metrics.get(key) is not None:
                histogram.observe(metrics[key])

    def later(self, gaps: list[float]) -> None:
        """A finished request's inter-token latencies, observed by the next `flush`."""
        with self.gaps_lock:
            self.gaps.extend(gaps)

    def flush(self) -> None:
        with self.gaps_lock:
            gaps, self.gaps = self.gaps, []
        for gap in gaps:
            self.itl.observe(gap)

    def gauges(self, stats: dict) -> None:
        for key, gauge in self.gauge.items():
            gauge.set(stats[key])

"""The Triton model's metrics, over a stand-in for pb_utils.MetricFamily: names, labels, amounts."""

from dflash_trt.serve.triton_model.metrics import EngineMetrics


class FakeMetricFamily:
    COUNTER, GAUGE, HISTOGRAM = "counter", "gauge", "histogram"
    families = {}

    def __init__(self, name, description, kind):
        self.name, self.kind, self.metrics = name, kind, {}
        FakeMetricFamily.families[name] = self

    def Metric(self, labels, buckets=None):  # noqa: N802 (pb_utils' spelling)
        metric = FakeMetric(self.kind, buckets)
        self.metrics[tuple(sorted(labels.items()))] = metric
        return metric


class FakeMetric:
    def __init__(self, kind, buckets):
        self.kind, self.buckets, self.value, self.observed = kind, buckets, 0, []

    def increment(self, amount):
        assert self.kind == "counter" and amount >= 0
        self.value += amount

    def set(self, value):
        assert self.kind == "gauge"
        self.value = value

    def observe(self, value):
        assert self.kind == "histogram" and self.buckets
        self.observed.append(value)


class FakePbUtils:
    MetricFamily = FakeMetricFamily


def value(name, **labels):
    family = FakeMetricFamily.families[name]
    return family.metrics[tuple(sorted({"model_name": "tiny", **labels}.items()))]


def test_a_finished_request_moves_the_vllm_counters():
    FakeMetricFamily.families = {}
    metrics = EngineMetrics(FakePbUtils, "tiny")
    finished = {"prompt_tokens": 7, "cached_tokens": 4, "output_tokens": 5, "num_drafts": 3, "num_draft_tokens": 9,
                "num_accepted_tokens": 2, "accepted_per_position": [2, 0, 0], "time_to_first_token_s": 0.1,
                "time_per_output_token_s": 0.02, "e2e_latency_s": 0.2, "queue_time_s": 0.03, "prefill_time_s": 0.07,
                "decode_time_s": 0.1, "inference_time_s": 0.17}
    metrics.finished(finished, "length")
    metrics.finished({**finished, "time_per_output_token_s": None}, "abort")
    assert value("vllm:prompt_tokens_total").value == 14
    assert value("vllm:prefix_cache_queries_total").value == 14 and value("vllm:prefix_cache_hits_total").value == 8
    assert value("vllm:generation_tokens_total").value == 10
    assert value("vllm:spec_decode_num_drafts_total").value == 6
    assert value("vllm:spec_decode_num_draft_tokens_total").value == 18
    assert value("vllm:spec_decode_num_accepted_tokens_total").value == 4
    assert value("vllm:spec_decode_num_accepted_tokens_per_pos_total", position="0").value == 4
    assert value("vllm:spec_decode_num_accepted_tokens_per_pos_total", position="2").value == 0
    assert value("vllm:request_success_total", finished_reason="abort").value == 1
    assert value("vllm:time_to_first_token_seconds").observed == [0.1, 0.1]
    assert value("vllm:time_per_output_token_seconds").observed == [0.02]
    assert value("vllm:request_time_per_output_token_seconds").observed == [0.02]  # vLLM's newer name
    assert [value(f"vllm:request_{phase}_time_seconds").observed for phase in ("queue", "prefill", "decode",
                                                                                 "inference")] == [
        [0.03] * 2, [0.07] * 2, [0.1] * 2, [0.17] * 2]
    assert value("vllm:request_prompt_tokens").observed == [7, 7]
    metrics.gauges({"running": 3, "waiting": 1, "kv_cache_usage": 0.75})
    assert value("vllm:num_requests_running").value == 3 and value("vllm:num_requests_waiting").value == 1
    assert value("vllm:kv_cache_usage_perc").value == 0.75
    # counters end in _total (Prometheus readers look for it); the rest do not
    for name, family in FakeMetricFamily.families.items():
        assert name.startswith("vllm:") and name.endswith("_total") == (family.kind == "counter")


def test_inter_token_latencies_are_observed_when_the_poller_flushes():
    FakeMetricFamily.families = {}
    metrics = EngineMetrics(FakePbUtils, "tiny")
    metrics.later([0.01, 0.02])
    metrics.later([0.03])
    assert value("vllm:inter_token_latency_seconds").observed == []  # not on the engine's thread
    metrics.flush()
    metrics.flush()
    assert value("vllm:inter_token_latency_seconds").observed == [0.01, 0.02, 0.03]

"""vLLM's periodic stats lines (serve/stats_log.py) from the engine's Prometheus counters: figures worked
out by hand from the counters below."""

import asyncio

from dflash_trt.serve.stats_log import StatsLines, log_stats


def counters(prompt, generated, running, waiting, kv, queries, hits, drafts, drafted, accepted, per_position):
    """The engine's /metrics text, its samples split over two label sets where a counter may be."""
    lines = [f'vllm:prompt_tokens_total{{model_name="m",engine="0"}} {prompt - 1}',
             'vllm:prompt_tokens_total{model_name="m",engine="1"} 1',
             f'vllm:generation_tokens_total{{model_name="m"}} {generated}',
             f'vllm:num_requests_running{{model_name="m"}} {running}',
             f'vllm:num_requests_waiting{{model_name="m"}} {waiting}',
             f'vllm:kv_cache_usage_perc{{model_name="m"}} {kv}',
             f'vllm:prefix_cache_queries_total{{model_name="m"}} {queries}',
             f'vllm:prefix_cache_hits_total{{model_name="m"}} {hits}',
             f'vllm:spec_decode_num_drafts_total{{model_name="m"}} {drafts}',
             f'vllm:spec_decode_num_draft_tokens_total{{model_name="m"}} {drafted}',
             f'vllm:spec_decode_num_accepted_tokens_total{{model_name="m"}} {accepted}']
    lines += [f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{model_name="m",position="{k}"}} {n}'
              for k, n in enumerate(per_position)]
    typed = []
    for line in lines:
        name = line.split("{")[0]
        kind = "counter" if name.endswith("_total") else "gauge"
        typed += [f"# TYPE {name.removesuffix('_total')} {kind}", line]
    return "\n".join(typed) + "\n"


def test_an_interval_s_lines_are_vllms_figures_over_it():
    stats = StatsLines()
    assert stats.lines(counters(100, 50, 1, 0, 0.25, 100, 0, 10, 30, 12, [7, 4, 1]), now=5.0) == []  # a first reading
    lines = stats.lines(counters(300, 250, 2, 1, 0.5, 200, 40, 60, 180, 112, [47, 34, 31]), now=15.0)
    assert lines == [
        "Avg prompt throughput: 20.0 tokens/s, Avg generation throughput: 20.0 tokens/s, Running: 2 reqs, Waiting: "
        "1 reqs, KV cache usage: 50.0%, Prefix cache hit rate: 40.0%",
        "SpecDecoding metrics: Mean acceptance length: 3.00, Accepted throughput: 10.00 tokens/s, Drafted "
        "throughput: 15.00 tokens/s, Accepted: 100 tokens, Drafted: 150 tokens, Per-position acceptance rate: "
        "0.800, 0.600, 0.600, Avg Draft acceptance rate: 66.7%"]
    # idle: nothing came, nothing runs or waits
    assert stats.lines(counters(300, 250, 0, 0, 0.0, 200, 40, 60, 180, 112, [47, 34, 31]), now=25.0) == []
    # plain decoding (no drafts in the interval): the first line only, no prefix lookups: 0 %
    assert stats.lines(counters(300, 270, 1, 0, 0.25, 200, 40, 60, 180, 112, [47, 34, 31]), now=35.0) == [
        "Avg prompt throughput: 0.0 tokens/s, Avg generation throughput: 2.0 tokens/s, Running: 1 reqs, Waiting: "
        "0 reqs, KV cache usage: 25.0%, Prefix cache hit rate: 0.0%"]


def test_a_reading_that_fails_is_said_and_the_next_interval_spans_from_the_last_good_one():
    readings = [counters(0, 0, 0, 0, 0.0, 0, 0, 0, 0, 0, []), ConnectionError("refused"),
                counters(10, 4, 1, 0, 0.25, 10, 0, 0, 0, 0, [])]  # the last one stays
    said: list[str] = []

    async def metrics():
        reading = readings.pop(0) if len(readings) > 1 else readings[0]
        if isinstance(reading, Exception):
            raise reading
        return reading

    async def run():
        task = asyncio.ensure_future(log_stats(metrics, said.append, 0.001))
        while len(said) < 2:
            await asyncio.sleep(0.001)
        task.cancel()

    asyncio.run(run())
    assert said[0] == "stats: cannot read the engine's metrics (ConnectionError: refused)"
    # from the first reading to the third: 10 prompt and 4 generated tokens
    assert said[1].startswith("Avg prompt throughput: ") and "Running: 1 reqs" in said[1]
    assert not said[1].startswith("Avg prompt throughput: 0.0")

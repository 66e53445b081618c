"""Server mode: the same prompts against any OpenAI-compatible server (ours, vLLM, SGLang, ...).

Requests are streamed chat completions so that time to first token is measured the same way as
offline. `concurrency` requests are kept in flight. Acceptance comes from the server when it says:
per request in `usage.acceptance_lengths` (dflash-trt's server), or from vLLM's Prometheus counters
(`vllm:spec_decode_num_drafts_total`, `..._num_accepted_tokens_total`) read before and after.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass

from tqdm import tqdm

from dflash_trt.bench.summary import RequestRecord
from dflash_trt.errors import DFlashError

VLLM_DRAFTS = "vllm:spec_decode_num_drafts"
VLLM_ACCEPTED = "vllm:spec_decode_num_accepted_tokens"


@dataclass(frozen=True)
class Endpoint:
    base_url: str  # ends in /v1
    model: str
    api_key: str = "none"

    @property
    def metrics_url(self) -> str:
        return self.base_url.rstrip("/").removesuffix("/v1") + "/metrics"


def _client(base_url: str, api_key: str):
    try:
        from openai import OpenAI
    except ImportError as exc:
        raise DFlashError("server mode needs the openai client: pip install 'dflash-trt[bench]'") from exc
    return OpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=600)


def connect(base_url: str, model: str | None = None, api_key: str = "none") -> Endpoint:
    """Check the server answers and pick its model before any request is timed."""
    import openai

    try:
        served = [m.id for m in _client(base_url, api_key).models.list()]
    except openai.APIError as exc:
        raise DFlashError(f"cannot reach an OpenAI-compatible server at {base_url}: {exc}") from None
    if model is None:
        if not served:
            raise DFlashError(f"the server at {base_url} lists no models; pass --model NAME")
        model = served[0]
    elif model not in served:
        raise DFlashError(f"the server at {base_url} does not serve '{model}' (it serves: {', '.join(served)})")
    return Endpoint(base_url, model, api_key)


def _request(client, endpoint: Endpoint, prompt: str, max_tokens: int, temperature: float, seed: int) -> RequestRecord:
    import openai

    start = time.perf_counter()
    ttft, parts, usage = None, [], None
    try:
        stream = client.chat.completions.create(
            model=endpoint.model, messages=[{"role": "user", "content": prompt}], max_tokens=max_tokens,
            temperature=temperature, seed=seed, stream=True, stream_options={"include_usage": True},
        )
        for chunk in stream:
            if chunk.usage is not None:
                usage = chunk.usage
            for choice in chunk.choices:
                if choice.delta.content:
                    ttft = ttft if ttft is not None else time.perf_counter() - start
                    parts.append(choice.delta.content)
    except openai.APIError as exc:  # a failed request spoils the comparison: the run stops, saying why
        raise DFlashError(f"the server at {endpoint.base_url} failed a request: {exc}") from None
    latency = time.perf_counter() - start
    if usage is not None and usage.completion_tokens and not parts:
        # e.g. a reasoning server that streams only `reasoning_content`: two empty texts would
        # pass the greedy check while saying nothing about equality
        raise DFlashError(f"the server at {endpoint.base_url} returned {usage.completion_tokens} tokens but no "
                          "message content; the greedy check needs the text")
    if usage is None:
        raise DFlashError(f"the server at {endpoint.base_url} sent no usage (needs stream_options.include_usage)")
    extra = usage.model_extra or {}
    details = getattr(usage, "prompt_tokens_details", None)  # OpenAI's: the prompt tokens a prefix cache served
    return RequestRecord(text="".join(parts), output_tokens=usage.completion_tokens, latency_s=latency,
                         ttft_s=ttft, acceptance_lengths=extra.get("acceptance_lengths"),
                         cached_tokens=getattr(details, "cached_tokens", None))


def run_server(endpoint: Endpoint, prompts: list[str], max_tokens: int, temperature: float, seed: int,
               concurrency: int, desc: str) -> tuple[list[RequestRecord], float]:
    client = _client(endpoint.base_url, endpoint.api_key)
    records: list[RequestRecord | None] = [None] * len(prompts)
    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=concurrency) as pool, tqdm(total=len(prompts), desc=desc, unit="prompt", leave=False) as bar:
        futures = {
            pool.submit(_request, client, endpoint, prompt, max_tokens, temperature, seed): index
            for index, prompt in enumerate(prompts)
        }
        for future in as_completed(futures):
            records[futures[future]] = future.result()
            bar.update()
    return records, time.perf_counter() - start


def warm_up_server(endpoint: Endpoint, prompts: list[str], temperature: float, seed: int, concurrency: int) -> None:
    """The first C prompts once, short and untimed: servers compile, allocate and fill caches lazily."""
    run_server(endpoint, prompts, 8, temperature, seed, concurrency, "warm-up")


RESETS = ("/reset_prefix_cache", "/flush_cache")  # vLLM's (in its dev mode) and dflash-trt's; SGLang's


def reset_prefix_cache(endpoint: Endpoint) -> bool:
    """Ask the server to forget the prompts its prefix cache holds (so that the timed requests prefill as
    they would arriving first): True if one of RESETS answered 200."""
    from urllib.error import URLError
    from urllib.request import Request, urlopen

    root = endpoint.base_url.rstrip("/").removesuffix("/v1")
    headers = {} if endpoint.api_key == "none" else {"Authorization": f"Bearer {endpoint.api_key}"}
    for path in RESETS:
        try:
            with urlopen(Request(root + path, data=b"", headers=headers, method="POST"), timeout=60) as response:
                if response.status == 200:
                    return True
        except (URLError, OSError):  # not served there (an HTTP error is a URLError): the next name
            continue
    return False


def read_spec_counters(endpoint: Endpoint) -> tuple[float, float] | None:
    """(drafts, accepted tokens) from vLLM-style Prometheus counters, or None if not exposed."""
    from urllib.error import URLError
    from urllib.request import Request, urlopen

    from prometheus_client.parser import text_string_to_metric_families

    headers = {} if endpoint.api_key == "none" else {"Authorization": f"Bearer {endpoint.api_key}"}
    try:
        with urlopen(Request(endpoint.metrics_url, headers=headers), timeout=10) as response:
            text = response.read().decode()
    except (URLError, OSError):  # no /metrics (HTTP 404 is a URLError): acceptance stays unknown
        return None
    # Match samples, not families: exporters differ in whether the TYPE line carries "_total".
    totals = {VLLM_DRAFTS: 0.0, VLLM_ACCEPTED: 0.0}
    seen = set()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name = sample.name.removesuffix("_total")
            if name in totals and sample.name.endswith("_total"):
                seen.add(name)
                totals[name] += sample.value
    return (totals[VLLM_DRAFTS], totals[VLLM_ACCEPTED]) if seen == set(totals) else None

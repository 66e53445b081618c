"""Server mode against small local OpenAI-compatible stubs: concurrency, usage, acceptance, the check."""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from dflash_trt.bench.run import BenchConfig, run_bench
from dflash_trt.bench.server import RESETS
from dflash_trt.errors import DFlashError

pytest.importorskip("openai", reason="server mode needs the bench extra: pip install 'dflash-trt[bench]'")


class Stub:
    """Answers each chat completion with the prompt's first words, streamed one word per chunk.

    `acceptance`: per-request τ list put in usage (what dflash-trt's server reports);
    `vllm_counters`: expose vLLM-style spec-decode counters on /metrics instead;
    `together`: hold each request until that many are in flight (a barrier, so concurrency is
    shown without relying on timing; a client that never sends that many fails its requests).
    """

    def __init__(self, acceptance=None, vllm_counters=False, suffix="", content=True, together=None, reset=None,
                 fail=None):
        self.acceptance, self.vllm_counters, self.suffix = acceptance, vllm_counters, suffix
        self.fail = fail  # "status": a 500 error object; "stream": a first word, then an error event
        self.reset = reset  # the path of its prefix cache reset (None: none, a 404)
        self.log = []  # the POSTs' paths, in order
        self.content = content  # False: stream usage but no message text (as a reasoning-only server)
        self.in_flight = self.max_in_flight = self.requests = 0
        self.drafts = self.accepted = 0
        self.authorization = set()  # every Authorization header seen
        self.lock = threading.Lock()
        self.barrier = threading.Barrier(together) if together else None
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _send(self, body: bytes, kind: str):
                self.send_response(200)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                stub.authorization.add(self.headers.get("Authorization"))
                if self.path == "/v1/models":
                    self._send(json.dumps({"object": "list", "data": [{"id": "stub", "object": "model",
                                                                       "created": 0, "owned_by": "t"}]}).encode(), "application/json")
                elif self.path == "/metrics" and stub.vllm_counters:
                    text = ("# TYPE vllm:spec_decode_num_drafts counter\n"
                            f'vllm:spec_decode_num_drafts_total{{model_name="stub"}} {stub.drafts}\n'
                            "# TYPE vllm:spec_decode_num_accepted_tokens_total counter\n"
                            f'vllm:spec_decode_num_accepted_tokens_total{{model_name="stub"}} {stub.accepted}\n')
                    self._send(text.encode(), "text/plain")
                else:
                    self.send_error(404)

            def do_POST(self):
                stub.authorization.add(self.headers.get("Authorization"))
                stub.log.append(self.path)
                if self.path != "/v1/chat/completions":
                    self._send(b"", "text/plain") if self.path == stub.reset else self.send_error(404)
                    return
                request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                error = {"error": {"message": "internal error: the target's logits gave no token", "type": "server_error"}}
                if stub.fail == "status":
                    self.send_response(500)
                    body = json.dumps(error).encode()
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                    return
                with stub.lock:
                    stub.in_flight += 1
                    stub.requests += 1
                    stub.max_in_flight = max(stub.max_in_flight, stub.in_flight)
                if stub.barrier:
                    stub.barrier.wait(timeout=10)
                words = request["messages"][0]["content"].split()[: request["max_tokens"]]
                words[-1] += stub.suffix
                chunks = [{"choices": [{"index": 0, "delta": {"content": w + " "}, "finish_reason": None}]}
                          for w in words if stub.content]
                usage = {"prompt_tokens": 5, "completion_tokens": len(words), "total_tokens": 5 + len(words)}
                if stub.acceptance:
                    usage["acceptance_lengths"] = stub.acceptance
                chunks.append({"choices": [], "usage": usage})
                if stub.fail == "stream":
                    chunks[1:] = [error]
                body = "".join(
                    "data: " + json.dumps({"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "stub", **c}) + "\n\n"
                    for c in chunks) + "data: [DONE]\n\n"
                with stub.lock:
                    stub.in_flight -= 1
                    stub.drafts += 4
                    stub.accepted += 6  # τ = 1 + 6/4 = 2.5 per request
                self._send(body.encode(), "text/event-stream")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def stubs():
    made = []

    def make(**kwargs):
        made.append(Stub(**kwargs))
        return made[-1]

    yield make
    for stub in made:
        stub.close()


def test_concurrency_usage_acceptance_and_the_check(stubs):
    dflash, baseline = stubs(acceptance=[3, 1, 4]), stubs()
    config = BenchConfig(base_url=dflash.url, baseline_url=baseline.url, datasets=("mt-bench",), num_prompts=6,
                         max_tokens=8, concurrency=(1, 3))
    one, three = run_bench(config)
    # each level is warmed up first with its first C prompts, untimed: (1 + 6) + (3 + 6)
    assert dflash.requests == baseline.requests == 16 and dflash.max_in_flight <= 3
    for result in (one, three):
        assert result.mode == "server" and result.dflash.requests == 6
        assert result.dflash.mean_acceptance_length == pytest.approx(8 / 3)
        assert result.dflash.histogram == {1: 6, 2: 0, 3: 6, 4: 6}
        assert result.mismatches == [] and result.speedup is not None
        assert result.dflash.mean_ttft_s is not None and result.dflash.decode_tokens_per_s is not None
    assert (one.concurrency, three.concurrency) == (1, 3)


def test_requests_really_run_concurrently(stubs):
    server = stubs(together=3)  # every request waits until three are in flight
    (result,) = run_bench(BenchConfig(base_url=server.url, datasets=("mt-bench",), num_prompts=6, max_tokens=4,
                                      concurrency=(3,)))
    assert server.requests == 3 + 6 and server.max_in_flight == 3 and result.dflash.requests == 6


def test_output_tokens_come_from_usage(stubs):
    from dflash_trt.bench.datasets import load_prompts

    server = stubs()
    (result,) = run_bench(BenchConfig(base_url=server.url, datasets=("mt-bench",), num_prompts=3, max_tokens=5))
    expected = sum(min(5, len(p.split())) for p in load_prompts("mt-bench", 3))
    assert result.dflash.output_tokens == expected and result.baseline is None and result.mismatches is None


def test_vllm_counters_give_the_mean_acceptance(stubs):
    server = stubs(vllm_counters=True)
    (result,) = run_bench(BenchConfig(base_url=server.url, datasets=("humaneval",), num_prompts=2, max_tokens=4))
    assert result.dflash.mean_acceptance_length == pytest.approx(2.5)


def test_a_wrong_server_output_is_flagged(stubs):
    dflash, baseline = stubs(suffix="?"), stubs()
    (result,) = run_bench(BenchConfig(base_url=dflash.url, baseline_url=baseline.url, datasets=("mt-bench",),
                                      num_prompts=2, max_tokens=4))
    assert [m["request"] for m in result.mismatches] == [0, 1]


def test_unreachable_server_or_unknown_model_is_one_line(stubs):
    with pytest.raises(DFlashError, match="cannot reach an OpenAI-compatible server"):
        run_bench(BenchConfig(base_url="http://127.0.0.1:9/v1", datasets=("mt-bench",), num_prompts=1))
    server = stubs()
    with pytest.raises(DFlashError, match="does not serve 'other'"):
        run_bench(BenchConfig(base_url=server.url, model="other", datasets=("mt-bench",), num_prompts=1))


def test_a_reply_without_text_is_refused_not_counted_as_equal(stubs):
    silent = stubs(content=False)
    config = BenchConfig(base_url=silent.url, datasets=("mt-bench",), num_prompts=2, max_tokens=4, baseline=False)
    with pytest.raises(DFlashError, match="no message content"):
        run_bench(config)


def test_the_api_key_reaches_both_servers_and_no_record(stubs):
    from dflash_trt.bench import report

    dflash, baseline = stubs(acceptance=[2, 1]), stubs()
    config = BenchConfig(base_url=dflash.url, baseline_url=baseline.url, datasets=("mt-bench",), num_prompts=2,
                         max_tokens=4)
    results = run_bench(config, api_key="sk-secret-1")
    assert dflash.authorization == baseline.authorization == {"Bearer sk-secret-1"}
    assert "sk-secret-1" not in json.dumps(report.record(config, results))


@pytest.mark.parametrize("reset", ["/reset_prefix_cache", "/flush_cache", None])
def test_each_server_forgets_its_cached_prompts_after_the_warm_up_where_it_can(stubs, reset):
    """vLLM's /reset_prefix_cache, else SGLang's /flush_cache, asked between the warm-up and the timed
    requests; the record says whether every server did."""
    server, base = stubs(reset=reset), stubs(reset="/flush_cache")
    (result,) = run_bench(BenchConfig(datasets=("mt-bench",), num_prompts=3, max_tokens=4, concurrency=(2,),
                                      base_url=server.url, baseline_url=base.url))
    assert result.prefix_cache_reset is (reset is not None)
    asked = [path for path in server.log if path != "/v1/chat/completions"]
    assert asked == {"/reset_prefix_cache": ["/reset_prefix_cache"], "/flush_cache": list(RESETS),
                     None: list(RESETS)}[reset]
    first_timed = server.log.index(asked[-1]) + 1
    assert server.log[:first_timed - len(asked)] == ["/v1/chat/completions"] * 2  # the warm-up: first C prompts
    assert server.log[first_timed:] == ["/v1/chat/completions"] * 3
    assert base.log.count("/flush_cache") == 1


@pytest.mark.parametrize("fail", ["status", "stream"])
def test_a_failed_request_stops_the_run_with_one_line(stubs, fail):
    server = stubs(fail=fail)
    with pytest.raises(DFlashError, match="the server at .* failed a request: .*the target's logits gave no token"):
        run_bench(BenchConfig(base_url=server.url, datasets=("mt-bench",), num_prompts=2, max_tokens=4))

"""A soak of `dflash-trt serve` (a script, not a CI test): the embedded pair's slots bundle served with
--max-batch 16, N streaming clients for T seconds with random prompts, lengths, stop strings, seeds
and temperatures, a tenth of them leaving mid-stream. It records what a service owner asks of a
night under load: requests completed / left / refused / lost (must be 0) / 5xx (must be 0), greedy
replies equal to offline `LLM.generate` on the same bundle (a sample), the engine idle and the
processes' memory after the run against before, p50/p99 time to first token and inter-token
latency, and the aggregate output rate. Prints a summary; --json writes the record.

    python scripts/soak.py [--clients 64] [--seconds 300] [--max-batch 16] [--json docs/bench/soak-....json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from httpx_sse import aconnect_sse

sys.path.insert(0, str(Path(__file__).parents[1] / "tests" / "serve"))  # the tests' server starter, reused
from server_process import start_server  # noqa: E402

STOPS = ["\n\n", "return", ":", "."]


@dataclass
class Outcome:
    prompt: str
    params: dict
    kind: str = "lost"  # completed | left (the client hung up on purpose) | refused (4xx) | 5xx | lost
    text: str = ""
    finish_reason: str | None = None
    ttft_s: float | None = None
    gaps_s: list[float] = field(default_factory=list)
    error: str | None = None


def request_params(rng: random.Random) -> dict:
    params = {"max_tokens": rng.randint(8, 96), "temperature": 0}  # greedy: checked against offline decoding
    if rng.random() < 0.5:  # sampled: seeded, so a rerun can reproduce it
        params.update(temperature=round(rng.uniform(0.3, 1.2), 2), top_p=rng.choice([1.0, 0.9]), seed=rng.randrange(2**31))
    if rng.random() < 0.3:
        params["stop"] = [rng.choice(STOPS)]
    return params


async def one_request(http: httpx.AsyncClient, url: str, model: str, prompt: str, params: dict,
                      leave_after: int | None) -> Outcome:
    out = Outcome(prompt, params)
    body = {"model": model, "messages": [{"role": "user", "content": prompt}], "stream": True, **params}
    began = last = time.perf_counter()
    chunks = 0
    try:
        async with aconnect_sse(http, "POST", f"{url}/chat/completions", json=body) as source:
            status = source.response.status_code
            if status != 200:
                await source.response.aread()
                out.kind, out.error = ("5xx" if status >= 500 else "refused"), source.response.text[:200]
                return out
            async for event in source.aiter_sse():
                if event.data == "[DONE]":
                    out.kind = "completed"
                    return out
                data = json.loads(event.data)
                if "error" in data:
                    out.kind, out.error = "5xx", json.dumps(data)[:200]
                    return out
                for choice in data.get("choices", []):
                    content = choice.get("delta", {}).get("content")
                    if content:
                        now = time.perf_counter()
                        if out.ttft_s is None:
                            out.ttft_s = now - began
                        else:
                            out.gaps_s.append(now - last)
                        last = now
                        out.text += content
                        chunks += 1
                    out.finish_reason = choice.get("finish_reason") or out.finish_reason
                if leave_after is not None and chunks >= leave_after:
                    out.kind = "left"
                    return out  # leaving the context closes the connection: the server cancels
    except httpx.HTTPError as err:
        out.error = f"{type(err).__name__}: {err}"
    return out


async def soak(url: str, model: str, prompts: list[str], clients: int, seconds: float, seed: int,
               pids: list[int], memory: list[float]) -> list[Outcome]:
    """The clients' outcomes; `memory` gets the servers' RSS every tenth of the run (growth after the
    first samples would be a leak; the first steps grow buffers once)."""
    deadline = time.monotonic() + seconds
    outcomes: list[Outcome] = []

    async def sample():
        while time.monotonic() < deadline:
            memory.append(rss_mib(pids))
            await asyncio.sleep(seconds / 10)

    async def client(index: int):
        rng = random.Random(seed * 1000 + index)
        async with httpx.AsyncClient(timeout=httpx.Timeout(600, connect=10)) as http:
            while time.monotonic() < deadline:
                leave = rng.randint(1, 6) if rng.random() < 0.1 else None
                outcomes.append(await one_request(http, url, model, rng.choice(prompts), request_params(rng), leave))

    await asyncio.gather(sample(), *(client(i) for i in range(clients)))
    return outcomes


MEMORY_KINDS = {"private": ("RssAnon", "RssShmem"), "file": ("RssFile",)}


def rss_by_process(pids: list[int], kinds: tuple[str, ...] = ("VmRSS",)) -> dict[str, float]:
    """Resident memory of these processes and their children by process name, MiB (from /proc):
    VmRSS, or the sum of `kinds` (RssAnon, RssShmem: memory only the process holds; RssFile: pages
    of mapped files, such as the weights onnxruntime maps, clean and reclaimable)."""
    seen, found, stack = set(), {}, list(pids)
    while stack:
        pid = stack.pop()
        if pid in seen:
            continue
        seen.add(pid)
        try:
            status = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                          if ":" in line)
            name = status["Name"].strip()
            kib = sum(int(status.get(kind, "0 kB").split()[0]) for kind in kinds)
            found[name] = round(found.get(name, 0) + kib / 1024, 1)
            stack += [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
        except (FileNotFoundError, ProcessLookupError):
            continue
    return found


def rss_mib(pids: list[int], kinds: tuple[str, ...] = ("VmRSS",)) -> float:
    return round(sum(rss_by_process(pids, kinds).values()), 1)


def memory_kinds(pids: list[int]) -> dict[str, dict[str, float]]:
    """The private and file-backed resident memory by process, MiB."""
    return {kind: rss_by_process(pids, fields) for kind, fields in MEMORY_KINDS.items()}


def running(root: str) -> float:
    text = httpx.get(f"{root}/metrics", timeout=10).text
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith("vllm:num_requests_running"))


def percentile(values: list[float], q: float) -> float | None:
    return round(statistics.quantiles(values, n=100)[q - 1] * 1e3, 1) if len(values) >= 2 else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=300)
    parser.add_argument("--max-batch", type=int, default=16)
    parser.add_argument("--greedy-checks", type=int, default=48, help="greedy replies compared with offline")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rounds", type=int, default=1,
                        help="soak this many times against one server (each --seconds long, seeds differ), the "
                             "memory recorded after each: what a second round adds tells a leak from the "
                             "allocators' high-water marks, which the first round sets")
    parser.add_argument("--json")
    args = parser.parse_args()

    from dflash_trt import LLM, SamplingParams
    from dflash_trt.bench.datasets import load_prompts
    from dflash_trt.models import embedded
    from dflash_trt.runtime.bundles import cached_bundle

    target = embedded.DEFAULT_TARGET
    bundle = cached_bundle(target, str(embedded.default_drafter(target)))
    prompts = load_prompts("humaneval", 40) + load_prompts("mt-bench", 40)
    server = start_server([str(bundle), "--max-batch", str(args.max_batch)])
    try:
        pids = [server.process.pid]
        before, before_by, before_kinds = rss_mib(pids), rss_by_process(pids), memory_kinds(pids)
        wall = 0.0  # the clients' time only: the idle waits between rounds are not load
        memory: list[float] = []
        outcomes: list[Outcome] = []
        rounds = []
        for round_index in range(args.rounds):
            began = time.perf_counter()
            outcomes += asyncio.run(soak(server.url, server.model, prompts, args.clients, args.seconds,
                                         args.seed + round_index, pids, memory))
            wall += time.perf_counter() - began
            for _ in range(60):  # left streams are cancelled within a step or two
                if running(server.root) == 0:
                    break
                time.sleep(1)
            rounds.append({"requests": len(outcomes), "running_after": running(server.root),
                           "rss_mib_after": rss_mib(pids), "rss_mib_by_process_after": rss_by_process(pids),
                           "mib_by_kind_after": memory_kinds(pids)})
        last = rounds[-1]
        idle, after, after_by = last["running_after"], last["rss_mib_after"], last["rss_mib_by_process_after"]
    finally:
        server.stop()

    counts = {kind: sum(o.kind == kind for o in outcomes) for kind in ("completed", "left", "refused", "5xx", "lost")}
    greedy = [o for o in outcomes if o.kind == "completed" and o.params["temperature"] == 0]
    random.Random(args.seed).shuffle(greedy)
    llm = LLM.from_bundle(bundle)
    checked = greedy[: args.greedy_checks]
    offline = [llm.generate(o.prompt, SamplingParams(max_tokens=o.params["max_tokens"], stop=o.params.get("stop", ())))[0]
               for o in checked]
    mismatches = [o.prompt[:60] for o, want in zip(checked, offline, strict=True) if o.text != want.text]
    ttft = [o.ttft_s for o in outcomes if o.ttft_s is not None]
    gaps = [g for o in outcomes for g in o.gaps_s]
    record = {
        "command": " ".join(["python", "scripts/soak.py", *sys.argv[1:]]),
        "bundle": bundle.name, "clients": args.clients, "seconds": args.seconds, "rounds": args.rounds,
        "max_batch": args.max_batch,
        "requests": len(outcomes), **counts,
        "greedy_checked": len(checked), "greedy_equal_offline": len(checked) - len(mismatches), "mismatches": mismatches,
        "ttft_ms_p50": percentile(ttft, 50), "ttft_ms_p99": percentile(ttft, 99),
        "inter_token_ms_p50": percentile(gaps, 50), "inter_token_ms_p99": percentile(gaps, 99),
        "output_chars": sum(len(o.text) for o in outcomes), "wall_s": round(wall, 1),
        "chunks_per_s": round((len(gaps) + len(ttft)) / wall, 1),
        "running_after": idle, "rss_mib_before": before, "rss_mib_during": memory, "rss_mib_after": after,
        "rss_mib_by_process": {"before": before_by, "after": after_by},
        "mib_by_kind": {"before": before_kinds, "after": last["mib_by_kind_after"]},
        "private_mib_growth": round(sum(last["mib_by_kind_after"]["private"].values())
                                    - sum(before_kinds["private"].values()), 1),
        "by_round": rounds,
        "errors": sorted({o.error for o in outcomes if o.error})[:10],
    }
    print(json.dumps({k: v for k, v in record.items() if k != "errors"}, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(record, indent=2) + "\n")
    ok = counts["lost"] == 0 and counts["5xx"] == 0 and not mismatches and idle == 0
    if not ok:  # what serve printed, beside the record (tritonserver's own log dies with its workdir)
        print("\n".join(server.output[-50:]), file=sys.stderr)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()

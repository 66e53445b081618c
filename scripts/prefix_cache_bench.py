"""Prefix caching, measured: what a request that starts with a finished request's tokens saves.

Two workloads through one LLM's C++ core, each with prefix caching on and then off, on the same prompts:
- conversations: C chats of T turns side by side (one KV slot each); every turn's prompt is the chat so
  far (the chat template over the earlier turns and replies) and a new user message;
- a shared system prompt: N questions (mt-bench) behind one long system prompt, one at a time;
- choices: K copies of one prompt (system prompt and question) sent together, as an OpenAI request with
  n = K is, first with the core waiting for the first copy's prefill and starting the others on its
  positions (`prefix_wait_tokens`), then without waiting.
Per turn it reports the prompt tokens, those reused (`metrics.cached_tokens`), the mean time to first
token and the turn's wall time; greedy replies must be the same with and without (lossless), else it
exits with status 3. Prints a table and writes JSON.

    python3 scripts/prefix_cache_bench.py [--target smollm2-135m] [--backend auto] [--conversations 4]
        [--turns 4] [--choices 4] [--wait-tokens 64] [--max-tokens 48]
        [--json docs/bench/prefix-cache-smollm2-135m.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from dflash_trt import LLM, SamplingParams
from dflash_trt.bench.datasets import load_prompts
from dflash_trt.bench.report import environment
from dflash_trt.runtime.batch_runner import BatchRunner

SYSTEM = ("You are a careful assistant. Answer in plain prose, name your assumptions, prefer short sentences, "
          "and say so when a question has no single answer. When code is asked for, give one complete function "
          "with a docstring and no commentary before it. When numbers are involved, show the arithmetic step by "
          "step and check the result once at the end. Never invent references; if unsure, say what to look up.")


def chat_ids(llm: LLM, messages: list[dict]) -> list[int]:
    return list(llm.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                                  return_dict=False))


def run_turns(llm: LLM, turns: list[list[list[dict]]], caching: bool, max_tokens: int, replies_from=None,
              chat: bool = True, wait_tokens: int = 0) -> dict:
    """Each turn's requests together (one per conversation). `chat`: a conversation's next turn follows
    its replies (or, when `replies_from` is given, those: both settings then see the same prompts);
    else every turn's messages stand alone."""
    runner = BatchRunner(llm, max_batch=len(turns[0]), capacity=llm.capacity, prefix_caching=caching,
                         prefix_wait_tokens=wait_tokens)
    params = SamplingParams(max_tokens=max_tokens)
    runner.run([[1, 2, 3, 4]], SamplingParams(max_tokens=4))  # untimed: lazy set-up
    runner.forget_cached()
    history = [[] for _ in turns[0]]
    rows, replies = [], []
    for k, users in enumerate(turns):
        messages = [h + u for h, u in zip(history, users, strict=True)] if chat else users
        prompts = [chat_ids(llm, m) for m in messages]
        start = time.perf_counter()
        outs = runner.run(prompts, params)
        wall = time.perf_counter() - start
        texts = [o.text for o in outs] if replies_from is None else replies_from[k]
        history = [m + [{"role": "assistant", "content": t}] for m, t in zip(messages, texts, strict=True)]
        replies.append([o.text for o in outs])
        rows.append({"turn": k + 1, "requests": len(outs), "prompt_tokens": sum(len(p) for p in prompts),
                     "cached_tokens": sum(o.metrics.cached_tokens for o in outs),
                     "mean_ttft_ms": 1e3 * statistics.mean(o.metrics.prefill_s for o in outs),
                     "wall_s": wall, "token_ids": [o.token_ids for o in outs]})
    return {"rows": rows, "replies": replies}


def compare(name: str, on: dict, off: dict) -> list[dict]:
    table = []
    for a, b in zip(on["rows"], off["rows"], strict=True):
        same = a.pop("token_ids") == b.pop("token_ids")
        table.append({"workload": name, "turn": a["turn"], "requests": a["requests"],
                      "prompt_tokens": a["prompt_tokens"], "cached_tokens": a["cached_tokens"],
                      "ttft_ms_on": a["mean_ttft_ms"], "ttft_ms_off": b["mean_ttft_ms"],
                      "wall_s_on": a["wall_s"], "wall_s_off": b["wall_s"], "same_tokens": same})
    return table


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default="smollm2-135m")
    parser.add_argument("--draft", default="auto")
    parser.add_argument("--backend", default="auto")
    parser.add_argument("--conversations", type=int, default=4)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--questions", type=int, default=8, help="shared-system-prompt requests")
    parser.add_argument("--choices", type=int, default=4, help="copies of one prompt sent together")
    parser.add_argument("--wait-tokens", type=int, default=64, help="prefix_wait_tokens for the choices")
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()

    llm = LLM(args.target, args.draft, backend=args.backend)
    users = load_prompts("mt-bench", args.conversations * args.turns + args.questions)
    turns = [[[{"role": "user", "content": users[c * args.turns + k]}] for c in range(args.conversations)]
             for k in range(args.turns)]
    chats_on = run_turns(llm, turns, True, args.max_tokens)
    # off: the same prompts (each next turn built from the replies with caching on, equal if lossless)
    chats_off = run_turns(llm, turns, False, args.max_tokens, replies_from=chats_on["replies"])
    questions = [[[{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}]]
                 for q in users[args.conversations * args.turns:]]
    shared_on = run_turns(llm, questions, True, args.max_tokens, chat=False)
    shared_off = run_turns(llm, questions, False, args.max_tokens, chat=False)
    copies = [[q[0]] * args.choices for q in questions[:4]]  # each turn: one prompt K times
    waited = run_turns(llm, copies, True, args.max_tokens, chat=False, wait_tokens=args.wait_tokens)
    no_wait = run_turns(llm, copies, True, args.max_tokens, chat=False, wait_tokens=0)
    table = (compare("conversations", chats_on, chats_off) + compare("system prompt", shared_on, shared_off)
             + compare(f"{args.choices} choices, on: wait, off: no wait", waited, no_wait))

    print("| workload | turn | requests | prompt tokens | cached | TTFT ms on | TTFT ms off | wall s on | wall s off | same tokens |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in table:
        print(f"| {r['workload']} | {r['turn']} | {r['requests']} | {r['prompt_tokens']} | {r['cached_tokens']} | "
              f"{r['ttft_ms_on']:.1f} | {r['ttft_ms_off']:.1f} | {r['wall_s_on']:.2f} | {r['wall_s_off']:.2f} | "
              f"{'yes' if r['same_tokens'] else 'NO'} |")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"command": " ".join(["python3", *sys.argv]), "backend": llm.backend,
                                         "environment": environment(), "rows": table}, indent=1) + "\n")
        print(f"written to {args.json}", file=sys.stderr)
    return 0 if all(r["same_tokens"] for r in table) else 3


if __name__ == "__main__":
    sys.exit(main())

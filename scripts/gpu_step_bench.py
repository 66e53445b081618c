"""What a target step costs at a real model's widths: a Qwen3-8B-shaped decoder stack (hidden 4096,
32 query / 8 KV heads of 128, MLP 12288, vocabulary 151,936) with random weights, written in plain
PyTorch the way a static-cache decoder runs on a GPU (gpt-fast): slot caches of a fixed capacity
written in place, SDPA over each row's valid length, only the asked rows through the LM head.

This is a floor for what our runtime's target phases can cost on the device, not a measurement of our
runtime: it has no scheduler, acceptance or drafter. For each rows x new-tokens case (a plain step is
new=1, a verify of a block of B is new=B, a prefill chunk is new=--chunk) it times the step eagerly
and as a replayed CUDA graph (CUDA only), --layers layers measured and the full --full-layers model
projected from the per-layer cost. Prints a table and writes JSON (--json).

    python3 scripts/gpu_step_bench.py [--device cuda] [--dtype bf16] [--layers 8] [--cached 1024]
"""

from __future__ import annotations

import argparse
import json
import time

import torch
from torch import nn
from torch.nn import functional as F

QWEN3_8B = dict(hidden=4096, heads=32, kv_heads=8, head_dim=128, mlp=12288, vocab=151936, layers=36)


class Layer(nn.Module):
    """A Qwen3 decoder layer (q/k norms, RoPE, GQA, SwiGLU) over slot caches [rows, kv, capacity, d]."""

    def __init__(self, s: dict):
        super().__init__()
        h, d = s["hidden"], s["head_dim"]
        self.s = s
        self.qkv = nn.Linear(h, (s["heads"] + 2 * s["kv_heads"]) * d, bias=False)
        self.o = nn.Linear(s["heads"] * d, h, bias=False)
        self.gate_up = nn.Linear(h, 2 * s["mlp"], bias=False)
        self.down = nn.Linear(s["mlp"], h, bias=False)
        self.norms = nn.ModuleList(nn.RMSNorm(n, eps=1e-6) for n in (h, h, d, d))

    def forward(self, x, cos, sin, key_cache, value_cache, slots, visible):
        rows, new, _ = x.shape
        heads, kv, d = self.s["heads"], self.s["kv_heads"], self.s["head_dim"]
        q, k, v = self.qkv(self.norms[0](x)).view(rows, new, heads + 2 * kv, d).split([heads, kv, kv], dim=2)
        q, k = rope(self.norms[2](q), cos, sin), rope(self.norms[3](k), cos, sin)
        # in place at each row's next positions: slots [rows, kv, new, d]
        key_cache.scatter_(2, slots, k.transpose(1, 2))
        value_cache.scatter_(2, slots, v.transpose(1, 2))
        out = F.scaled_dot_product_attention(q.transpose(1, 2), key_cache, value_cache, attn_mask=visible,
                                             enable_gqa=True)  # [rows, heads, new, d]
        x = x + self.o(out.transpose(1, 2).reshape(rows, new, heads * d))
        gate, up = self.gate_up(self.norms[1](x)).chunk(2, dim=-1)
        return x + self.down(F.silu(gate) * up)


def rope(x, cos, sin):  # x [rows, new, n, d], cos/sin [rows, new, 1, d]
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


class Stack(nn.Module):
    def __init__(self, s: dict, layers: int):
        super().__init__()
        self.s = s
        self.embed = nn.Embedding(s["vocab"], s["hidden"])
        self.layers = nn.ModuleList(Layer(s) for _ in range(layers))
        self.norm = nn.RMSNorm(s["hidden"], eps=1e-6)
        self.head = nn.Linear(s["hidden"], s["vocab"], bias=False)

    def forward(self, ids, lengths, caches, logits_rows: int, depth: int):
        """ids [rows, new], lengths [rows] cached per row -> logits [rows, logits_rows, vocab] float32,
        through the first `depth` layers."""
        rows, new = ids.shape
        d, capacity = self.s["head_dim"], caches[0].shape[2]
        positions = lengths[:, None] + torch.arange(new, device=ids.device)[None]  # [rows, new]
        freq = 1e6 ** (-torch.arange(0, d, 2, device=ids.device, dtype=torch.float32) / d)
        angle = positions[..., None].float() * freq
        angle = torch.cat((angle, angle), dim=-1)[:, :, None]
        cos, sin = angle.cos().to(caches[0].dtype), angle.sin().to(caches[0].dtype)
        slots = positions[:, None, :, None].expand(rows, self.s["kv_heads"], new, d)
        visible = (torch.arange(capacity, device=ids.device)[None, None] <= positions[:, :, None])[:, None]
        x = self.embed(ids)
        for i, layer in enumerate(self.layers[:depth]):
            x = layer(x, cos, sin, caches[2 * i], caches[2 * i + 1], slots, visible)
        return self.head(self.norm(x[:, -logits_rows:])).float()


def time_ms(step, device: torch.device, repeats: int) -> float:
    """Mean milliseconds per call over `repeats` calls after 3 warm-up calls."""
    for _ in range(3):
        step()
    if device.type == "cuda":
        torch.cuda.synchronize()
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(repeats):
            step()
        stop.record()
        stop.synchronize()
        return start.elapsed_time(stop) / repeats
    began = time.perf_counter()
    for _ in range(repeats):
        step()
    return (time.perf_counter() - began) * 1e3 / repeats


def graphed(step):
    """`step` captured once as a CUDA graph; the returned callable replays it."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm-up off the default stream, as capture requires
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    return graph.replay


def measure(model: Stack, rows: int, new: int, cached: int, depth: int, graphs: bool, repeats: int) -> dict:
    """{"eager_ms", "graphed_ms" (CUDA only)} of one step of `new` tokens per row through `depth` layers."""
    p = next(model.parameters())
    s = model.s
    capacity = cached + new
    caches = [torch.zeros(rows, s["kv_heads"], capacity, s["head_dim"], dtype=p.dtype, device=p.device)
              for _ in range(2 * len(model.layers))]
    ids = torch.randint(0, s["vocab"], (rows, new), device=p.device)
    lengths = torch.full((rows,), cached, device=p.device)
    # a plain step and a verify score every new token; a prefill chunk only its last
    logits_rows = 1 if new > 16 else new

    def step():
        with torch.no_grad():
            return model(ids, lengths, caches, logits_rows, depth)

    times = {"eager_ms": round(time_ms(step, p.device, repeats), 4)}
    if graphs:
        times["graphed_ms"] = round(time_ms(graphed(step), p.device, repeats), 4)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bf16", choices=["bf16", "fp16", "fp32"])
    parser.add_argument("--layers", type=int, default=8, help="layers built and timed")
    parser.add_argument("--full-layers", type=int, default=QWEN3_8B["layers"], help="layers of the projected model")
    parser.add_argument("--cached", type=int, default=1024, help="tokens already in each row's cache")
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--new", type=int, nargs="+", default=[1, 4, 8, 16], help="tokens per row: 1 plain, B verify")
    parser.add_argument("--chunk", type=int, default=512, help="prefill chunk, timed at 1 row (0: none)")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--shape", default="qwen3-8b", choices=["qwen3-8b", "tiny"])
    parser.add_argument("--json")
    args = parser.parse_args()
    device = torch.device(args.device)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[args.dtype]
    shape = QWEN3_8B if args.shape == "qwen3-8b" else dict(hidden=64, heads=4, kv_heads=2, head_dim=16, mlp=128,
                                                            vocab=512, layers=4)
    torch.manual_seed(0)
    with device:  # initialised where it runs: billions of random weights take a CPU half a minute
        model = Stack(shape, args.layers).to(dtype=dtype).eval()
    graphs = device.type == "cuda"
    cases = [(rows, new) for rows in args.rows for new in args.new]
    if args.chunk:
        cases.append((1, args.chunk))
    results, plain = [], {}
    print(f"{torch.cuda.get_device_name() if graphs else 'cpu'}, {args.dtype}, {args.layers} layers timed, "
          f"{args.full_layers} projected, {args.cached} cached")
    print(f"{'rows':>5} {'new':>5} {'eager ms':>10} {'graphed ms':>11} {'graph x':>8} {'projected ms':>13} {'/ plain':>8}")
    for rows, new in cases:
        row = {"rows": rows, "new": new, "cached": args.cached,
               **measure(model, rows, new, args.cached, args.layers, graphs, args.repeats)}
        # embedding and LM head alone (depth 0): they run once whatever the depth, the layers scale
        row["no_layers"] = measure(model, rows, new, args.cached, 0, graphs, args.repeats)
        key = "graphed_ms" if graphs else "eager_ms"
        per_layer = (row[key] - row["no_layers"][key]) / args.layers
        row["projected_full_ms"] = round(row["no_layers"][key] + per_layer * args.full_layers, 3)
        if new == 1:
            plain[rows] = row["projected_full_ms"]
        row["vs_plain"] = round(row["projected_full_ms"] / plain[rows], 3) if rows in plain else None
        results.append(row)
        speed = f"{row['eager_ms'] / row['graphed_ms']:.2f}" if graphs else "-"
        print(f"{rows:>5} {new:>5} {row['eager_ms']:>10.3f} {row.get('graphed_ms', float('nan')):>11.3f} "
              f"{speed:>8} {row['projected_full_ms']:>13.3f} {row['vs_plain'] or float('nan'):>8.3f}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"shape": shape, "layers_timed": args.layers, "full_layers": args.full_layers,
                       "dtype": args.dtype, "torch": torch.__version__, "steps": results}, f, indent=1)


if __name__ == "__main__":
    main()

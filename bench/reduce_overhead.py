"""Batch-1 inference with ``mode="reduce-overhead"`` (CUDA graphs): eager vs torch.compile vs bytegraph.

    python bench/reduce_overhead.py [--layers 12] [--d 768] [--tokens 128] [--iters 100]

Needs a CUDA GPU. Each variant runs in a fresh process (CUDA graph pools and caches are
per process); each prints its first-call time (compile included) and the steady-state
median per call (CUDA events), and the largest difference from eager's output.
"""
import argparse
import statistics
import subprocess
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, __file__.rsplit("/bench/", 1)[0])
import bytegraph  # noqa: E402

bytegraph.config.persistent_cache = False   # measure compiles, not loads from an earlier run's cache


class Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self, layers, d, heads=12, vocab=50257, ctx=1024):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(ctx, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, idx):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.ln(x))


def timed(fn, x, iters):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    with torch.no_grad():
        fn(x)
    torch.cuda.synchronize()
    first = time.perf_counter() - t0
    with torch.no_grad():
        for _ in range(5):
            fn(x)
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        with torch.no_grad():
            fn(x)
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return first, statistics.median(times)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--d", type=int, default=768)
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--iters", type=int, default=100)
    p.add_argument("--only", default=None, help="run just this variant, in this process")
    args = p.parse_args()
    if args.only is None:
        for name in VARIANTS:
            subprocess.run([sys.executable, __file__, "--only", name, "--layers", str(args.layers),
                            "--d", str(args.d), "--tokens", str(args.tokens), "--iters", str(args.iters)],
                           check=False)
        return
    torch.manual_seed(0)
    model = GPT(args.layers, args.d).cuda().eval()
    x = torch.randint(0, 50257, (1, args.tokens), device="cuda")
    with torch.no_grad():
        ref = model(x)
    fn = VARIANTS[args.only](model)
    first, median = timed(fn, x, args.iters)
    with torch.no_grad():
        err = (fn(x) - ref).abs().max().item()
    print(f"{args.only:34s} first call {first * 1e3:9.1f} ms   median {median:7.3f} ms   max|diff| {err:.2e}",
          flush=True)


VARIANTS = {
    "eager": lambda m: m,
    "torch.compile reduce-overhead": lambda m: torch.compile(m, mode="reduce-overhead"),
    "bytegraph reduce-overhead": lambda m: bytegraph.compile(m, mode="reduce-overhead"),
    "torch.compile inductor": lambda m: torch.compile(m),
    "bytegraph inductor": lambda m: bytegraph.compile(m),
    "torch.compile cudagraphs backend": lambda m: torch.compile(m, backend="cudagraphs"),
    "bytegraph cudagraphs backend": lambda m: bytegraph.compile(m, backend="cudagraphs"),
}


if __name__ == "__main__":
    main()

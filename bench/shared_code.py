"""Per-call cost of a decorator shared by many modules: 1, 10 and 100 decorated modules.

Every module's ``forward`` is wrapped by one decorator whose wrapper graph-breaks, so
each wrapper runs as its own compiled frame and all of them share one code object (and
one resume code). The cache of that code holds an entry per module; what matters is
that a call does not try them one by one.

    python bench/shared_code.py [--repeat 5]

Prints, for bytegraph and torch.compile (backend="eager", tiny tensors, so the time is
almost all outside the graph): microseconds per decorated-module call, and for
bytegraph the most entries one code object's cache holds.
"""
import argparse
import functools
import statistics
import sys
import time
from pathlib import Path

_ROOT = Path(__file__).resolve().parent.parent
if str(_ROOT) not in sys.path:
    sys.path.insert(0, str(_ROOT))

import torch  # noqa: E402
import torch._dynamo  # noqa: E402  (the reference)

import bytegraph  # noqa: E402

bytegraph.config.persistent_cache = False   # measure compiles, not loads from an earlier run's cache


def traced(func):
    @functools.wraps(func)
    def wrapper(self, x):
        if x.sum() > -1e9:          # a graph break in the wrapper (always the same branch)
            x = x + 0
        return func(self, x)
    return wrapper


def make_modules(n):
    mods = []
    for i in range(n):
        # A class of its own per module, as for many decorated model classes.
        cls = type(f"Mod{i}", (torch.nn.Module,), {"forward": traced(lambda self, x, i=i: x * 1.0 + i)})
        mods.append(cls())
    return mods


class Chain(torch.nn.Module):
    """Calls every decorated module in turn (one compile covers them all)."""

    def __init__(self, mods):
        super().__init__()
        self.mods = torch.nn.ModuleList(mods)

    def forward(self, x):
        for m in self.mods:
            x = m(x)
        return x


def per_call_us(fn, x, n, rounds):
    fn(x)                        # warm up: compile everything
    t0 = time.perf_counter()
    for _ in range(rounds):
        fn(x)
    return (time.perf_counter() - t0) / (rounds * n) * 1e6


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--calls", type=int, default=3000, help="module calls per measurement")
    args = parser.parse_args()
    torch.set_num_threads(1)
    x = torch.ones(1)
    print(f"{'modules':>8} | {'eager µs/call':>13} | {'bytegraph µs/call':>17} | {'torch.compile µs/call':>21} | entries")
    print("-" * 84)
    for n in (1, 10, 100):
        model = Chain(make_modules(n))
        rounds = max(1, args.calls // n)
        eager = min(per_call_us(model, x, n, rounds) for _ in range(args.repeat))
        bytegraph.reset()
        compiled = bytegraph.compile(model, backend="eager")
        bg = min(per_call_us(compiled, x, n, rounds) for _ in range(args.repeat))
        entries = max(len(c.entries) for c in compiled._compiler.caches.values())
        torch._dynamo.reset()
        with torch._dynamo.config.patch(recompile_limit=8, accumulated_recompile_limit=100000):
            tc_model = torch.compile(model, backend="eager")
            tc = min(per_call_us(tc_model, x, n, rounds) for _ in range(args.repeat))
        print(f"{n:>8} | {eager:>13.1f} | {bg:>17.1f} | {tc:>21.1f} | {entries}")


if __name__ == "__main__":
    main()

"""Host (CPU) cost of the outer code that calls regionally compiled parts and foreach lane chunks.

    PYTHONPATH=. python bench/outer_calls.py step [--layers 4] [--rounds 20]
    PYTHONPATH=. python bench/outer_calls.py update [--layers 12] [--variants 16,8,4,2,whole,16fx]

``step``: the whole training step of ``host_cost.py``'s GPT (forward, cross-entropy,
``backward()``, foreach AdamW ``step()``, ``zero_grad()``) compiled twice with Inductor in one
process, once with the split graphs run by fx's code for the outer graph (``outer_function``
switched off while it compiles) and once by ``regions.outer_function``; alternating rounds of
``--iters`` steps, this thread's CPU time a step, min and median over the rounds.

``update``: the optimizer's update graph captured once, then compiled from it in several ways and
called in alternating rounds (under ``no_grad``, as ``step()`` runs it): ``whole`` (one Inductor
graph), ``N`` (split into lanes with ``config.lane_max_chunks = N``), ``Nfx`` (the same chunks
called through fx's code for the outer graph); with each variant's compile time (wall, Inductor's
caches as they are) and chunk count.
"""
import argparse
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import bytegraph  # noqa: E402
from bytegraph.backends import lanes, regions  # noqa: E402
from bytegraph.config import config  # noqa: E402
from reduce_overhead import GPT  # noqa: E402


def model_and_optimizer(layers):
    torch.manual_seed(0)
    model = GPT(layers, 16, heads=2, vocab=64, ctx=16)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1, foreach=True)


def interleaved(fns, rounds, iters):
    """{name: (min, median) us per call} over ``rounds`` alternating rounds of ``iters`` calls each."""
    times = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            t0 = time.thread_time()
            for _ in range(iters):
                fn()
            times[name].append((time.thread_time() - t0) / iters * 1e6)
    return {name: (round(min(t), 1), round(statistics.median(t), 1)) for name, t in times.items()}


_OUTER = regions.outer_function


def fx_outer(on):
    """``outer_function`` as it is (``on``) or answering None (the split graph keeps fx's code)."""
    lanes.outer_function = regions.outer_function = _OUTER if on else (lambda gm, name="": None)


def steps(args):
    x = torch.randint(0, 64, (1, 8))
    y = torch.randint(0, 64, (1, 8))
    compiled = {}
    for name, on in (("fx outer code", False), ("outer_function", True)):
        model, opt = model_and_optimizer(args.layers)

        def step(idx, targets, model=model, opt=opt):
            loss = F.cross_entropy(model(idx).view(-1, 64), targets.view(-1))
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            return loss
        fx_outer(on)
        try:
            fn = bytegraph.compile(step, backend="inductor")
            for _ in range(args.warmup):
                fn(x, y)
        finally:
            fx_outer(True)
        compiled[name] = (lambda fn: lambda: fn(x, y))(fn)
    for name, (lo, med) in interleaved(compiled, args.rounds, args.iters).items():
        print(f"whole step, {args.layers} layers, {name}: {lo} / {med} us (min / median)")


def update(args):
    from bytegraph.backends.inductor import inductor_whole
    model, opt = model_and_optimizer(args.layers)
    x = torch.randint(0, 64, (1, 8))
    F.cross_entropy(model(x).view(-1, 64), x.view(-1)).backward()
    graphs = []

    def keep(gm, example_inputs):
        graphs.append((gm, list(example_inputs)))
        return gm.forward
    bytegraph.compile(lambda: opt.step(), backend=keep)()
    gm, examples = max(graphs, key=lambda g: len(g[0].graph.nodes))
    fns = {}
    before = config.lane_max_chunks
    for v in args.variants.split(","):
        t0 = time.time()
        with torch.no_grad():
            if v == "whole":
                fn, what = inductor_whole(gm, examples), "1 graph"
            else:
                config.lane_max_chunks = int(v.removesuffix("fx"))
                try:
                    split = lanes.compile_by_lanes(gm, examples, lambda part, ex: inductor_whole(part, ex))
                finally:
                    config.lane_max_chunks = before
                if split is None:
                    continue
                fn = split.forward if not v.endswith("fx") else (lambda s: lambda *a: type(s).forward(s, *a))(split)
                what = f"{len(split.meta['bytegraph_chunks'])} chunks, {split.meta['bytegraph_parts']} compiled"
        print(f"{v}: {what}, compiled in {time.time() - t0:.1f} s", flush=True)

        def run(fn=fn):
            with torch.no_grad():
                fn(*examples)
        fns[v] = run
    for name, (lo, med) in interleaved(fns, args.rounds, args.iters).items():
        print(f"update, {args.layers} layers, {name}: {lo} / {med} us (min / median)")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("what", choices=["step", "update"])
    p.add_argument("--layers", type=int, default=None)
    p.add_argument("--rounds", type=int, default=None)
    p.add_argument("--iters", type=int, default=None)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--variants", default="16,8,4,2,whole,16fx")
    args = p.parse_args()
    torch.set_num_threads(1)
    if args.what == "step":
        args.layers, args.rounds, args.iters = args.layers or 4, args.rounds or 20, args.iters or 30
        steps(args)
    else:
        args.layers, args.rounds, args.iters = args.layers or 12, args.rounds or 15, args.iters or 50
        update(args)


if __name__ == "__main__":
    main()

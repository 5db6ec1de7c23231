"""Host (CPU/Python) cost per call of a compiled training step, where a GPU step is launch-bound.

    PYTHONPATH=. python bench/host_cost.py                       # 12 layers, d=16, backend "eager"
    PYTHONPATH=. python bench/host_cost.py --backend aot_eager --layers 24

A GPT-like model with many parameters and almost no compute (small ``d``, few tokens), so
what is timed is the front end: the model's compiled call (forward, with grad) and an
optimizer's foreach AdamW ``step()`` compiled as a frame of its own (as the whole step's
graph break at ``opt.step()`` makes it), each timed per call (min over ``--repeats`` rounds of
``--iters`` calls: the machine is shared and noisy). A cProfile of the optimizer calls gives
the own and cumulative time of its generated guard function (``guard*``) and of
``storage_groups`` per call. ``--lanes`` also times the optimizer graph split into foreach
lanes (``backends/lanes.compile_by_lanes`` with the eager backend, as Inductor would on a GPU)
against the same graph whole.
"""
import argparse
import cProfile
import json
import os
import pstats
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import bytegraph  # noqa: E402
from reduce_overhead import GPT  # noqa: E402


def per_call(fn, iters, repeats):
    """Min over ``repeats`` rounds of the mean CPU time of this thread for ``iters`` calls, in
    microseconds (CPU time: what issuing the call costs the host, and less moved by other
    processes on a shared machine than wall time; torch runs on this one thread)."""
    best = float("inf")
    for _ in range(repeats):
        t0 = time.thread_time()
        for _ in range(iters):
            fn()
        best = min(best, (time.thread_time() - t0) / iters)
    return best * 1e6


def profile_per_call(fn, iters, names):
    """{function name: (own us, cumulative us) per call} for functions whose name starts with one of ``names``."""
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(iters):
        fn()
    prof.disable()
    out = {}
    for (file, line, func), (cc, nc, tt, ct, callers) in pstats.Stats(prof).stats.items():
        for n in names:
            if func.startswith(n):
                own, cum = out.get(func, (0.0, 0.0))
                out[func] = (own + tt * 1e6 / iters, cum + ct * 1e6 / iters)
    return {k: (round(a, 1), round(b, 1)) for k, (a, b) in out.items()}


def guard_alone(call, iters, repeats):
    """Per call (us), the largest generated guard function that passed during ``call()``, called
    on its own with the arguments it was given (no profiler: cProfile inflates the many C calls
    of a guard), and its name."""
    import gc
    import types
    seen = {}

    def watch(frame, event, arg):
        if frame.f_code.co_name.startswith("guard") and frame.f_code.co_filename.startswith("<bytegraph"):
            if event == "call":
                code = frame.f_code
                seen[code] = [frame.f_locals[n] for n in code.co_varnames[:code.co_argcount]]
            elif event == "return" and arg is None:
                seen.pop(frame.f_code, None)     # did not pass

    sys.setprofile(watch)
    try:
        call()
    finally:
        sys.setprofile(None)
    code = max(seen, key=lambda c: len(c.co_code))
    fn = next(f for f in gc.get_objects() if isinstance(f, types.FunctionType) and f.__code__ is code)
    args = seen[code]
    grad = torch.is_grad_enabled()
    torch.set_grad_enabled(False)     # (as the optimizer's step runs its frame: the guard checks it)
    try:
        assert fn(*args) is not None
        return code.co_name, per_call(lambda: fn(*args), iters, repeats)
    finally:
        torch.set_grad_enabled(grad)


def lanes_figures(opt_step, args):
    """The optimizer graph captured once (backend that keeps it), then run whole and split into lanes."""
    from bytegraph.backends.lanes import compile_by_lanes
    graphs = []

    def keep(gm, example_inputs):
        graphs.append((gm, list(example_inputs)))
        return gm.forward

    step = bytegraph.compile(opt_step, backend=keep)
    step()
    gm, examples = max(graphs, key=lambda g: len(g[0].graph.nodes))
    from bytegraph.config import config
    real = list(examples)

    def timed(fn):
        def run():
            with torch.no_grad():      # (as the optimizer's step runs its graph)
                fn(*real)
        return round(per_call(run, args.iters, args.repeats), 1)

    out = {"optimizer graph whole (us)": timed(gm)}
    before = config.lane_max_chunks
    try:
        for most in (16, 8, 4, 2):
            config.lane_max_chunks = most
            split = compile_by_lanes(gm, examples, lambda part, ex: part.forward)
            if split is not None:
                out[f"optimizer graph in {len(split.meta['bytegraph_chunks'])} lane chunks "
                    f"(lane_max_chunks={most}) (us)"] = timed(split)
    finally:
        config.lane_max_chunks = before
    return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--d", type=int, default=16)
    p.add_argument("--backend", default="eager")
    p.add_argument("--iters", type=int, default=50)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--lanes", action="store_true")
    args = p.parse_args()
    torch.set_num_threads(1)     # (all of it on the thread whose CPU time is measured)
    torch.manual_seed(0)
    model = GPT(args.layers, args.d, heads=2, vocab=64, ctx=16)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1, foreach=True)
    x = torch.randint(0, 64, (1, 8))
    y = torch.randint(0, 64, (1, 8))

    def opt_step():
        opt.step()

    cmodel = bytegraph.compile(model, backend=args.backend)
    copt = bytegraph.compile(opt_step, backend=args.backend)

    def forward():
        return cmodel(x)

    def train():
        loss = F.cross_entropy(forward().view(-1, 64), y.view(-1))
        loss.backward()

    for _ in range(3):
        train()
        copt()
    n_tensors = sum(1 for _ in model.parameters())
    out = {"layers": args.layers, "params": n_tensors, "backend": args.backend,
           "model call (us)": round(per_call(forward, args.iters, args.repeats), 1),
           "model call, eager (us)": round(per_call(lambda: model(x), args.iters, args.repeats), 1),
           "optimizer step (us)": round(per_call(copt, args.iters, args.repeats), 1),
           "optimizer step, eager (us)": round(per_call(opt_step, args.iters, args.repeats), 1),
           "optimizer step's guard alone (us)": round(guard_alone(copt, args.iters, args.repeats)[1], 1),
           "optimizer step profile (own us, cum us)": profile_per_call(copt, args.iters,
                                                                       ("guard", "storage_groups")),
           "model call profile (own us, cum us)": profile_per_call(forward, args.iters,
                                                                   ("guard", "storage_groups"))}
    if args.lanes:
        out.update(lanes_figures(opt_step, args))
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()

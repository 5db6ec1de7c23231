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

``--steps`` compares the compilers on whole steps instead, each compiler in a fresh process:

    PYTHONPATH=. python bench/host_cost.py --steps [--compilers torch.compile,bytegraph,bytegraph-whole]

per step, this thread's CPU time (min and median over ``--repeats`` rounds of ``--iters`` steps)
of the whole step compiled as one function (forward, cross-entropy, ``backward()``, foreach
AdamW ``step()``, ``zero_grad()``; the graph break at ``opt.step()`` makes several frames) and
of the model-only step (the model compiled, the rest eager); for bytegraph, each generated guard
timed in place (unprofiled: where it runs in the step, its tensors out of the CPU's caches);
``--profile N`` adds the N
functions with most own time per step (cProfile) and bytegraph's time by kind (guards,
regions, AOTAutograd's runtime wrappers, ``storage_groups``, dispatch).
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


STEP_VARIANTS = {"bytegraph-whole": ("bytegraph", {"BYTEGRAPH_REGIONAL_COMPILE": "0"})}


def per_call_stats(fn, iters, repeats):
    """(min, median) over ``repeats`` rounds of the mean thread CPU time of ``iters`` calls, in us."""
    import statistics
    rounds = []
    for _ in range(repeats):
        t0 = time.thread_time()
        for _ in range(iters):
            fn()
        rounds.append((time.thread_time() - t0) / iters * 1e6)
    return round(min(rounds), 1), round(statistics.median(rounds), 1)


def kind_of(file, func):
    """Which part of a compiled step a profiled function belongs to (for the breakdown by kind)."""
    if func.startswith("guard") and file.startswith("<bytegraph"):
        return "bytegraph guards"
    if func == "storage_groups":
        return "storage_groups"
    if "/bytegraph/backends/regions" in file or "/bytegraph/backends/subgraphs" in file:
        return "bytegraph regions"
    if "/bytegraph/" in file:
        return "bytegraph other"
    if file.startswith("<bytegraph"):
        return "bytegraph generated code"
    if "/_functorch/" in file:
        return "AOTAutograd runtime"
    if "/_dynamo/" in file:
        return "torch._dynamo"
    if "/torch/optim/" in file:
        return "torch.optim"
    if "/torch/autograd/" in file or "run_backward" in func:
        return "autograd"
    return None


def step_figures(kind, compiler, args):
    """Per-step CPU time of ``kind`` ("whole" or "model") compiled by ``compiler`` (this process)."""
    torch.manual_seed(0)
    model = GPT(args.layers, args.d, heads=2, vocab=64, ctx=16)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1, foreach=True)
    x = torch.randint(0, 64, (1, 8))
    y = torch.randint(0, 64, (1, 8))
    compile_ = (lambda f: torch.compile(f, backend=args.backend)) if compiler == "torch.compile" else \
        (lambda f: bytegraph.compile(f, backend=args.backend)) if compiler != "eager" else (lambda f: f)
    forward = compile_(model) if kind == "model" else model

    def step(idx, targets):
        loss = F.cross_entropy(forward(idx).view(-1, 64), targets.view(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss
    fn = compile_(step) if kind == "whole" else step
    for _ in range(args.warmup):
        loss = fn(x, y)
    out = {"per step (us): min, median": per_call_stats(lambda: fn(x, y), args.iters, args.repeats),
           "loss": round(float(fn(x, y)), 6)}
    if compiler == "bytegraph":
        out["guards in place, us per step: min, median"] = guards_in_place(lambda: fn(x, y), args.iters * 3)
    if args.profile:
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(args.iters):
            fn(x, y)
        prof.disable()
        stats = pstats.Stats(prof).stats
        kinds = {}
        for (file, line, func), (cc, nc, tt, ct, callers) in stats.items():
            k = kind_of(file, func)
            if k is not None:
                kinds[k] = kinds.get(k, 0.0) + tt * 1e6 / args.iters
        out["own us per step by kind (profiled)"] = {k: round(v, 1) for k, v in sorted(kinds.items())}
        top = sorted(stats.items(), key=lambda kv: -kv[1][2])[:args.profile]
        out["top own us per step (profiled)"] = [
            f"{os.path.basename(k[0])}:{k[1]}({k[2]}) calls {v[1] // args.iters} own {v[2] * 1e6 / args.iters:.1f} "
            f"cum {v[3] * 1e6 / args.iters:.1f}" for k, v in top]
    return out


def guards_in_place(call, steps):
    """{generated guard: (min, median) us per step}, each passing guard timed where it runs, in
    the step (no profiler): the dispatch functions' entries wrapped for ``steps`` steps, then put
    back. In place a guard over hundreds of tensors finds them out of the CPU's caches (the step
    touched much else since), so it costs several times what it costs called in a loop."""
    import gc
    import statistics
    import types
    times, lists = {}, []

    def timed(check):
        def run(*a):
            t = time.thread_time_ns()
            hit = check(*a)
            if hit is not None:
                times.setdefault(getattr(check, "__name__", "?"), []).append((time.thread_time_ns() - t) / 1e3)
            return hit
        return run
    import warnings
    with warnings.catch_warnings():     # (gc's objects include deprecated names of torch.distributed)
        warnings.simplefilter("ignore")
        functions = [f for f in gc.get_objects() if isinstance(f, types.FunctionType)]
    for f in functions:
        if f.__code__.co_filename.startswith("<bytegraph dispatch"):
            entries = f.__globals__.get("__entries")
            if isinstance(entries, list) and all(callable(e) for e in entries):
                lists.append((entries, list(entries)))
                entries[:] = [timed(e) for e in entries]
    try:
        for _ in range(steps):
            call()
    finally:
        for entries, before in lists:
            entries[:] = before
    return {k: (round(min(v), 1), round(statistics.median(v), 1))
            for k, v in sorted(times.items(), key=lambda kv: -statistics.median(kv[1]))}


def compare_steps(args):
    """Each compiler, each step kind, in a fresh process; one JSON object of all the figures."""
    import subprocess
    results = {}
    for compiler in args.compilers.split(","):
        real, env = STEP_VARIANTS.get(compiler, (compiler, {}))
        for kind in ("whole", "model"):
            cmd = [sys.executable, os.path.abspath(__file__), "--one-step", kind, "--compiler", real,
                   "--layers", str(args.layers), "--d", str(args.d), "--backend", args.backend,
                   "--iters", str(args.iters), "--repeats", str(args.repeats), "--warmup", str(args.warmup),
                   "--profile", str(args.profile)]
            proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **env})
            line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("{")), None)
            results[f"{kind} step, {compiler}"] = json.loads(line) if line else \
                {"error": (proc.stderr.strip().splitlines() or ["no output"])[-1]}
            print(f"{kind} step, {compiler}: {json.dumps(results[f'{kind} step, {compiler}'])[:300]}",
                  file=sys.stderr, flush=True)
    print(json.dumps(results, indent=1))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--d", type=int, default=16)
    p.add_argument("--backend", default="eager")
    p.add_argument("--iters", type=int, default=50)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--lanes", action="store_true")
    p.add_argument("--steps", action="store_true", help="whole and model-only steps, each compiler in a process")
    p.add_argument("--compilers", default="eager,torch.compile,bytegraph,bytegraph-whole")
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--profile", type=int, default=0, help="with --steps: top N functions by own time per step")
    p.add_argument("--one-step", default=None, help=argparse.SUPPRESS)
    p.add_argument("--compiler", default="bytegraph", help=argparse.SUPPRESS)
    args = p.parse_args()
    torch.set_num_threads(1)     # (all of it on the thread whose CPU time is measured)
    if args.steps:
        return compare_steps(args)
    if args.one_step:
        print(json.dumps(step_figures(args.one_step, args.compiler, args)), flush=True)
        return
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

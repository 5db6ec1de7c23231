"""A tour of bytegraph on two small models: ``python -m bytegraph.demo``.

For the MLP and the TinyGPT in ``bytegraph.demo.models`` it

1. compiles the model with ``bytegraph.compile`` (``--backend``, default eager),
2. runs it and checks the result against plain eager PyTorch,
3. shows what was captured: how many graphs, how many ops in each, the
   graphs' code, the guards protecting them and the transformed function,
4. times eager against compiled: same inputs, both warmed up, under
   ``torch.no_grad()``, calls interleaved, median per call.

Options: ``--backend {eager,aot_eager,inductor}``, ``--model NAME`` (repeatable),
``--runs N`` (timed calls per model), ``--threads N`` (torch intra-op threads,
default 1), ``--no-graphs`` (skip printing the graphs' code),
``--show-guard-code`` (print the generated guard functions too).
"""
import argparse
import collections
import gc
import statistics
import sys
import time

import torch

import bytegraph
from bytegraph.backends.registry import lookup_backend
from bytegraph.demo.models import make_inputs, make_model
from bytegraph.debug.counting import count_ops
from bytegraph.testing import CompileCounter

DEMO_MODELS = ("mlp", "tinygpt")
BACKENDS = ("eager", "aot_eager", "inductor")
RULE = "=" * 78


def _inner_backend(name):
    """The compiler function a CompileCounter hands each graph to, for backend ``name``.

    ``eager`` needs none: the counter runs the captured graph as it is.
    """
    if name == "eager":
        return None
    return lookup_backend(name)


def _cache_entries(compiled):
    """The cache entries (newest first) behind ``compiled``: a compiled module or function.

    For an ``OptimizedModule`` the cache hangs off its compiled ``forward``
    (a bound method, so on its ``__func__``). ``OptimizedModule`` forwards
    unknown attribute names to the wrapped module, hence ``object.__getattribute__``.
    """
    target = compiled
    if isinstance(compiled, bytegraph.OptimizedModule):
        target = object.__getattribute__(compiled, "_compiled_forward")
    target = getattr(target, "__func__", target)
    cache = getattr(target, "_bytegraph_cache", None)
    return list(cache.entries) if cache is not None else []


def _guard_report(compiled, show_guard_code=False, max_guards=25):
    """What guards protect ``compiled``'s cached code, as a list of lines.

    Per cache entry: the guard count by kind, the guards themselves (the first
    ``max_guards``), the transformed function, and with ``show_guard_code`` the
    generated guard function.
    """
    entries = _cache_entries(compiled)
    if not entries:
        return ["(no cache entries: nothing has been compiled yet)"]
    lines = []
    for n, entry in enumerate(entries, 1):
        if len(entries) > 1:
            lines.append(f"cache entry {n} of {len(entries)} (newest first):")
        if entry.fallback_reason:
            lines.append(f"runs eagerly: {entry.fallback_reason}")
        guards = list(entry.guards)
        kinds = collections.Counter(g.kind for g in guards)
        by_kind = ", ".join(f"{kind} {count}" for kind, count in kinds.most_common())
        lines.append(f"{len(guards)} guards" + (f": {by_kind}" if by_kind else ""))
        lines.extend(f"  - {g.describe()}" for g in guards[:max_guards])
        if len(guards) > max_guards:
            lines.append(f"  ... {len(guards) - max_guards} more")
        if entry.transformed_source:
            lines.append("transformed function:")
            lines.extend(_indent(entry.transformed_source.rstrip()).splitlines())
        if show_guard_code and entry.guard_source:
            lines.append("guard function:")
            lines.extend(_indent(entry.guard_source.rstrip()).splitlines())
    return lines


def _per_call_us(fn, args):
    t0 = time.perf_counter_ns()
    fn(*args)
    return (time.perf_counter_ns() - t0) / 1e3


def _compare_us(eager, compiled, args, runs, warmup=5):
    """Per-call times (µs) of ``eager(*args)`` and ``compiled(*args)``, measured fairly.

    Both get the same inputs and ``warmup`` calls first; then the two are timed
    interleaved, one call each per round with the order alternating, so that a
    burst of load from elsewhere on the machine hits both alike rather than
    whichever happened to be running. The garbage collector is off while
    timing. Returns the two lists of ``runs`` samples.
    """
    for _ in range(warmup):
        eager(*args)
        compiled(*args)
    eager_times, compiled_times = [], []
    gc.collect()
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        for i in range(runs):
            if i % 2:
                compiled_times.append(_per_call_us(compiled, args))
                eager_times.append(_per_call_us(eager, args))
            else:
                eager_times.append(_per_call_us(eager, args))
                compiled_times.append(_per_call_us(compiled, args))
    finally:
        if gc_was_enabled:
            gc.enable()
    return eager_times, compiled_times


def _spread(times):
    """Interquartile range relative to the median: how noisy a set of timings is."""
    if len(times) < 4:
        return 0.0
    q1, med, q3 = statistics.quantiles(times, n=4)
    return (q3 - q1) / med if med else 0.0


def _indent(text, prefix="    "):
    return "\n".join(prefix + line if line else line for line in text.splitlines())


def demo_model(name, backend, runs, show_graphs, show_guard_code=False):
    """Compile, check, describe and time model ``name``; returns a row for the summary table."""
    print(RULE)
    print(f"{name}  (backend={backend})")
    print(RULE)
    model = make_model(name)
    inputs = make_inputs(name, model)
    print(f"inputs: {', '.join(f'{tuple(t.shape)} {t.dtype}' for t in inputs)}")

    bytegraph.reset()
    counter = CompileCounter(_inner_backend(backend))
    compiled = bytegraph.compile(model, backend=counter)

    with torch.no_grad():
        expected = model(*inputs)
        t0 = time.perf_counter()
        actual = compiled(*inputs)
        first_ms = (time.perf_counter() - t0) * 1e3
        # Inductor may reorder float arithmetic: allow for rounding.
        tol = dict(rtol=1e-5, atol=1e-6) if backend == "eager" else dict(rtol=1e-4, atol=1e-5)
        same = torch.allclose(expected, actual, **tol)
        print(f"first call (capture + backend): {first_ms:.1f} ms")
        print(f"result equals eager: {'yes' if same else 'NO'}"
              + ("" if same else f"  (max abs diff {(expected - actual).abs().max().item():.3g})"))

        print(f"graphs captured: {counter.frame_count}")
        for i, gm in enumerate(counter.graphs):
            print(f"  graph {i}: {count_ops(gm)} ops")
        if show_graphs:
            for i, gm in enumerate(counter.graphs):
                print(f"\n--- graph {i} ---")
                print(_indent(gm.print_readable(print_output=False).rstrip()))
        print("\nguards:")
        for line in _guard_report(compiled, show_guard_code):
            print(f"  {line}".rstrip())

        eager_times, compiled_times = _compare_us(model, compiled, inputs, runs)
    eager_us, compiled_us = statistics.median(eager_times), statistics.median(compiled_times)
    print(f"\ntiming ({runs} interleaved calls each, median): eager {eager_us:.1f} µs, "
          f"compiled {compiled_us:.1f} µs")
    print()
    return dict(model=name, graphs=counter.frame_count, ops=counter.op_count, same=same,
                first_ms=first_ms, eager_us=eager_us, compiled_us=compiled_us,
                noisy=max(_spread(eager_times), _spread(compiled_times)) > 0.5)


def _table(rows, runs):
    headers = ("model", "graphs", "ops", "equal", "1st call ms", "eager µs", "compiled µs", "speedup")
    body = []
    for r in rows:
        if "error" in r:
            body.append((r["model"], "-", "-", "-", "-", "-", "-", "ERROR"))
            continue
        body.append((r["model"], str(r["graphs"]), str(r["ops"]), "yes" if r["same"] else "NO",
                     f"{r['first_ms']:.1f}", f"{r['eager_us']:.1f}", f"{r['compiled_us']:.1f}",
                     f"{r['eager_us'] / r['compiled_us']:.2f}x"))
    widths = [max(len(h), *(len(row[i]) for row in body)) for i, h in enumerate(headers)]
    line = lambda cells: "  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                                   for i, (c, w) in enumerate(zip(cells, widths)))
    print(RULE)
    print(f"summary: median per call of {runs} interleaved calls each, after warm-up, under no_grad,\n"
          f"torch threads: {torch.get_num_threads()}; speedup = eager / compiled")
    print(RULE)
    print(line(headers))
    print(line(["-" * w for w in widths]))
    for row in body:
        print(line(row))
    for r in rows:
        if "error" in r:
            print(f"{r['model']}: {r['error']}")
    noisy = [r["model"] for r in rows if r.get("noisy")]
    if noisy:
        hint = " Try again, or with --threads 1." if torch.get_num_threads() > 1 else " Try again."
        print(f"note: timings of {', '.join(noisy)} were noisy (interquartile range over half the "
              f"median): the machine may be busy.{hint}")


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m bytegraph.demo", description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=BACKENDS, default="eager",
                        help="backend the captured graphs are handed to (default: eager)")
    parser.add_argument("--model", action="append", choices=DEMO_MODELS,
                        help="model to show (repeatable; default: all)")
    parser.add_argument("--runs", type=int, default=100,
                        help="timed calls per model, for eager and for compiled each (default: 100)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch intra-op threads (default: 1; 0 keeps torch's own choice). "
                             "The demo models are too small to gain from more, and with more, "
                             "any other load on the machine stalls torch's OpenMP threads and "
                             "makes the timings erratic")
    parser.add_argument("--no-graphs", action="store_true", help="do not print the captured graphs' code")
    parser.add_argument("--show-guard-code", action="store_true",
                        help="also print the generated guard functions' source")
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    if args.threads < 0:
        parser.error("--threads must be 0 (torch's default) or more")
    if args.threads:
        torch.set_num_threads(args.threads)

    print(f"bytegraph {getattr(bytegraph, '__version__', '?')}, torch {torch.__version__}, "
          f"python {sys.version.split()[0]}, torch threads: {torch.get_num_threads()}")
    rows = []
    for name in args.model or DEMO_MODELS:
        try:
            rows.append(demo_model(name, args.backend, args.runs, not args.no_graphs,
                                   args.show_guard_code))
        except Exception as e:  # keep going: show the other models, report the failure
            print(f"FAILED: {type(e).__name__}: {e}\n")
            rows.append(dict(model=name, error=f"{type(e).__name__}: {e}"))
    _table(rows, args.runs)
    failed = any("error" in r or not r["same"] for r in rows)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

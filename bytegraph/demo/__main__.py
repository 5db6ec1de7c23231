"""A tour of bytegraph on two small models: ``python -m bytegraph.demo``.

For the MLP and the TinyGPT in ``bytegraph.demo.models`` it

1. compiles the model with ``bytegraph.compile`` (``--backend``, default eager),
2. runs it and checks the result against plain eager PyTorch,
3. shows what was captured: how many graphs, how many ops in each, the
   graphs' code, and the guards protecting them,
4. times eager against compiled (median per call after a warm-up).

Options: ``--backend {eager,aot_eager,inductor}``, ``--model NAME`` (repeatable),
``--runs N`` (timed calls per model), ``--no-graphs`` (skip printing the code).
"""
import argparse
import statistics
import sys
import time

import torch

import bytegraph
from bytegraph.demo.models import make_inputs, make_model
from bytegraph.testing import CompileCounter, count_ops

DEMO_MODELS = ("mlp", "tinygpt")
BACKENDS = ("eager", "aot_eager", "inductor")
RULE = "=" * 78


def _inner_backend(name):
    """The compiler function a CompileCounter hands each graph to, for backend ``name``.

    ``eager`` needs none: the counter runs the captured graph as it is.
    """
    if name == "eager":
        return None
    try:
        from bytegraph.backends.registry import lookup_backend
    except ImportError:  # registry not available: use PyTorch's own backends
        from torch._dynamo import lookup_backend
    return lookup_backend(name)


def _describe_guards(compiled):
    """The guards of ``compiled`` as a list of lines.

    HOOK: bytegraph does not expose its guards yet. When it does (an
    ``explain``-like facility in ``bytegraph.debug``, or a ``_bytegraph_guards``
    attribute on the compiled object), wire it in here; the rest of the demo
    only relies on this function returning a list of strings.
    """
    guards = getattr(compiled, "_bytegraph_guards", None)
    if guards is None:
        return ["(guard listing not available yet)"]
    if callable(guards):
        guards = guards()
    if isinstance(guards, str):
        return guards.splitlines() or ["(no guards)"]
    lines = [str(g) for g in guards]
    return lines or ["(no guards)"]


def _median_us(fn, args, runs, warmup=5):
    """Median wall time of ``fn(*args)`` in microseconds, over ``runs`` calls after ``warmup``."""
    for _ in range(warmup):
        fn(*args)
    times = []
    for _ in range(runs):
        t0 = time.perf_counter_ns()
        fn(*args)
        times.append(time.perf_counter_ns() - t0)
    return statistics.median(times) / 1e3


def _indent(text, prefix="    "):
    return "\n".join(prefix + line if line else line for line in text.splitlines())


def demo_model(name, backend, runs, show_graphs):
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
        for line in _describe_guards(compiled):
            print(f"  {line}")

        eager_us = _median_us(model, inputs, runs)
        compiled_us = _median_us(compiled, inputs, runs)
    print()
    return dict(model=name, graphs=counter.frame_count, ops=counter.op_count, same=same,
                first_ms=first_ms, eager_us=eager_us, compiled_us=compiled_us)


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
    print(f"summary (median per call over {runs} runs, after warm-up; speedup = eager / compiled)")
    print(RULE)
    print(line(headers))
    print(line(["-" * w for w in widths]))
    for row in body:
        print(line(row))
    for r in rows:
        if "error" in r:
            print(f"{r['model']}: {r['error']}")


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m bytegraph.demo", description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=BACKENDS, default="eager",
                        help="backend the captured graphs are handed to (default: eager)")
    parser.add_argument("--model", action="append", choices=DEMO_MODELS,
                        help="model to show (repeatable; default: all)")
    parser.add_argument("--runs", type=int, default=50, help="timed calls per model (default: 50)")
    parser.add_argument("--no-graphs", action="store_true", help="do not print the captured graphs' code")
    args = parser.parse_args(argv)

    print(f"bytegraph {getattr(bytegraph, '__version__', '?')}, torch {torch.__version__}, "
          f"python {sys.version.split()[0]}, {torch.get_num_threads()} threads")
    rows = []
    for name in args.model or DEMO_MODELS:
        try:
            rows.append(demo_model(name, args.backend, args.runs, not args.no_graphs))
        except Exception as e:  # keep going: show the other models, report the failure
            print(f"FAILED: {type(e).__name__}: {e}\n")
            rows.append(dict(model=name, error=f"{type(e).__name__}: {e}"))
    _table(rows, args.runs)
    failed = any("error" in r or not r["same"] for r in rows)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

"""bytegraph against torch.compile, side by side, in one process.

    python bench/compare.py [--only NAME[,NAME]] [--repeat N] [--json PATH]

For every subject in bench/models.py and for each compiler it measures

* capture: wall time of the first call after a reset, with backend="eager"
  (so it is the front end's work: bytecode analysis, tracing, guard building);
  median of --repeat fresh compilations;
* overhead: per-call time of the compiled callable minus that of the plain
  eager callable, backend="eager", after warm-up; timeit-style loops sized to
  about --target-ms each, eager and compiled interleaved, best of --repeat;
* graphs / ops: how many graphs the backend received and how many call nodes
  they hold, with each library's CompileCounter as backend; the result is
  checked against eager.

Everything runs under torch.no_grad() with models in eval mode. A failure in
one compiler (including bytegraph failing to import at all) is shown in its
cells of the table and listed below it; the other numbers are still produced.
See bench/README.md for the columns.
"""
import argparse
import contextlib
import gc
import json
import math
import platform
import signal
import statistics
import sys
import time
import traceback
from pathlib import Path

_ROOT = Path(__file__).resolve().parent.parent
if str(_ROOT) not in sys.path:
    sys.path.insert(0, str(_ROOT))
# BYTEGRAPH_ROOT: measure the bytegraph of another checkout (bench/before_after.py).
import os  # noqa: E402
if os.environ.get("BYTEGRAPH_ROOT"):
    sys.path.insert(0, os.environ["BYTEGRAPH_ROOT"])

import torch  # noqa: E402
import torch._dynamo  # noqa: E402
import torch._dynamo.testing  # noqa: E402

from bench.models import SUBJECTS  # noqa: E402


class MeasureError(Exception):
    """A measurement failed; the message is what goes into the report."""


class Compiler:
    """One JIT front end under test: how to compile, reset and count graphs with it."""

    def __init__(self, key, label, compile_fn=None, reset_fn=None, counter_cls=None, import_error=None):
        self.key = key                  # short name used in JSON
        self.label = label              # column header
        self.compile = compile_fn
        self.reset = reset_fn
        self.counter_cls = counter_cls
        self.import_error = import_error


def torch_compiler():
    return Compiler("torch_compile", "torch.compile", torch.compile, torch._dynamo.reset,
                    torch._dynamo.testing.CompileCounter)


def bytegraph_compiler():
    try:
        import bytegraph
        import bytegraph.testing
        bytegraph.config.persistent_cache = False   # measure compiles, not loads from an earlier run's cache
        return Compiler("bytegraph", "bytegraph", bytegraph.compile, bytegraph.reset,
                        bytegraph.testing.CompileCounter)
    except Exception as e:
        return Compiler("bytegraph", "bytegraph", import_error=f"import failed: {_describe(e)}")


def _describe(e):
    text = str(e).strip().splitlines()
    first = text[0] if text else ""
    if len(first) > 300:
        first = first[:297] + "..."
    return f"{type(e).__name__}: {first}" if first else type(e).__name__


@contextlib.contextmanager
def _time_limit(seconds):
    """Raise TimeoutError in this (main) thread if the block runs longer than ``seconds``."""
    if not seconds or not hasattr(signal, "setitimer"):
        yield
        return

    def on_alarm(signum, frame):
        raise TimeoutError(f"gave up after {seconds:g} s")

    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def _same(a, b):
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.shape == b.shape and torch.allclose(a, b, rtol=1e-5, atol=1e-6)
    if isinstance(a, (tuple, list)):
        return isinstance(b, (tuple, list)) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):   # includes transformers' ModelOutput
        return type(a) is type(b) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if type(a).__eq__ is object.__eq__ and hasattr(a, "__dict__"):
        return type(a) is type(b) and _same(vars(a), vars(b))
    return a == b


def _per_call_s(fn, args, number):
    start = time.perf_counter()
    for _ in range(number):
        fn(*args)
    return (time.perf_counter() - start) / number


@contextlib.contextmanager
def _gc_off():
    gc.collect()
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def measure_capture(comp, fn, inputs, repeat):
    """First-call times (ms) of ``repeat`` fresh compilations with backend="eager"."""
    times = []
    for _ in range(repeat):
        comp.reset()
        compiled = comp.compile(fn, backend="eager")
        start = time.perf_counter()
        compiled(*inputs)
        times.append((time.perf_counter() - start) * 1e3)
    return times


def measure_overhead(comp, fn, inputs, repeat, target_s, min_number):
    """Best per-call time (µs) of eager and compiled (backend="eager") over ``repeat`` interleaved loops."""
    comp.reset()
    compiled = comp.compile(fn, backend="eager")
    for _ in range(3):  # compile, then settle caches
        compiled(*inputs)
        fn(*inputs)
    one = max(_per_call_s(compiled, inputs, 3), _per_call_s(fn, inputs, 3))
    number = max(min_number, math.ceil(target_s / max(one, 1e-7)))
    eager, comp_times = [], []
    with _gc_off():
        for _ in range(repeat):
            eager.append(_per_call_s(fn, inputs, number) * 1e6)
            comp_times.append(_per_call_s(compiled, inputs, number) * 1e6)
    return dict(number=number, eager_us=min(eager), compiled_us=min(comp_times),
                eager_us_all=eager, compiled_us_all=comp_times,
                overhead_us=min(comp_times) - min(eager))


def measure_counts(comp, fn, inputs):
    """Graphs and ops the backend received (over two calls, so recompiles show), and correctness."""
    comp.reset()
    counter = comp.counter_cls()
    compiled = comp.compile(fn, backend=counter)
    expected = fn(*inputs)
    first = compiled(*inputs)
    second = compiled(*inputs)
    return dict(graphs=counter.frame_count, ops=counter.op_count,
                same=bool(_same(expected, first) and _same(expected, second)))


def run_subject(comp, subject, args):
    """All measurements of one subject with one compiler; failures recorded, not raised."""
    res = dict(errors={})
    if comp.import_error:
        res["errors"]["all"] = comp.import_error
        return res
    fn, inputs = subject.make()
    phases = (
        ("counts", lambda: res.update(measure_counts(comp, fn, inputs))),
        ("capture", lambda: res.update(capture_ms_all=(t := measure_capture(comp, fn, inputs, args.repeat)),
                                       capture_ms=statistics.median(t))),
        ("overhead", lambda: res.update(measure_overhead(comp, fn, inputs, args.repeat,
                                                         args.target_ms / 1e3, args.min_number))),
    )
    for phase, run in phases:
        try:
            with torch.no_grad(), _time_limit(args.timeout):
                run()
        except Exception as e:
            res["errors"][phase] = _describe(e)
            if args.traceback:
                traceback.print_exc()
            if isinstance(e, TimeoutError):  # likely to hang again: skip the remaining phases
                break
    if res.get("same") is False:
        res["errors"]["result"] = "compiled result differs from eager"
    try:
        comp.reset()
    except Exception:
        pass
    return res


def warm_up(comp):
    """One throwaway compilation, so one-time imports are not charged to the first subject."""
    if comp.import_error:
        return
    def _warm(x):
        return torch.relu(x * 2) + 1
    try:
        with torch.no_grad(), _time_limit(120):
            comp.reset()
            comp.compile(_warm, backend="eager")(torch.ones(4))
            comp.reset()
    except Exception:
        pass  # the real measurements will report it


# ---------------------------------------------------------------- report

def _fmt(value, spec):
    return "-" if value is None else format(value, spec)


def _ratio(a, b):
    if a is None or b is None or b <= 0 or a < 0:
        return "n/a" if a is not None and b is not None else "-"
    return f"{a / b:.2f}x"


def _cell(res, key, spec):
    if key in res:
        return _fmt(res[key], spec)
    return "ERR" if res["errors"] else "-"


def print_table(rows, bg, tc):
    groups = [("", 1), ("capture ms (1st call)", 3), ("overhead µs/call", 3), ("graphs", 2), ("ops", 2)]
    headers = ["subject", "bytegraph", "torch", "ratio", "bytegraph", "torch", "ratio",
               "bg", "tc", "bg", "tc"]
    body = []
    for row in rows:
        b, t = row[bg.key], row[tc.key]
        body.append([
            row["subject"] + (" *" if b["errors"] or t["errors"] else ""),
            _cell(b, "capture_ms", ".1f"), _cell(t, "capture_ms", ".1f"),
            _ratio(b.get("capture_ms"), t.get("capture_ms")),
            _cell(b, "overhead_us", ".1f"), _cell(t, "overhead_us", ".1f"),
            _ratio(b.get("overhead_us"), t.get("overhead_us")),
            _cell(b, "graphs", "d"), _cell(t, "graphs", "d"),
            _cell(b, "ops", "d"), _cell(t, "ops", "d"),
        ])
    widths = [max(len(h), *(len(r[i]) for r in body)) if body else len(h) for i, h in enumerate(headers)]
    sep = " | "
    # widen the last column of a group if the group label is longer than its columns
    col = 0
    for label, span in groups:
        have = sum(widths[col:col + span]) + 2 * (span - 1)
        if len(label) > have:
            widths[col + span - 1] += len(label) - have
        col += span

    def fmt_row(cells):
        out, col = [], 0
        for _, span in groups:
            part = [cells[i].ljust(widths[i]) if i == 0 else cells[i].rjust(widths[i])
                    for i in range(col, col + span)]
            out.append("  ".join(part))
            col += span
        return sep.join(out)

    group_cells, col = [], 0
    for label, span in groups:
        group_cells.append(label.center(sum(widths[col:col + span]) + 2 * (span - 1)))
        col += span
    print(sep.join(group_cells).rstrip())
    print(fmt_row(headers))
    print(fmt_row(["-" * w for w in widths]))
    for r in body:
        print(fmt_row(r))
    notes = []
    for row in rows:
        for comp in (bg, tc):
            for phase, msg in row[comp.key]["errors"].items():
                notes.append(f"  {row['subject']}: {comp.label} [{phase}] {msg}")
    if notes:
        print("\n* errors:")
        # one import failure would otherwise repeat on every row
        seen = set()
        for n in notes:
            key = n.split(": ", 1)[1] if "[all]" in n else n
            if key not in seen:
                seen.add(key)
                print(n if "[all]" not in n else "  (all subjects): " + key)
    print("\nratio = bytegraph / torch.compile (below 1: bytegraph is faster). "
          "Both use backend=\"eager\" for times.")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", action="append", metavar="NAME",
                        help=f"subjects to run (repeatable or comma-separated): {', '.join(SUBJECTS)}")
    parser.add_argument("--repeat", type=int, default=5, help="repeats per measurement (default 5)")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON to PATH")
    parser.add_argument("--target-ms", type=float, default=100.0,
                        help="length of one timing loop in ms (default 100)")
    parser.add_argument("--min-number", type=int, default=20,
                        help="fewest calls in one timing loop (default 20)")
    parser.add_argument("--timeout", type=float, default=120.0,
                        help="seconds one measurement may take before it and the subject's remaining "
                             "measurements are abandoned (default 120; 0: none)")
    parser.add_argument("--traceback", action="store_true", help="print tracebacks of failures to stderr")
    parser.add_argument("--bytegraph-only", action="store_true",
                        help="measure bytegraph alone (torch.compile's columns stay empty)")
    args = parser.parse_args(argv)

    names = [n.strip() for item in (args.only or [",".join(SUBJECTS)]) for n in item.split(",") if n.strip()]
    unknown = [n for n in names if n not in SUBJECTS]
    if unknown:
        parser.error(f"unknown subject(s) {', '.join(unknown)}; known: {', '.join(SUBJECTS)}")
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")

    bg, tc = bytegraph_compiler(), torch_compiler()
    meta = dict(torch=torch.__version__, python=platform.python_version(), machine=platform.machine(),
                threads=torch.get_num_threads(), repeat=args.repeat, target_ms=args.target_ms)
    print(f"torch {meta['torch']}, python {meta['python']}, {meta['threads']} threads, "
          f"repeat {args.repeat}", flush=True)
    if args.bytegraph_only:
        tc = Compiler("torch_compile", "torch.compile", import_error="not measured (--bytegraph-only)")
    for comp in (tc, bg):
        warm_up(comp)

    rows = []
    for name in names:
        subject = SUBJECTS[name]
        print(f"  {name}: {subject.description} ...", flush=True)
        row = dict(subject=name, description=subject.description)
        for comp in (tc, bg):
            row[comp.key] = run_subject(comp, subject, args)
        rows.append(row)
    print()
    print_table(rows, bg, tc)

    if args.json:
        Path(args.json).write_text(json.dumps(dict(meta=meta, results=rows), indent=2) + "\n")
        print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Where compile time goes, per frame and phase: ``bytegraph.compile_times()``."""
from __future__ import annotations

import time
from collections import defaultdict
from contextlib import contextmanager

from ..errors import BytegraphError

PHASES = ("bytecode tracing", "fake-tensor propagation", "guard building", "code generation",
          "backend compile")

# frame name -> phase -> seconds (summed over that frame's compiles)
_times = defaultdict(lambda: defaultdict(float))
_counts = defaultdict(int)


@contextmanager
def phase(frame_name, name):
    t0 = time.perf_counter()
    try:
        yield
    finally:
        _times[frame_name][name] += time.perf_counter() - t0


def add(frame_name, name, seconds):
    _times[frame_name][name] += seconds


def count_compile(frame_name):
    _counts[frame_name] += 1


def clear():
    _times.clear()
    _counts.clear()


def compile_times(repr: str = "str", aggregate: bool = False) -> str | dict | tuple:
    """Time spent compiling, per frame and phase.

    ``repr="str"`` (default): a table. ``repr="dict"``: ``{frame: {phase: seconds}, "total": {...}}``.
    ``repr="csv"``: ``(header, rows)``. ``aggregate=True``: totals only.
    """
    if repr not in ("str", "dict", "csv"):
        raise BytegraphError(f"compile_times: repr must be 'str', 'dict' or 'csv', got {repr!r}")
    total = {p: sum(t.get(p, 0.0) for t in _times.values()) for p in PHASES}
    if repr == "dict":
        out = {} if aggregate else {name: dict(t) for name, t in _times.items()}
        out["total"] = total
        return out
    rows = [] if aggregate else [(name, _counts[name]) + tuple(t.get(p, 0.0) for p in PHASES)
                                 for name, t in _times.items()]
    rows.append(("total", sum(_counts.values())) + tuple(total[p] for p in PHASES))
    header = ("frame", "compiles") + PHASES
    if repr == "csv":
        return header, rows
    widths = [max(len(header[0]), *(len(r[0]) for r in rows)), 8] + [max(len(p), 9) for p in PHASES]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths))]
    for r in rows:
        cells = [r[0].ljust(widths[0]), str(r[1]).rjust(widths[1])]
        cells += [f"{v * 1000:.1f} ms".rjust(w) for v, w in zip(r[2:], widths[2:])]
        lines.append("  ".join(cells))
    return "\n".join(lines)

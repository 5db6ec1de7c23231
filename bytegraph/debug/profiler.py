"""``CompileProfiler``: a backend and a context manager that reports what compilation did.

    with CompileProfiler() as prof:
        compiled = bytegraph.compile(fn, backend=prof)
        compiled(x)
    print(prof.report())

Inside the ``with`` block ``config.cache_size_limit`` is 1, so every recompile
shows up as a guard failure in the report (the worst case).
"""
from __future__ import annotations

from typing import Callable

import torch

from ..config import config
from . import records
from .counting import count_ops


class CompileProfiler:
    def __init__(self) -> None:
        self.graphs: list[torch.fx.GraphModule] = []
        self._frames_start = 0
        self._recompiles_start = 0
        self._patch = None
        self.__name__ = "CompileProfiler"

    # --- as a backend --------------------------------------------------------------------
    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list) -> Callable:
        self.graphs.append(gm)
        return gm.forward

    # --- as a context manager ------------------------------------------------------------
    def __enter__(self) -> CompileProfiler:
        self._frames_start = len(records.frames)
        self._recompiles_start = len(records.recompiles)
        self._patch = config.patch(cache_size_limit=1)
        self._patch.__enter__()
        return self

    def __exit__(self, *exc) -> bool:
        self._patch.__exit__(*exc)
        self._frames = records.frames[self._frames_start:]
        self._recompiles = records.recompiles[self._recompiles_start:]
        return False

    def _collected(self):
        frames = getattr(self, "_frames", None)
        if frames is None:   # report() inside the with-block
            frames = records.frames[self._frames_start:]
            recompiles = records.recompiles[self._recompiles_start:]
        else:
            recompiles = self._recompiles
        return frames, recompiles

    def report(self) -> str:
        frames, recompiles = self._collected()
        breaks = [f for f in frames if f.break_reason or f.fallback_reason]
        names = []
        for f in frames:
            if f.name not in names:
                names.append(f.name)
        lines = ["Compile profile",
                 f"  frames compiled: {len(frames)} ({len(names)} distinct code objects)",
                 f"  graphs: {len(self.graphs)}, ops: {sum(count_ops(g) for g in self.graphs)}",
                 f"  graph breaks: {len(breaks)}",
                 f"  recompiles: {len(recompiles)}"]
        lines.append("Frames:")
        for name in names:
            mine = [f for f in frames if f.name == name]
            f0 = mine[0]
            lines.append(f"  {name} ({f0.filename}:{f0.firstlineno}): compiled {len(mine)} time(s)")
        if breaks:
            lines.append("Graph break reasons:")
            for i, f in enumerate(breaks, 1):
                reason = f.break_reason or f.fallback_reason
                where = f.user_stack[-1] if f.user_stack else None
                at = f" at {where.filename}:{where.lineno}" if where else ""
                eager = "" if f.break_reason else " (the rest of the frame ran eagerly)"
                lines.append(f"  {i}. {reason}{at}{eager}")
        if recompiles:
            lines.append("Recompiles (cache_size_limit is 1 while profiling, so each shows):")
            for i, r in enumerate(recompiles, 1):
                lines.append(f"  {i}. {r.name} ({r.filename}:{r.firstlineno}): failed guard: {r.reason}")
        else:
            lines.append("No recompiles.")
        return "\n".join(lines) + "\n"

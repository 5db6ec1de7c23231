"""``BYTEGRAPH_DEBUG_DIR`` / ``config.debug_dir``: what each compile did, written to disk.

Per process (a *run*) one folder ``run_<date>_<time>_<pid>`` under the directory; in it one
folder per compiled frame, ``NNN_<function>`` in compile order, holding:

    frame.json                 what the report reads: outcome, break, guards, graphs, timings
    source.txt                 the function's source lines, numbered
    original_bytecode.txt      dis listing of the code compiled (a resume function's own code)
    recompile_reason.txt       for a recompile: the guard of the previous entry that failed
    graph_1.py, graph_1_table.txt    the FX graph as readable code, and as a table of nodes
    guards.txt                 the guards, in the user's terms
    guard_function.py          the generated guard function
    transformed_function.py    the generated function the cache entry runs
    resume_in_*.txt, step_in_*.txt   dis listings of the resume and step functions of a break
    backend_*.py               what the backend made: AOTAutograd graphs, inductor's output code
    timings.json               seconds per phase of this compile

``index.json`` at the run's root lists every frame with the contents of its ``frame.json``,
plus recompiles that gave up (cache limit) and the versions used. It is rewritten after each
frame, so it is complete even when the program dies later.

The runtime calls in at a few points (``compile_frame``: start, graph, end; ``codegen.breaks``:
each resume/step function; ``dispatch``: a recompile that gives up); the inner-compiler hook
of the backends adds their output. Nothing here runs when the setting is empty.
"""
import dis
import inspect
import json
import linecache
import os
import platform
import sys
import threading
import time
import traceback
from collections import Counter

import torch

from ..config import DIRECTORY_SETTINGS, config, writable_dir_problem
from ..errors import ConfigError
from ..stacks import CUT_FROM, code_name, is_library
from .counting import count_ops

_lock = threading.Lock()
_run = None          # the _Run being written, for the current value of config.debug_dir
_active = []         # FrameDumps of the compiles in progress, innermost last


def enabled():
    return bool(config.debug_dir)


class _Run:
    def __init__(self, root):
        stamp = time.strftime("%Y%m%d_%H%M%S")
        self.setting = root
        self.path = os.path.join(os.path.abspath(root), f"run_{stamp}_{os.getpid()}")
        make_setting_dir(self.path, "debug_dir")
        self.frames = []          # FrameDumps, in compile order
        self.gave_up = []         # recompiles that hit a cache limit (no frame folder)
        self.started = time.time()

    def save_index(self):
        index = {
            "format": "bytegraph-debug-dir/1",
            "run": os.path.basename(self.path),
            "started": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.started)),
            "pid": os.getpid(),
            "argv": list(sys.argv),
            "versions": {"python": platform.python_version(), "torch": torch.__version__,
                         "bytegraph": _bytegraph_version()},
            "frames": [f.summary() for f in self.frames],
            "recompiles_given_up": list(self.gave_up),
        }
        _write_json(os.path.join(self.path, "index.json"), index)


def current_run():
    """The run folder being written (made on first use), or None when the setting is empty."""
    global _run
    root = config.debug_dir
    if not root:
        return None
    if _run is None or _run.setting != root:
        _run = _Run(root)
    return _run


def run_subdir(name):
    """A folder ``name`` inside the current run (made), or None when the debug dir is off."""
    run = current_run()
    if run is None:
        return None
    path = os.path.join(run.path, name)
    make_setting_dir(path, "debug_dir")
    return path


class FrameDump:
    """The folder of one compiled frame."""

    def __init__(self, run, fn, recompile_reason, cache_entries):
        code = fn.__code__
        self.run = run
        self.number = len(run.frames) + 1
        self.folder_name = f"{self.number:03d}_{_clean(code_name(code))}"
        self.path = os.path.join(run.path, self.folder_name)
        make_setting_dir(self.path, "debug_dir")
        original = CUT_FROM.get(code, code)
        self.info = {
            "number": self.number,
            "folder": self.folder_name,
            "name": getattr(code, "co_qualname", code.co_name),
            "filename": code.co_filename,
            "firstlineno": code.co_firstlineno,
            "resume_of": (getattr(original, "co_qualname", original.co_name) if original is not code else None),
            "code_key": f"{original.co_filename}:{original.co_firstlineno}:{code_name(code)}",
            "cache_entry": cache_entries + 1,   # this compile's entry is the n-th for its code object
            "recompile_reason": recompile_reason,
            "outcome": "compiling",
            "graphs": [],
            "guards": [],
            "generated": [],
            "backend_output": [],
            "timings": {},
            "files": {},
        }
        self.graphs = 0
        run.frames.append(self)
        self.write("source.txt", _numbered_source(original), "the function's source lines")
        self.write("original_bytecode.txt", dis.Bytecode(code).dis(), "dis listing of the compiled code")
        if recompile_reason:
            self.write("recompile_reason.txt", recompile_reason + "\n",
                       "why the previous cache entry did not apply (its first failing guard)")
        self.save()

    # --- files ----------------------------------------------------------------------------
    def write(self, name, text, what):
        with open(os.path.join(self.path, name), "w", encoding="utf-8") as f:
            f.write(str(text))   # guard source is written lazily (guards.builder.GuardText)
        self.info["files"][name] = what

    def save(self):
        with _lock:
            _write_json(os.path.join(self.path, "frame.json"), self.info)
            self.run.save_index()

    def summary(self):
        return self.info

    # --- what compile_frame and codegen report ---------------------------------------------
    def graph(self, gm, example_inputs, backend_name):
        """The FX graph handed to the backend; returns its entry (for the backend's timing)."""
        self.graphs += 1
        k = self.graphs
        code_file, table_file = f"graph_{k}.py", f"graph_{k}_table.txt"
        self.write(code_file, gm.print_readable(print_output=False), f"FX graph {k} as code")
        self.write(table_file, tabular(gm), f"FX graph {k}, one row per node")
        entry = {"number": k, "file": code_file, "table": table_file, "ops": count_ops(gm),
                 "op_counts": dict(op_counts(gm)), "inputs": _describe_inputs(example_inputs),
                 "backend": backend_name, "backend_seconds": None}
        self.info["graphs"].append(entry)
        self.save()
        return entry

    def generated_code(self, kind, code):
        """A resume or step function made while generating this frame's code."""
        label = code_name(code)
        name = f"{_clean(label)}.txt"
        if name in self.info["files"]:
            return
        self.write(name, dis.Bytecode(code).dis(), f"dis listing of the {kind} {label}")
        self.info["generated"].append({"kind": kind, "name": label, "file": name})
        self.save()

    def backend_output(self, kind, text):
        """Something the backend made for a graph of this frame (possibly later, at backward)."""
        n = len(self.info["backend_output"]) + 1
        name = f"backend_{n}_{_clean(kind)}.py"
        self.write(name, text, kind.replace("_", " "))
        self.info["backend_output"].append({"kind": kind, "file": name})
        self.save()

    def finish(self, outcome, timings, guards=(), guard_source="", transformed_source="",
               reason=None, hint=None, user_stack=()):
        self.info["outcome"] = outcome
        self.info["timings"] = {k: round(v, 6) for k, v in timings.items()}
        self.info["guards"] = [g.describe() for g in guards]
        if guards:
            self.write("guards.txt", "".join(f"- {g.describe()}\n" for g in guards), "the guards, in the user's terms")
        if guard_source:
            self.write("guard_function.py", guard_source, "the generated guard function")
        if transformed_source:
            self.write("transformed_function.py", transformed_source, "the generated transformed function")
        if reason is not None:
            self.info["break"] = {"reason": reason, "hint": hint, "stack": [_stack_entry(e) for e in user_stack]}
        self.write("timings.json", json.dumps(self.info["timings"], indent=2) + "\n", "seconds per phase")
        self.save()


class _Off:
    """Stands for a FrameDump when the debug dir is off: every call does nothing."""

    def __getattr__(self, name):
        return _nothing


def _nothing(*args, **kwargs):
    return None


OFF = _Off()


def begin_frame(fn, cache):
    """Start the folder of a frame about to be compiled (or OFF when the setting is empty)."""
    run = current_run()
    if run is None:
        return OFF
    reason = cache.recompile_reasons[-1] if cache is not None and cache.entries else None
    dump = FrameDump(run, fn, reason, len(cache.entries) if cache is not None else 0)
    _active.append(dump)
    return dump


def end_frame(dump):
    if dump is not OFF and _active and _active[-1] is dump:
        _active.pop()


def current_frame():
    """The FrameDump of the compile in progress (OFF when none or the setting is empty)."""
    return _active[-1] if _active and enabled() else OFF


def generated_code(kind, code):
    current_frame().generated_code(kind, code)


def recompile_given_up(record):
    run = current_run()
    if run is None:
        return
    run.gave_up.append({"name": record.name, "filename": record.filename, "firstlineno": record.firstlineno,
                        "reason": record.reason})
    with _lock:
        run.save_index()


# --- formatting --------------------------------------------------------------------------
def op_name(node):
    target = node.target
    if node.op == "call_method":
        return f".{target}"
    return getattr(target, "__name__", None) or str(target)


def op_counts(gm):
    return Counter(op_name(n) for n in gm.graph.nodes if n.op in ("call_function", "call_method", "call_module"))


def tabular(gm):
    """A table of ``gm``'s nodes (opcode, name, target, args, kwargs), like ``print_tabular``
    without its extra dependency."""
    rows = [("opcode", "name", "target", "args", "kwargs")]
    for n in gm.graph.nodes:
        target = n.target if isinstance(n.target, str) else op_name(n)
        rows.append((n.op, n.name, str(target), str(n.args), str(n.kwargs)))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = []
    for i, r in enumerate(rows):
        lines.append("  ".join(c.ljust(w) for c, w in zip(r[:4], widths)) + "  " + r[4])
        if i == 0:
            lines.append("  ".join("-" * w for w in widths) + "  " + "-" * 6)
    return "\n".join(line.rstrip() for line in lines) + "\n"


def _describe_inputs(example_inputs):
    out = []
    for x in example_inputs:
        if isinstance(x, torch.Tensor):
            out.append(f"{str(x.dtype).replace('torch.', '')}{list(x.shape)}")
        else:
            out.append(f"{type(x).__name__} {x}")
    return out


def _numbered_source(code):
    try:
        lines, first = inspect.getsourcelines(code)
    except (OSError, TypeError):
        return f"(no source for {code.co_name} in {code.co_filename})\n"
    first = max(first, 1)
    header = f"# {code.co_filename}, lines {first}-{first + len(lines) - 1}\n"
    return header + "".join(f"{first + i:5d}  {line}" for i, line in enumerate(lines))


def _stack_entry(entry, context=3):
    """A user-stack entry as JSON, with the lines around it (the report has no files to read)."""
    lineno = entry.lineno or 0
    first = max(1, lineno - context)
    lines = [linecache.getline(entry.filename, i).rstrip("\n") for i in range(first, lineno + context + 1)]
    while lines and not lines[-1].strip():
        lines.pop()
    return {"filename": entry.filename, "lineno": lineno, "name": entry.name,
            "line": (entry.line or "").strip() if isinstance(entry, traceback.FrameSummary) else "",
            "colno": getattr(entry, "colno", None), "end_colno": getattr(entry, "end_colno", None),
            "end_lineno": getattr(entry, "end_lineno", None), "library": is_library(entry.filename),
            "context": {"first": first, "lines": lines}}


def make_setting_dir(path, setting):
    """Make directory ``path`` for setting ``setting`` (a ConfigError naming the setting if it cannot be)."""
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as e:
        var = DIRECTORY_SETTINGS[setting]
        raise ConfigError(f"bytegraph.config.{setting} ({var}) = {getattr(config, setting)!r}: cannot make "
                          f"{path}: {e.strerror or e}") from e
    problem = writable_dir_problem(path)
    if problem:
        var = DIRECTORY_SETTINGS[setting]
        raise ConfigError(f"bytegraph.config.{setting} ({var}) = {getattr(config, setting)!r} cannot be "
                          f"written to: {problem}")


def output_dir(setting, subdir, fallback):
    """Where a tool writes its files: ``config.<setting>`` when set (made, or a ConfigError naming
    the setting), else ``subdir`` of the debug directory's run folder, else ./``fallback``."""
    chosen = getattr(config, setting)
    if chosen:
        make_setting_dir(chosen, setting)
        return chosen
    inside = run_subdir(subdir)
    if inside is not None:
        return inside
    path = os.path.abspath(fallback)
    os.makedirs(path, exist_ok=True)
    return path


def _write_json(path, data):
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=1, default=str)
    os.replace(tmp, path)


def _clean(name):
    return "".join(c if c.isalnum() or c == "_" else "_" for c in name)[:80]


def _bytegraph_version():
    mod = sys.modules.get("bytegraph")
    return getattr(mod, "__version__", "?")

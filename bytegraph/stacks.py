"""The user's stack at a graph break or ``fullgraph`` error, and how it is shown.

A stack is a list of ``traceback.FrameSummary``, outermost first: the compiled
function, then one entry per inlined call (helpers, module ``forward``s, methods,
lambdas, comprehensions, generators, ``__enter__``/``__exit__``, special methods),
down to the failing instruction. Each entry has the file, line, the function's
qualified name and, where the code has them, the columns of the expression.

Frames in *library* code (the standard library, torch, bytegraph) are kept in
the data but shown on one line, marked ``[library]``, and long runs of them are
cut to their ends: the user cannot edit them, yet the first says which library
call their line made and the innermost says what failed. Third-party packages
(transformers, timm...) count as user code: they are the models people compile.
"""
import os
import sys
import sysconfig
import traceback
from functools import lru_cache

LIBRARY_TAG = "[library]"
# A run of more library frames than this shows only its first and last frame.
_LIBRARY_RUN = 2


def frame_summary(code, ins):
    """The entry for a frame of ``code`` running instruction ``ins`` (None: not started)."""
    original = _original_code(code)
    name = getattr(original, "co_qualname", original.co_name)
    if ins is None:
        return traceback.FrameSummary(code.co_filename, code.co_firstlineno, name)
    lineno, end_lineno, colno, end_colno = _position(code, ins.offset)
    if lineno is None or (ins.line is not None and lineno != ins.line):
        return traceback.FrameSummary(code.co_filename, ins.line, name)
    return traceback.FrameSummary(code.co_filename, lineno, name, end_lineno=end_lineno,
                                  colno=colno, end_colno=end_colno)


def function_entry(fn):
    """An entry for a function as a whole (its ``def`` line), for errors met outside any frame."""
    code = fn.__code__
    return traceback.FrameSummary(code.co_filename, code.co_firstlineno,
                                  getattr(_original_code(code), "co_qualname", code.co_name))


# resume/step code -> the user's code it was cut from; filled by codegen.breaks, which owns
# resume code (this module sits below it, for errors.py to format with).
CUT_FROM = {}


def _original_code(code):
    """A resume function stands for the user's function it was cut from."""
    return CUT_FROM.get(code, code)


def code_name(code):
    """The name bytegraph gives ``code`` in its logs, files and generated names. A resume or
    step function keeps the user's function's ``co_name`` (what its frames show: tracebacks, a
    log record's function) and is told apart by its ``co_qualname``
    (``resume_in_f_at_line_12``)."""
    return code.co_qualname if code in CUT_FROM else code.co_name


@lru_cache(maxsize=4096)
def _positions(code):
    return tuple(code.co_positions())


def _position(code, offset):
    positions = _positions(code)
    i = offset // 2
    return positions[i] if i < len(positions) else (None, None, None, None)


@lru_cache(maxsize=1)
def _library_roots():
    paths = sysconfig.get_paths()
    site = {os.path.realpath(paths[k]) for k in ("purelib", "platlib") if paths.get(k)}
    stdlib = {os.path.realpath(paths[k]) for k in ("stdlib", "platstdlib") if paths.get(k)}
    packages = set()
    for mod in ("torch", "bytegraph"):
        m = sys.modules.get(mod)
        if m is not None and getattr(m, "__file__", None):
            packages.add(os.path.dirname(os.path.realpath(m.__file__)))
    return tuple(stdlib), tuple(site), tuple(packages)


def _under(path, roots):
    return any(path == r or path.startswith(r + os.sep) for r in roots)


@lru_cache(maxsize=4096)
def is_library(filename):
    """True for the standard library, torch and bytegraph; False for the user's code."""
    if filename.startswith("<frozen "):
        return True
    if filename.startswith("<"):
        return False   # <string>, <stdin>: code the user generated
    path = os.path.realpath(filename)
    stdlib, site, packages = _library_roots()
    if _under(path, packages):
        return True
    return _under(path, stdlib) and not _under(path, site)


def _format_entry(entry, with_source):
    text = traceback.StackSummary().format_frame_summary(entry)
    if not with_source:
        text = text.split("\n", 1)[0] + "\n"
    return text


def format_stack(stack, indent="  "):
    """Traceback-style lines for ``stack`` (outermost first), library frames marked and cut."""
    lines = []
    n = len(stack)
    i = 0
    while i < n:
        if not is_library(stack[i].filename):
            lines.extend(_format_entry(stack[i], True).rstrip("\n").split("\n"))
            i += 1
            continue
        j = i
        while j < n and is_library(stack[j].filename):
            j += 1
        run = list(range(i, j))
        shown = run if len(run) <= _LIBRARY_RUN else [run[0], None, run[-1]]
        for k in shown:
            if k is None:
                lines.append(f"  ... {len(run) - 2} more library frames ...")
                continue
            # The innermost frame of all is where it failed: show its line even in a library.
            text = _format_entry(stack[k], k == n - 1).rstrip("\n").split("\n")
            text[0] += f"  {LIBRARY_TAG}"
            lines.extend(text)
        i = j
    return [indent + line[2:] if line.startswith("  ") else indent + line for line in lines]


def format_error(reason, stack, hint):
    """The text of an error or break: the reason, the user's stack, the hint."""
    lines = [reason]
    if stack:
        lines.append("from user code:")
        lines.extend(format_stack(stack))
    if hint:
        lines.append(f"hint: {hint}")
    return "\n".join(lines)

"""The minifier: ``BYTEGRAPH_REPRO_AFTER=frontend|aot`` with ``BYTEGRAPH_REPRO_LEVEL=1..4``.

``frontend`` watches the graphs bytegraph hands to the backend (the runtime wraps the backend
with :func:`wrap_backend`); ``aot`` watches the ATen graphs AOTAutograd hands to its inner
compilers (the backends wrap those with :func:`wrap_inner`, through the hook the runtime
installs). By level, a failure is:

    1  the compiler raises: write the graph and its inputs as repro.py, as they are
    2  the compiler raises: write a minimised repro.py
    3  also: the compiled graph raises when run (checked on every call)
    4  also: the compiled graph's results differ from eager (checked on the first call,
       against float64 where that can be computed); raises ``AccuracyError``

Minimising is delta debugging over the graph's nodes, then its inputs: cut the graph after the
shortest prefix that still fails, turn computed nodes into inputs (their recorded values) while
it still fails, drop outputs while it still fails; then rebuild inputs at random (recorded shape,
dtype, strides) wherever the failure does not need their values, saving the others. Each
candidate is checked in this process with the compiler under test; a candidate "still fails"
when it fails the same way (same stage, same exception type, or still inaccurate).

An inner (``aot``) failure found while the backend runs is minimised after the backend has
unwound (the frontend wrapper picks it up), outside AOTAutograd's and Inductor's contexts; one
met where no frontend wrapper waits (a backward compiled at ``backward()``) is minimised where
it is met.
"""
import functools
import os
import time
import types

import torch
from torch import fx
from torch._subclasses.fake_tensor import unset_fake_temporarily

from ..config import config
from ..errors import AccuracyError
from . import logs
from .debug_dir import output_dir
from .repro import (Input, ReproError, build_inputs, call_compiled, check, compare_with_eager, compiler_code,
                    graph_module, op_count, output_nodes, standalone, write_repro)

log = logs.get_logger("minifier")
_pending = []          # inner failures met while a frontend wrapper is running
_outer_depth = [0]     # frontend wrappers running (compiling or calling)
_frame_name = ["a graph"]   # the frame whose graph the backend is compiling (names inner failures)
_written = {}          # directory -> repro files this process wrote there


class Failure:
    """A failing graph: what failed, on what, with which compiler."""

    def __init__(self, kind, signature, detail, graph, inputs, compiler, backend_name, after, frame_name):
        self.kind = kind                  # "compile", "run" or "accuracy": which check shows it
        self.signature = tuple(signature)
        self.detail = detail
        self.graph = graph                # standalone graph
        self.inputs = inputs              # real values, one per placeholder
        self.compiler = compiler
        self.backend_name = backend_name
        self.after = after
        self.frame_name = frame_name


# --- hooks -------------------------------------------------------------------------------
def wrap_backend(compiler_fn, backend_name, frame_name):
    """``compiler_fn`` watched by the minifier (itself when ``config.repro_after`` is None)."""
    after = config.repro_after
    if after is None:
        return compiler_fn

    def compile_with_repro(gm, example_inputs):
        level = config.repro_level
        graph = lifted = None
        if after == "frontend":
            graph, lifted = standalone(gm)
        _pending.clear()
        _outer_depth[0] += 1
        _frame_name[0] = frame_name
        try:
            compiled = compiler_fn(gm, example_inputs)
        except Exception as e:
            if after == "frontend":
                fail = Failure("compile", ("compile", type(e).__name__), _one_line(e), graph,
                               list(example_inputs) + lifted, compiler_fn, backend_name, after, frame_name)
            else:
                fail = _pending.pop(0) if _pending else None
            if fail is not None:
                _handle(fail, e)
            raise
        finally:
            _outer_depth[0] -= 1
            if after == "frontend":
                _pending.clear()
        if level < 3:
            return compiled
        if after == "frontend":
            return _checked_frontend(compiled, graph, lifted, compiler_fn, backend_name, frame_name, level)
        return _outer_call(compiled)

    compile_with_repro.__name__ = getattr(compiler_fn, "__name__", "compiler")
    return compile_with_repro


def wrap_inner(inner, backend_name):
    """An AOTAutograd inner compiler watched by the minifier when ``repro_after`` is 'aot'."""
    if config.repro_after != "aot":
        return inner

    frame_name = _frame_name[0]

    def inner_with_repro(gm, example_inputs, *args, **kwargs):
        level = config.repro_level
        graph, lifted = standalone(gm)
        inputs = list(example_inputs) + lifted
        try:
            compiled = inner(gm, example_inputs, *args, **kwargs)
        except Exception as e:
            _defer_or_handle(Failure("compile", ("compile", type(e).__name__), _one_line(e), graph, inputs,
                                     inner, backend_name, "aot", frame_name), e)
            raise
        if level < 3 or not _plain_callable(compiled):
            return compiled
        return _checked_inner(compiled, graph, lifted, inner, backend_name, level, frame_name)

    inner_with_repro.__name__ = getattr(inner, "__name__", "inner_compiler")
    return inner_with_repro


def _plain_callable(compiled):
    # Inductor's inner compiler returns an OutputCode object that its caller post-processes;
    # only plain functions can be wrapped for run-time checks.
    return isinstance(compiled, (types.FunctionType, types.MethodType, functools.partial))


def _checked_frontend(compiled, graph, lifted, compiler_fn, backend_name, frame_name, level):
    state = {"compared": level < 4, "reported": False}

    def run_checked(*args):
        if not state["compared"]:
            state["compared"] = True
            before = _snapshot(list(args) + lifted)
            out = _run_or_report(compiled, args, graph, lifted, compiler_fn, backend_name, frame_name, state)
            problem = compare_with_eager(graph_module(graph), before, out)
            if problem:
                fail = Failure("accuracy", ("accuracy",), problem, graph, before, compiler_fn, backend_name,
                               "frontend", frame_name)
                raise AccuracyError(_accuracy_message(fail, _handle(fail, None)))
            return out
        return _run_or_report(compiled, args, graph, lifted, compiler_fn, backend_name, frame_name, state)

    return run_checked


def _run_or_report(compiled, args, graph, lifted, compiler_fn, backend_name, frame_name, state):
    try:
        return compiled(*args)
    except Exception as e:
        if not state["reported"]:
            state["reported"] = True
            _handle(Failure("run", ("run", type(e).__name__), _one_line(e), graph, list(args) + lifted,
                            compiler_fn, backend_name, "frontend", frame_name), e)
        raise


def _outer_call(compiled):
    """After 'aot': the frontend's compiled callable, minimising inner failures raised inside it."""
    def run_outer(*args):
        _pending.clear()
        _outer_depth[0] += 1
        try:
            return compiled(*args)
        except Exception as e:
            if _pending:
                fail = _pending.pop(0)
                path = _handle(fail, None if fail.kind == "accuracy" else e)
                if fail.kind == "accuracy":
                    raise AccuracyError(_accuracy_message(fail, path)) from e
            raise
        finally:
            _outer_depth[0] -= 1
            _pending.clear()

    return run_outer


class _InnerMismatch(Exception):
    """Raised out of an inner compiled graph whose results differ from eager, for the frontend
    wrapper to turn into an AccuracyError once the minifier has run."""


def _checked_inner(compiled, graph, lifted, inner, backend_name, level, frame_name):
    state = {"compared": level < 4, "reported": False}
    boxed = getattr(compiled, "_boxed_call", False)

    def run_inner(*call_args):
        args = list(call_args[0]) if boxed else list(call_args)
        inputs = args + lifted
        before = _snapshot(inputs) if not state["compared"] else None
        try:
            out = call_compiled(compiled, args)
        except Exception as e:
            if not state["reported"]:
                state["reported"] = True
                _defer_or_handle(Failure("run", ("run", type(e).__name__), _one_line(e), graph,
                                         before or inputs, inner, backend_name, "aot", frame_name), e)
            raise
        if before is not None:
            state["compared"] = True
            problem = compare_with_eager(graph_module(graph), before, out)
            if problem:
                fail = Failure("accuracy", ("accuracy",), problem, graph, before, inner, backend_name, "aot",
                               frame_name)
                if _outer_depth[0]:
                    _pending.append(fail)
                    raise _InnerMismatch(problem)
                raise AccuracyError(_accuracy_message(fail, _handle(fail, None)))
        return out

    if boxed:
        run_inner._boxed_call = True
    return run_inner


def _defer_or_handle(fail, exc):
    if _outer_depth[0]:
        _pending.append(fail)
    else:
        _handle(fail, exc)


# --- handling a failure --------------------------------------------------------------------
def _handle(fail, exc):
    """Write the repro of ``fail`` (minimised from level 2); note its path on ``exc``."""
    try:
        with unset_fake_temporarily():
            fail.inputs = _real(fail.inputs)
            path, summary = write_failure(fail)
        note = f"bytegraph minifier: {summary}"
    except Exception as e:   # the minifier must never hide the failure it was called for
        path, note = None, f"bytegraph minifier could not write a repro: {type(e).__name__}: {e}"
    log.debug("%s", note)
    if exc is not None:
        exc.add_note(note)
        exc._bytegraph_reported = True   # not to be hidden by running the frame natively
    return path


def _accuracy_message(fail, path):
    where = f"; repro: {path} (python {path} exits 1 while it differs)" if path else ""
    return (f"the compiled graph of {fail.frame_name} ({fail.after}, compiler {_name(fail.compiler)}) gives "
            f"results that differ from eager: {fail.detail}{where}")


def repro_directory():
    """Where repro files go: config.repro_dir, else the debug dir's run folder, else ./bytegraph_repro."""
    return output_dir("repro_dir", "repro", "bytegraph_repro")


def write_failure(fail):
    """Minimise ``fail`` (level >= 2) and write its repro; (path, one-line summary)."""
    t0 = time.perf_counter()
    level = config.repro_level
    original_ops = op_count(fail.graph)
    graph, values = fail.graph, fail.inputs
    if level >= 2:
        graph, values = minimise(fail)
    specs, saved = choose_inputs(fail, graph, values)
    directory = repro_directory()
    n = _written[directory] = _written.get(directory, 0) + 1
    name = "repro.py" if n == 1 else f"repro_{n}.py"
    path = os.path.abspath(os.path.join(directory, name))
    description = (f"{_describe(fail)}\n"
                   f"Graph of {fail.frame_name}; {'minimised from' if level >= 2 else 'as captured,'} "
                   f"{original_ops} ops{' to ' + str(op_count(graph)) if level >= 2 else ''}.")
    write_repro(path, graph, specs, saved, compiler_code(fail.compiler, fail.backend_name), fail.after, fail.kind,
                fail.signature, description)
    summary = (f"wrote {path} ({op_count(graph)} of {original_ops} ops, "
               f"{time.perf_counter() - t0:.1f}s); `python {path}` exits 1 while the failure reproduces")
    return path, summary


def _describe(fail):
    if fail.kind == "compile":
        return f"compiling the graph with {_name(fail.compiler)} raises {fail.detail}"
    if fail.kind == "run":
        return f"running the graph compiled by {_name(fail.compiler)} raises {fail.detail}"
    return f"the graph compiled by {_name(fail.compiler)} differs from eager: {fail.detail}"


def _name(obj):
    return getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None) or type(obj).__name__


def _reproduces(fail, graph, inputs):
    try:
        outcome = check(graph, inputs, fail.compiler, fail.after, fail.kind)
    except Exception:
        return False
    return outcome is not None and tuple(outcome[0]) == fail.signature


# --- delta debugging ---------------------------------------------------------------------
class _Case:
    """The failing graph with a recorded value for every node, and the subgraphs to try."""

    def __init__(self, graph, inputs):
        self.graph = graph
        self.placeholders = [n for n in graph.nodes if n.op == "placeholder"]
        self.ops = [n for n in graph.nodes if n.op in ("call_function", "call_method")]
        self.outputs = output_nodes(graph)
        self.values = dict(zip(self.placeholders, inputs))
        self._record(inputs)

    def _record(self, inputs):
        """Run the graph eagerly, keeping each node's value (what an input made from it gets)."""
        values = self.values

        class Recorder(fx.Interpreter):
            def run_node(self, n):
                out = super().run_node(n)
                if n.op != "placeholder":
                    values[n] = out
                return out

        gm = fx.GraphModule(torch.nn.Module(), self.graph)
        grad = any(isinstance(x, torch.Tensor) and x.requires_grad for x in inputs)
        try:
            with torch.set_grad_enabled(grad):
                Recorder(gm).run(*[_detached_like(x) for x in inputs])
        except Exception as e:   # eager fails too: nodes after the failure cannot become inputs
            log.debug("minifier: eager run of the graph stopped: %s", e)
        for n, v in list(values.items()):
            if n.op != "placeholder" and not _is_input_value(v):
                del values[n]

    def build(self, computed, outputs):
        """(graph, inputs) computing ``computed`` ops, every other needed node an input; None
        when no op is left."""
        inputs, ops, seen = [], set(), set()
        stack = list(outputs)
        while stack:
            n = stack.pop()
            if n in seen:
                continue
            seen.add(n)
            if n.op == "placeholder" or (n not in computed and n in self.values):
                inputs.append(n)
            else:
                ops.add(n)
                stack.extend(n.all_input_nodes)
        outs = [n for n in outputs if n in ops]
        if not outs:
            return None
        order = {n: i for i, n in enumerate(self.graph.nodes)}
        inputs.sort(key=order.__getitem__)
        g = fx.Graph()
        env = {}
        for n in inputs:
            env[n] = g.placeholder(n.name)
        for n in self.graph.nodes:
            if n in ops:
                env[n] = g.create_node(n.op, n.target, fx.map_arg(n.args, env.__getitem__),
                                       fx.map_arg(n.kwargs, env.__getitem__), name=n.name)
        g.output(tuple(env[n] for n in outs))
        return g, [self.values[n] for n in inputs]

    def live_ops(self, computed, outputs):
        built = self.build(computed, outputs)
        if built is None:
            return []
        names = {n.name for n in built[0].nodes if n.op in ("call_function", "call_method")}
        return [n for n in self.ops if n.name in names]


def minimise(fail):
    """(graph, inputs): a smaller graph that fails as ``fail`` does (``fail``'s own if none is)."""
    case = _Case(fail.graph, fail.inputs)
    tries = [0]

    def fails(computed, outputs):
        built = case.build(computed, outputs)
        if built is None:
            return False
        tries[0] += 1
        return _reproduces(fail, *built)

    everything = set(case.ops)
    outputs = list(case.outputs)
    if not fails(everything, outputs):
        log.debug("minifier: the failure does not reproduce on the graph alone; writing it unminimised")
        return fail.graph, fail.inputs
    # 1. The shortest prefix that still fails, returning its last values (binary search).
    n = len(case.ops)
    if n > 1 and fails(everything, _leaves(case.ops)):
        lo, hi = 1, n
        while lo < hi:
            mid = (lo + hi) // 2
            if fails(set(case.ops[:mid]), _leaves(case.ops[:mid])):
                hi = mid
            else:
                lo = mid + 1
        if fails(set(case.ops[:hi]), _leaves(case.ops[:hi])):
            outputs = _leaves(case.ops[:hi])
    computed = set(case.live_ops(everything, outputs))
    # 2. Computed nodes become inputs, outputs are dropped, while it fails (until nothing changes).
    for _ in range(4):
        before = (len(computed), len(outputs))
        live = case.live_ops(computed, outputs)
        kept = _ddmin(live, lambda keep: fails(set(keep), outputs))
        computed = set(kept)
        outputs = _ddmin(outputs, lambda outs: fails(computed, outs))
        computed = set(case.live_ops(computed, outputs))
        if (len(computed), len(outputs)) == before:
            break
    graph, inputs = case.build(computed, outputs)
    log.debug("minifier: %d ops -> %d after %d checks", len(case.ops), op_count(graph), tries[0])
    return graph, inputs


def _leaves(prefix):
    inside = set(prefix)
    return [n for n in prefix if not any(u in inside for u in n.users)]


def _ddmin(items, test):
    """A 1-minimal sublist of ``items`` (order kept) for which ``test`` holds (it holds for all)."""
    items = list(items)
    n = 2
    while len(items) >= 2:
        size = -(-len(items) // n)
        chunks = [items[i:i + size] for i in range(0, len(items), size)]
        reduced = False
        for chunk in chunks:
            if len(chunks) > 1 and test(chunk):
                items, n, reduced = chunk, 2, True
                break
        if not reduced:
            for chunk in chunks:
                rest = [x for x in items if x not in chunk]
                if rest and test(rest):
                    items, n, reduced = rest, max(n - 1, 2), True
                    break
        if not reduced:
            if n >= len(items):
                break
            n = min(len(items), 2 * n)
    if len(items) == 1 and test([]):
        return []
    return items


def choose_inputs(fail, graph, values):
    """(Input specs, saved tensors by key): random inputs wherever the failure reproduces
    with them, saved values for the rest (delta debugging over the inputs)."""
    names = [n.name for n in graph.nodes if n.op == "placeholder"]
    random_specs = []
    for v in values:
        try:
            random_specs.append(Input.of(v))
        except ReproError:
            random_specs.append(None)
    savable = [i for i, v in enumerate(values) if isinstance(v, torch.Tensor) and not _fake(v)]

    def specs_saving(keep):
        keep = set(keep)
        out = []
        for i, (v, spec) in enumerate(zip(values, random_specs)):
            if i in keep or spec is None:
                out.append(Input.saved(names[i], bool(getattr(v, "requires_grad", False))))
            else:
                out.append(spec)
        return out

    def saved_for(specs):
        return {names[i]: values[i].detach() for i, s in enumerate(specs) if s.kind == "saved"}

    def reproduces_with(keep):
        specs = specs_saving(keep)
        try:
            inputs = build_inputs(specs, saved_for(specs))
        except Exception:
            return False
        return _reproduces(fail, graph, inputs)

    if not savable or reproduces_with([]):
        specs = specs_saving([])
    elif reproduces_with(savable):
        specs = specs_saving(_ddmin(savable, reproduces_with))
    else:
        specs = specs_saving(savable)
    return specs, saved_for(specs)


# --- values ------------------------------------------------------------------------------
def _real(values):
    """Inputs as real values: fake tensors (symbolic sizes, AOTAutograd) become random ones."""
    out = []
    for v in values:
        if isinstance(v, torch.Tensor) and _fake(v):
            out.append(Input.of(v).make())
        elif isinstance(v, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            out.append(Input.of(v).value)
        else:
            out.append(v)
    return out


def _fake(t):
    return type(t).__name__ == "FakeTensor" or t.device.type == "meta"


def _snapshot(values):
    return [_detached_like(v) for v in values]


def _detached_like(v):
    if isinstance(v, torch.Tensor):
        c = v.detach().clone()
        if c.stride() != v.stride():
            c = torch.empty_strided(v.shape, v.stride(), dtype=v.dtype, device=v.device).copy_(v.detach())
        if v.requires_grad and (c.is_floating_point() or c.is_complex()):
            c.requires_grad_(True)
        return c
    return v


def _is_input_value(v):
    return isinstance(v, (torch.Tensor, int, float, bool)) and not (isinstance(v, torch.Tensor) and _fake(v))


def _one_line(e):
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"

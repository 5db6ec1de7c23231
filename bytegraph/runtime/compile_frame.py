"""A cache miss, end to end: trace, build guards, hand the graph to the backend, generate code."""
from __future__ import annotations

import contextlib
import dis
import gc
import time
import types
from collections import defaultdict

import torch
from torch.utils._device import DeviceContext

from ..bytecode import analysis
from ..bytecode.instructions import decode
from ..backends import ddp
from ..backends.regions import global_state_kept
from ..backends._common import inner_compiler_hook
from ..config import config
from ..debug import debug_dir, logs, minifier, progress, records, replay, timing
from ..debug.inner import watch_inner_compiler
from ..errors import BackendError, BytegraphError, Unsupported
from ..guards import probes
from ..guards import tensor_batch
from ..guards.builder import ID_MATCH, SHAPE_ENV, GuardSet, add_global_state_guards, compile_guards
from ..guards.sources import ClosureSource, LocalSource
from ..codegen.breaks import RESUME_INFO, generate_break, original_offset, plan_break
from ..codegen.transformed import generate
from ..residual import routing_globals, writes_globals
from ..stacks import CUT_FROM, frame_summary, function_entry
from ..trace.nn.blocks import ReplayError
from ..trace.tracer import frame_params, trace_frame
from ..values.base import ObjectValue
from . import persist, reuse
from .cache import CacheEntry, CodeCache
from .signature import _signature_parts

_counter = [0]
log_graph = logs.get_logger("graph")
log_guards = logs.get_logger("guards")
log_code = logs.get_logger("output_code")
log_bytecode = logs.get_logger("bytecode")
log_breaks = logs.get_logger("graph_breaks")
# AOTAutograd inner compilers go through the debugging tools (debug dir, minifier after 'aot').
inner_compiler_hook[0] = watch_inner_compiler


@contextlib.contextmanager
def _gc_paused():
    """No cyclic garbage collection while a frame is traced: tracing makes many objects that live
    as long as the trace, so collections during it find little and cost much (a full one, over
    torch's and the trace's objects, took 60-190 ms inside the capture of a 64-layer model);
    whatever the trace left is collected as usual afterwards. The whole compile of a frame runs
    paused (code generation too, which allocates over the trace's objects): a model that breaks
    into ~60 frames spent 0.7 s of its 2-3 s capture in collections (Longformer), 0.1 s paused."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


class _Compile:
    """One compile of one frame: its names, parameters and phase timings."""

    def __init__(self, fn, compiler, cache):
        code = fn.__code__
        _counter[0] += 1
        self.n = _counter[0]
        self.fn = fn
        self.compiler = compiler
        self.cache = cache
        self.params = frame_params(code)
        self.guard_params = self.params + (["__closure"] if code.co_freevars else [])
        self.name = fn.__qualname__
        self.backend_seconds = 0.0
        self.times = defaultdict(float)   # phase -> seconds, this compile only
        self.dump = debug_dir.OFF         # this compile's folder in the debug directory
        self.ddp_splits = []              # backends.ddp.DDPSplit of each graph split for DDP
        self.known_site = None            # the known breaking call whose hint this compile follows

    def time(self, phase, seconds):
        timing.add(self.name, phase, seconds)
        self.times[phase] += seconds

    def trace(self, values, stop_before=None):
        t0 = time.perf_counter()
        try:
            with _gc_paused():
                return self._trace(values, stop_before, t0)
        except Unsupported:
            self.time("bytecode tracing", time.perf_counter() - t0)
            raise

    def _trace(self, values, stop_before, t0):
        # A full trace keeps checkpoints, so a break leaves the state before it (_split_at_break).
        fn = self.fn
        stop_index = None if stop_before is not None else (lambda index: plan_break(fn, index)[1])
        # (a trace stopping at a chosen row goes there as the break hint says, breaking nowhere before)
        known = None if stop_before is not None else _known_breaks(self.compiler, fn.__code__)
        try:
            result = trace_frame(fn, values, self.compiler, stop_before=stop_before, cache=self.cache,
                                 stop_index=stop_index, known_breaks=known)
        except ReplayError as e:
            # Copying a traced block failed half-way (trace/nn/blocks.py): trace it all.
            log_breaks.debug("tracing %s again without copying traced blocks: %s", self.name, e)
            result = trace_frame(fn, values, self.compiler, stop_before=stop_before, cache=self.cache,
                                 reuse_blocks=False, stop_index=stop_index, known_breaks=known)
        fake = result.tx.graph.fake_seconds
        self.time("fake-tensor propagation", fake)
        self.time("bytecode tracing", time.perf_counter() - t0 - fake)
        return result

    def compile_graph(self, gm, example_inputs):
        if logs.enabled("graph"):
            log_graph.debug("GRAPH %s\n%s", self.name, gm.print_readable(print_output=False))
        backend = self.compiler.backend_name
        graph_entry = self.dump.graph(gm, example_inputs, backend)
        compiler_fn = minifier.wrap_backend(self.compiler.compiler_fn, backend, self.name)
        ddp_module = ddp.active_ddp_module() if config.optimize_ddp else None
        if ddp_module is not None:
            # Compiled inside a DDP forward: pieces at its bucket boundaries (backends/ddp.py).
            compiler_fn = ddp.bucketed(compiler_fn, ddp_module, self.name, on_split=self.ddp_splits.append)
        t0 = time.perf_counter()
        try:
            # The program goes on in the state it was in, whatever the backend did to it.
            with progress.backend_compile(self.name, backend), global_state_kept(gm):
                return compiler_fn(gm, example_inputs)
        except BytegraphError:
            raise
        except Exception as e:
            notes = "".join(f"\n{note}" for note in getattr(e, "__notes__", ()))
            raise BackendError(f"backend {backend!r} failed on the graph of "
                               f"{self.name}: {type(e).__name__}: {e}{notes}") from e
        finally:
            seconds = time.perf_counter() - t0
            self.backend_seconds += seconds
            self.time("backend compile", seconds)
            if graph_entry is not None:
                graph_entry["backend_seconds"] = round(seconds, 6)

    def codegen(self, make):
        """Run a code generator, timing it apart from the backend compile it may call."""
        t0 = time.perf_counter()
        before = self.backend_seconds
        out = make()
        self.time("code generation", time.perf_counter() - t0 - (self.backend_seconds - before))
        return out

    def guards(self, guard_set, run):
        t0 = time.perf_counter()
        try:
            return compile_guards(guard_set, self.guard_params, self.fn.__globals__,
                                  name=f"guard_{_clean(self.fn.__name__)}_{self.n}", hit=run)
        finally:
            self.time("guard building", time.perf_counter() - t0)

    def transformed_name(self):
        return f"transformed_{_clean(self.fn.__name__)}_{self.n}"

    def entry(self, tx, run, source, gm, break_reason=None, user_stack=(), hint=None):
        """Guards, logs and records for a traced frame; the cache entry."""
        if tx.graph.shapes.needs_guard:
            tx.guards.add(SHAPE_ENV, None, tx.graph.shapes)
        entry = self.entry_from(tx.guards, run, source, gm, break_reason, user_stack, hint)
        entry.template = reuse.template_of(self, tx, run, source, gm, break_reason, user_stack, hint)
        return entry

    def entry_from(self, guard_set, run, source, gm, break_reason=None, user_stack=(), hint=None):
        guard, explain, guard_source = self.guards(guard_set, run)
        guards = guard_set.listed()
        if logs.enabled("guards"):
            log_guards.debug("GUARDS %s\n%s", self.name, "\n".join(f"  - {g.describe()}" for g in guards))
        if logs.enabled("output_code"):
            log_code.debug("TRANSFORMED CODE %s\n%s", self.name, source)
        code = self.fn.__code__
        records.record(records.FrameRecord(self.name, code.co_filename, code.co_firstlineno, graph=gm,
                                           guards=guards, break_reason=break_reason, hint=hint,
                                           user_stack=list(user_stack), transformed_source=source,
                                           guard_source=guard_source, ddp_splits=list(self.ddp_splits)))
        self.dump.finish("graph break" if break_reason else ("graph" if gm is not None else "no graph"),
                         self.times, guards, guard_source, source, break_reason, hint, user_stack)
        return CacheEntry(guard, run, explain, guards, graph=gm, transformed_source=source,
                          guard_source=guard_source, identity=identity_of(guard_set.entries()))


def compile_frame(fn: types.FunctionType, frame_args: list, compiler, cache: CodeCache | None = None) -> CacheEntry:
    if config.debug_function and not selected(fn.__code__):
        return _skipped_entry(fn, compiler, cache)
    c = _Compile(fn, compiler, cache)
    timing.count_compile(c.name)
    c.dump = debug_dir.begin_frame(fn, cache)
    try:
        with _gc_paused(), modes_set_aside():
            entry = _compile(c, fn, frame_args, compiler)
        # (after the modes are back: the call's own dispatch state is what later calls match)
        tensor_batch.prime(entry.guard, frame_args)
        return entry
    except BaseException as e:
        c.dump.finish("error", c.times, reason=f"{type(e).__name__}: {e}")
        raise
    finally:
        debug_dir.end_frame(c.dump)


@contextlib.contextmanager
def modes_set_aside():
    """TorchFunctionModes around the call, none of them a device context, are off the stack while
    the frame compiles: the trace runs their ``__torch_function__`` itself (trace/torch_api/
    function_modes.py), and neither fake tensors nor the backend may run under them. With a
    device context among them they stay (the trace then breaks on them)."""
    n = torch._C._len_torch_function_stack()
    modes = [torch._C._get_function_stack_at(i) for i in range(n)]
    if not modes or any(isinstance(m, DeviceContext) for m in modes):
        yield
        return
    for _ in modes:
        torch._C._pop_torch_function_stack()
    probes._set_aside.append(modes)
    try:
        yield
    finally:
        probes._set_aside.pop()
        for m in modes:
            torch._C._push_on_torch_function_stack(m)


def _compile(c, fn, frame_args, compiler):
    values = frame_args[:len(c.params)]
    if logs.enabled("bytecode"):
        code = fn.__code__
        log_bytecode.debug("ORIGINAL BYTECODE %s %s:%s\n%s", c.name, code.co_filename,
                           code.co_firstlineno, dis.Bytecode(code).dis())
    hinted = _take_break_hint(compiler, fn, values)
    loaded = persist.load(c, values)
    if loaded is not None:
        return c.entry_from(*loaded)
    made = reuse.remake(c, frame_args, values)
    if made is not None:
        # Another module of the structure an entry of this code was traced for (reuse.py).
        guard_set, run, source, gm, template = made
        entry = c.entry_from(guard_set, run, source, gm, template.break_reason, template.user_stack,
                             template.hint)
        entry.template = template
        return entry
    if hinted is not None:
        c.known_site = hinted.known_site
        entry = _split_at_hinted_break(c, values, hinted)
        if entry is not None:
            return entry
        _forget_known_break(compiler, hinted.known_site)
        c.known_site = None
    try:
        return _whole_frame(c, c.trace(values))
    except Unsupported as e:
        if not e.user_stack:
            # Met after the trace (building code for the break or the result): the function itself.
            e.user_stack = [function_entry(fn)]
        if compiler.fullgraph:
            e.frames = e.stopped = None    # the trace's frames are not kept with the error
            raise
        try:
            entry = _split_at_break(c, values, e)
        except BytegraphError:
            raise
        except Exception as internal:
            _record_for_replay(fn, values, internal)
            if not config.suppress_errors:
                raise
            log_breaks.debug("internal error while splitting %s at a break: %r", c.name, internal)
            entry = None
        e.frames = e.stopped = None
        return entry if entry is not None else _fallback(c, e)
    except BytegraphError:
        raise
    except Exception as e:
        record = _record_for_replay(fn, values, e)
        if not config.suppress_errors:
            raise
        err = Unsupported(f"internal error while tracing: {type(e).__name__}: {e}{record}")
        err.user_stack = getattr(e, "_bytegraph_user_stack", None) or [function_entry(fn)]
        if compiler.fullgraph:
            raise err from e
        return _fallback(c, err)


def _whole_frame(c, result):
    """The frame traced to its return: one graph, one transformed function."""
    tx = result.tx
    try:
        run, source, gm = c.codegen(lambda: generate(c.transformed_name(), c.guard_params, tx, result.return_value,
                                                     c.fn.__globals__, c.compile_graph))
    except Unsupported as e:
        if not e.user_stack:   # the returned value cannot be rebuilt: point at the return
            e.user_stack = [frame_summary(c.fn.__code__, result.frame.current)]
        raise
    entry = c.entry(tx, run, source, gm)
    persist.save(c.fn, c.compiler, tx, entry, tx.graph, gm)
    return entry


def _split_at_break(c, values, err):
    """The frame up to the instruction that broke (the trace that met the break, given back its
    state before that instruction, or a second trace stopping there), then the resume after it.
    None: cannot."""
    stopped, err.stopped = err.stopped, None
    if err.root_index is None or err.eager_frame:
        return None
    fn = c.fn
    reads_frame = analysis.reads_own_frame(CUT_FROM.get(fn.__code__, fn.__code__))
    if reads_frame is not None:
        line, what = reads_frame
        err.reason += (f"; {c.name} reads its own locals ({what} at line {line}), so it is not split here "
                       "and runs eagerly as a whole")
        return None
    try:
        kind, index = plan_break(fn, err.root_index)
        if stopped is not None and stopped.frame.ip == index:
            result = stopped
            log_breaks.debug("%s stopped at its break without a second trace", c.name)
        else:
            result = c.trace(values, stop_before=index)
        if not result.frame.stopped:
            return None
        ins = decode(fn.__code__)[index]
        run, source, gm = c.codegen(lambda: generate_break(
            fn, result, ins, kind, c.compiler, c.guard_params, c.transformed_name(),
            fn.__code__ in RESUME_INFO, c.compile_graph))
    except Unsupported as e:
        log_breaks.debug("cannot resume %s after its graph break: %s", c.name, e.reason)
        return None
    log_breaks.debug("graph break in %s: %s", c.name, err)
    entry = c.entry(result.tx, run, source, gm, break_reason=err.reason, user_stack=err.user_stack,
                    hint=err.hint)
    _leave_break_hint(c, err, ins)
    return entry


# --- Break hints (issue 40) ---------------------------------------------------------------------
# A break met inside inlined calls F1 -> F2 -> ... -> Fk splits the compiled frame at its call of
# F1, which then runs through its own wrapper, is compiled (traced to the same break inside Fk),
# split at its call of F2, and so on: each level would be traced twice, once to find the break
# and once to stop before it, every trace inlining all the levels below. The first trace already
# saw where each level stands, so the split leaves a hint for the compile that comes next (the
# native step's call of F1): that compile traces F1 once, stopping before its call of F2. A hint
# only chooses where to stop: the stop trace must reach that call, else the frame is compiled as
# without one; a break there is correct even where tracing further would not have broken.

class _Level:
    """One level of a break hint: a code, the instruction it stands at (its call of the next
    level, or the break), and the objects its locals held (modules, configs)."""
    __slots__ = ("code", "current", "locals")

    def __init__(self, code, current, local_values):
        self.code = code
        self.current = current
        self.locals = {k: v for k, v in local_values.items() if isinstance(v, ObjectValue)}


class _BreakHint:
    __slots__ = ("levels", "reason", "hint", "user_stack", "known_site")

    def __init__(self, levels, reason, hint, user_stack, known_site=None):
        self.levels = levels          # _Level of each callee F1..Fk
        self.reason = reason
        self.hint = hint
        self.user_stack = user_stack
        self.known_site = known_site  # key of the known breaking call the chain came from


def _leave_break_hint(c, err, ins):
    compiler, fn = c.compiler, c.fn
    frames = err.frames
    err.frames = None      # the trace's frames are not kept past this
    if not frames or len(frames) < 2 or frames[0].code is not fn.__code__ or frames[0].current is None \
            or frames[0].current.index != err.root_index or ins.opname not in _CALL_NAMES \
            or any(f.current is None for f in frames):
        return
    levels = [_Level(f.code, f.current, f.locals) for f in frames[1:]]
    site = c.known_site
    if site is None and not compiler.fullgraph:
        site = _remember_known_break(compiler, fn.__code__, frames[0].current, levels, err)
    compiler.break_hint = _BreakHint(levels, err.reason, err.hint, list(err.user_stack), site)


# --- Known breaking calls (issue 40) ------------------------------------------------------------
# A loop calling its layers breaks inside each of them at the same place: the trace of the loop's
# next resume function would inline the next layer down to that break, only to split at the
# call and throw that work away (the layer's own compile traces it again, stopping where its
# hint says). A call site whose callee broke is remembered per compiler: later traces of the
# same site (in the original code or a resume function cut from it) break at the call at once
# and leave the same hint chain, without the objects (other layers are other modules). The
# chain is followed level by level; where a level does not reach its stop, the site is
# forgotten and the code is traced as without it.

class _KnownBreak:
    """A call site whose callee (``code``) broke; ``error(tx)`` is the break at the call now."""
    __slots__ = ("code", "levels", "reason", "hint", "user_stack")

    def __init__(self, levels, reason, hint, user_stack):
        self.code = levels[0].code
        self.levels = [_Level(level.code, level.current, {}) for level in levels]
        self.reason = reason
        self.hint = hint
        self.user_stack = user_stack   # the callees' lines, outermost first

    def error(self, tx):
        err = Unsupported(self.reason, hint=self.hint)
        err.user_stack = tx.user_stack() + list(self.user_stack)
        err.frames = list(tx.frames) + list(self.levels)
        return err


def _remember_known_break(compiler, code, call, levels, err):
    if len(err.user_stack) < len(levels):
        return None
    try:
        site = original_offset(code, call.offset)
    except Unsupported:
        return None
    known = compiler.__dict__.setdefault("known_breaking_calls", {})
    known[site] = _KnownBreak(levels, err.reason, err.hint, err.user_stack[-len(levels):])
    return site


def _forget_known_break(compiler, site):
    if site is not None:
        compiler.__dict__.get("known_breaking_calls", {}).pop(site, None)


def _known_breaks(compiler, code):
    """Row index of each call of ``code`` that is a known breaking call -> its _KnownBreak."""
    known = compiler.__dict__.get("known_breaking_calls")
    if not known:
        return None
    original = CUT_FROM.get(code, code)
    wanted = {offset: kb for (orig, offset), kb in known.items() if orig is original}
    if not wanted:
        return None
    info = RESUME_INFO.get(code)
    out = {}
    for row in decode(code):
        if row.opname in _CALL_NAMES:
            offset = row.offset if info is None else info.offsets.get(row.offset)
            if offset in wanted:
                out[row.index] = wanted[offset]
    return out or None


def _take_break_hint(compiler, fn, frame_args):
    """The break hint left for this compile, if it is for ``fn``'s code and these arguments (any
    compile consumes it)."""
    hint = getattr(compiler, "break_hint", None)
    if hint is None:
        return None
    compiler.break_hint = None
    inner = hint.levels[0]
    if inner.code is not fn.__code__ or compiler.fullgraph:
        return None
    # The same objects (a module, a config) as in the trace that left it: not the call of another
    # loop iteration reaching the same instruction first.
    names = inner.code.co_varnames[:len(frame_args)]
    for name, real in zip(names, frame_args):
        traced = inner.locals.get(name)
        if traced is not None and traced.obj is not real:
            return None
    return hint


def _split_at_hinted_break(c, values, hint):
    """The frame split where ``hint`` (left by the caller's break) says it breaks, or None."""
    err = Unsupported(hint.reason, hint=hint.hint)
    err.frames = hint.levels
    err.root_index = hint.levels[0].current.index
    n = len(hint.levels)
    err.user_stack = list(hint.user_stack[-n:]) if len(hint.user_stack) >= n else [function_entry(c.fn)]
    try:
        return _split_at_break(c, values, err)
    except Exception as e:   # noqa: BLE001 - the frame is compiled as without a hint
        log_breaks.debug("break hint for %s not taken: %r", c.name, e)
        return None


_CALL_NAMES = ("CALL", "CALL_KW", "CALL_FUNCTION_EX")


def _fallback(c, err):
    """The frame runs eagerly; guard on global state only, so other states may still compile."""
    fn = c.fn
    reason = str(err)
    log_breaks.debug("running %s eagerly: %s", c.name, reason)
    records.record(records.FrameRecord(c.name, fn.__code__.co_filename, fn.__code__.co_firstlineno,
                                       fallback_reason=err.reason, user_stack=list(err.user_stack),
                                       hint=err.hint))
    c.dump.finish("eager", c.times, reason=err.reason, hint=err.hint, user_stack=err.user_stack)
    return eager_entry(fn, c.cache, (), reason)


def _record_for_replay(fn, values, error):
    """With config.replay_record_enabled: write the replay record of this failing frame; the
    text to add to the reason ("" when off or when the record could not be written)."""
    if not config.replay_record_enabled:
        return ""
    try:
        path = replay.write_record(fn, values, error)
    except Exception as e:   # never hide the error being recorded
        log_breaks.debug("could not write a replay record for %s: %r", fn.__qualname__, e)
        return ""
    note = f"replay record: {path} (bytegraph.replay(path) retraces the frame)"
    log_breaks.debug("%s: %s", fn.__qualname__, note)
    error.add_note(note)
    return f" ({note})"


def selected(code):
    """Whether ``config.debug_function`` selects frames of ``code`` (a resume function counts
    as the function it was cut from); matched against the name and the qualified name."""
    original = CUT_FROM.get(code, code)
    names = {original.co_name, getattr(original, "co_qualname", original.co_name)}
    return not names.isdisjoint(config.debug_function)


def _skipped_entry(fn, compiler, cache):
    """A frame ``config.debug_function`` leaves out runs as it is; functions it calls through
    its globals still reach the compiler (as with ``disable(recursive=False)``), so a selected
    function called from it is compiled."""
    log_breaks.debug("%s runs eagerly: not among config.debug_function %s", fn.__qualname__,
                     config.debug_function)
    return eager_entry(fn, cache, (), "not selected by config.debug_function (BYTEGRAPH_DEBUG_FUNCTION)",
                       routing=None if writes_globals(fn.__code__) else compiler)


def eager_entry(fn: types.FunctionType, cache: CodeCache, identity: tuple, reason: str, routing=None) -> CacheEntry:
    """A cache entry running the frame as it is, for these root objects (``identity``: pairs
    of source and object) in the current global state. With a ``routing`` compiler, the
    functions the frame reads from its globals are handed to that compiler."""
    guards = GuardSet()
    add_global_state_guards(guards)
    for source, obj in identity:
        guards.add(ID_MATCH, source, obj)
    run = _original_caller(fn, routing)
    params = list(cache.params) if cache is not None else frame_params(fn.__code__)
    guard, explain, guard_source = compile_guards(guards, params, fn.__globals__,
                                                  name=f"guard_eager_{_clean(fn.__name__)}", hit=run)
    return CacheEntry(guard, run, explain, list(guards), fallback_reason=reason, guard_source=guard_source,
                      identity=tuple(identity))


def identity_of(guards):
    """The root objects (arguments, closure cells' contents) the guards match by identity."""
    roots = [(g.source, g.expected) for g in guards
             if g.kind == ID_MATCH and isinstance(g.source, (LocalSource, ClosureSource))]
    return tuple(sorted(roots, key=lambda pair: pair[0].expr()))


def _original_caller(fn, routing=None):
    """Run the frame's code as it is, over the closure and globals of the function called now
    (many functions share one code object; the first one compiled is not the one called).
    With a ``routing`` compiler, over globals that hand user functions to it."""
    _, passthrough, original, _ = _signature_parts(fn)
    code = fn.__code__
    fn_globals = fn.__globals__ if routing is None else routing_globals(fn.__globals__, routing)
    make = "__FunctionType(__code, G, __name, None, __closure)" if code.co_freevars else "__fn"
    src = f"def call_original({', '.join(passthrough)}):\n    return {make}({', '.join(original)})\n"
    ns = {"__fn": None if code.co_freevars else types.FunctionType(code, fn_globals, fn.__name__),
          "__FunctionType": types.FunctionType,
          "__code": code, "G": fn_globals, "__name": fn.__name__}
    exec(src, ns)
    return ns["call_original"]


def _clean(name):
    return "".join(c if c.isalnum() or c == "_" else "_" for c in name)

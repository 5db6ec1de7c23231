"""Dispatch: the wrapper a compiled function becomes, and what a cache miss does.

For each compiled Python function we generate a wrapper with the *same
signature*, so CPython binds arguments for us. A call then costs: one loop
over the cache entries, one guard call, one call of the transformed code.
"""
from __future__ import annotations

import inspect
import linecache
import math
import types
import warnings
import weakref
from typing import Callable

import numpy as np
import torch

from ..backends.cudagraphs import new_invocation
from ..backends.registry import CompilerFn, lookup_backend, replays_cuda_graphs
from ..config import config
from ..debug import debug_dir, logs, progress, records, timing
from ..errors import RecompileError
from ..guards.builder import NDARRAY_MATCH, TENSOR_MATCH
from ..guards.sources import ItemSource, LocalSource
from ..residual import GraphRaised
from ..stacks import code_name
from ..trace.tracer import frame_params
from . import stance
from .cache import CodeCache
from .compile_frame import compile_frame, eager_entry
from .signature import UNSET, _signature_parts, default_now, default_reads, kwdefault_now

_compilers = weakref.WeakSet()
frozen = [False]    # True inside bytegraph.run(...): use cached code only, never compile
_NOT_A_PLAIN_FRAME = (inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ITERABLE_COROUTINE
                      | inspect.CO_ASYNC_GENERATOR)
_total_entries = [0]
log_recompiles = logs.get_logger("recompiles")


class Compiler:
    """What one ``bytegraph.compile(...)`` call compiles with, and its caches."""

    def __init__(self, compiler_fn: CompilerFn, backend_name: str, fullgraph: bool, dynamic: bool | None,
                 backend_spec: tuple | None = None) -> None:
        self.compiler_fn = compiler_fn
        self.backend_name = backend_name
        # (name, mode, options) when the backend was named: compiles the persistent cache may keep
        self.backend_spec = backend_spec
        self.fullgraph = fullgraph
        self.dynamic = dynamic
        # Graphs replayed as CUDA graphs keep changing floats constant (as torch.compile does):
        # a float handed over as a CPU tensor would keep them from being recorded.
        self.cuda_graphs = replays_cuda_graphs(compiler_fn)
        # Top-level calls tell CUDA graph trees a new call begins; a backend given as a
        # callable may wrap ``mode="reduce-overhead"``, so it is told too.
        self.marks_invocations = self.cuda_graphs or backend_spec is None
        self.caches = {}           # code object (or (code, id(globals))) -> CodeCache
        self.recompile_limit = None    # torch.compile(recompile_limit=N): this compile's own cache_size_limit
        self._forced = {}          # set_stance(force_backend=b): the compiler compiling with b
        self._wrappers = weakref.WeakKeyDictionary()   # function -> its wrapper (residual calls)
        self._code_wrappers = {}   # (code, id(globals)) -> wrapper taking the closure as an argument
        _compilers.add(self)

    def cache_for(self, code: types.CodeType, fn_globals: dict) -> CodeCache:
        """The cache of ``code`` run with ``fn_globals`` (the guards and generated code read them)."""
        cache = self.caches.get(code)
        if cache is None:
            cache = self.caches[code] = CodeCache(code, fn_globals, tuple(_guard_params(code)))
        elif cache.globals is not fn_globals:
            key = (code, id(fn_globals))
            cache = self.caches.get(key)
            if cache is None:
                cache = self.caches[key] = CodeCache(code, fn_globals, tuple(_guard_params(code)))
        return cache

    def wrapper_for(self, fn: types.FunctionType) -> Callable:
        """The compiled wrapper of ``fn`` under this compiler, made once."""
        wrapper = self._wrappers.get(fn)
        if wrapper is None:
            wrapper = self._wrappers[fn] = self.wrap_function(fn)
        return wrapper

    def wrap_function(self, fn: types.FunctionType, top_level: bool = False) -> Callable:
        """The compiled wrapper of ``fn``; ``top_level`` for the callable handed to the user,
        whose every call is a new invocation (residual calls from generated code are not)."""
        original = getattr(fn, "_bytegraph_original", None)
        if original is not None:
            fn = original
        if fn.__code__.co_flags & _NOT_A_PLAIN_FRAME:
            # Calling a generator or coroutine function only creates the generator; its body
            # runs later, frame by frame, which a wrapper cannot follow. It runs as it is.
            return fn
        if not all(n.isidentifier() for n in fn.__code__.co_varnames[:_param_count(fn.__code__)]):
            return fn   # e.g. a comprehension's hidden ".0" argument: no wrapper can spell it
        cache = self.cache_for(fn.__code__, fn.__globals__)
        if top_level:
            cache.top_level = True
        params, passthrough, original, defaults = _signature_parts(fn)
        # Functions sharing a code may differ in which parameters have defaults.
        marks = top_level and self.marks_invocations
        shape = (tuple(defaults), marks)
        make = cache.wrapper_factories.get(shape)
        if make is None:
            make = cache.wrapper_factories[shape] = _wrapper_factory(fn, cache, self, marks)
        wrapper = make(fn, fn.__closure__)
        wrapper.__name__ = fn.__name__
        wrapper.__qualname__ = fn.__qualname__
        wrapper.__doc__ = fn.__doc__
        wrapper.__module__ = fn.__module__
        wrapper.__wrapped__ = fn
        wrapper.__dict__.update(getattr(fn, "__dict__", {}))
        wrapper._bytegraph_original = fn
        wrapper._bytegraph_compiler = self
        wrapper._bytegraph_cache = cache
        return wrapper

    def wrapper_for_code(self, code: types.CodeType, fn_globals: dict) -> Callable:
        """A compiled wrapper for functions made by the generated code from ``code`` (resume
        functions): it takes the closure as its last argument (when the code has free
        variables), so each call runs over the cells of the call that reached it."""
        key = (code, id(fn_globals))
        wrapper = self._code_wrappers.get(key)
        if wrapper is None:
            cache = self.cache_for(code, fn_globals)
            cache.resumes = True
            wrapper = self._code_wrappers[key] = _code_wrapper(code, fn_globals, cache, self)
            wrapper._bytegraph_cache = cache
        return wrapper

    def miss(self, fn: types.FunctionType, cache: CodeCache, frame_args: tuple) -> Callable | None:
        """Compile ``fn`` for these arguments; return the entry's run function or None (run eagerly)."""
        if cache.eager_forever or frozen[0]:
            return None
        now = stance.current[0]
        compiler = self
        if now is not stance.DEFAULT:
            if not _compile_under_stance(now, fn, cache, frame_args):
                return None
            if now.force_backend is not None:
                compiler = self.forcing(now.force_backend)
        for sync in before_miss:
            sync()
        entries = cache.current_entries() if now.force_backend is not None else cache.entries
        like = _quietly(cache.entries_like, frame_args, entries) if entries else []
        if entries:
            previous = like[0] if like else entries[0]
            reason = _quietly(previous.explain, *frame_args) or "unknown guard failure"
            cache.recompile_reasons.append(reason)
            code = fn.__code__
            log_recompiles.debug("recompiling %s (%s:%s): %s", fn.__qualname__, code.co_filename,
                                 code.co_firstlineno, reason)
            if config.error_on_recompile:
                raise RecompileError(f"{fn.__qualname__} ({code.co_filename}:{code.co_firstlineno}) would be "
                                     f"compiled again (config.error_on_recompile): {reason}")
            limit_value = self.recompile_limit or config.cache_size_limit
            limit_hit = (len(like) >= limit_value
                         or _total_entries[0] >= config.accumulated_cache_size_limit)
            records.recompiles.append(records.RecompileRecord(fn.__qualname__, code.co_filename,
                                                              code.co_firstlineno, reason, limit_hit))
            if limit_hit:
                debug_dir.recompile_given_up(records.recompiles[-1])
                per_code = len(like) >= limit_value
                limit = ("cache_size_limit" if self.recompile_limit is None else "recompile_limit") if per_code \
                    else "accumulated_cache_size_limit"
                shown = limit_value if per_code else config.accumulated_cache_size_limit
                if compiler.fullgraph:
                    # fullgraph promises compiled code: running eagerly instead would break it (torch.compile
                    # raises here too).
                    raise RecompileError(f"{fn.__qualname__} ({code.co_filename}:{code.co_firstlineno}) reached "
                                         f"{limit} ({shown}) with fullgraph=True. Last guard failure: {reason}")
                warnings.warn(
                    f"bytegraph: {fn.__qualname__} ({fn.__code__.co_filename}:{fn.__code__.co_firstlineno}) "
                    f"reached {'config.' if limit != 'recompile_limit' else 'compile(...) '}{limit} ({shown}); "
                    f"it runs eagerly from now on. Last guard failure: {reason}", RuntimeWarning, stacklevel=3)
                identity = _quietly(_identity_now, cache, like, frame_args)
                if identity is None or not per_code:
                    cache.eager_forever = True
                    return None
                # Only the objects this call is made for (this module, this decorated
                # function) run eagerly; others sharing the code keep their own budget.
                entry = eager_entry(fn, cache, identity, reason)
                entry.backend = now.force_backend
                cache.add(entry)
                return entry.run
        if not entries and _total_entries[0] >= config.accumulated_cache_size_limit:
            cache.eager_forever = True
            warnings.warn(
                f"bytegraph: {fn.__qualname__} ({fn.__code__.co_filename}:{fn.__code__.co_firstlineno}) "
                f"not compiled: config.accumulated_cache_size_limit ({config.accumulated_cache_size_limit}) "
                "cache entries exist over all functions; it runs eagerly", RuntimeWarning, stacklevel=3)
            return None
        if self.dynamic is None and config.automatic_dynamic_shapes:
            if like:
                _quietly(_note_changed_sizes, cache, like[0], frame_args)
            elif entries and cache.resumes:
                # A resume function entered for another object (the next layer's module): the
                # numbers a break handed over (an ``.item()`` or ``.tolist()`` result) that differ
                # from another layer's differ between calls too. Symbolic now, not recompiled once
                # per layer on later calls (torch.compile keeps one entry for all the layers).
                _quietly(_note_changed_handovers, cache, entries[0], frame_args)
        entry = compile_frame(fn, frame_args, compiler, cache)
        entry.backend = now.force_backend
        cache.add(entry)
        _total_entries[0] += 1
        return entry.run

    def forcing(self, backend):
        """The compiler that compiles what this one does, with ``backend`` (``set_stance(force_backend=...)``)."""
        key = backend if isinstance(backend, str) else id(backend)
        forced = self._forced.get(key)
        if forced is None:
            named = backend if isinstance(backend, str) else getattr(backend, "__name__", type(backend).__name__)
            forced = Compiler(lookup_backend(backend), backend_name=named, fullgraph=self.fullgraph,
                              dynamic=self.dynamic,
                              backend_spec=(backend, None, None) if isinstance(backend, str) else None)
            forced.recompile_limit = self.recompile_limit
            self._forced[key] = forced
        return forced


# Called before each miss compiles (patch_torch_compile reads torch._dynamo.config here).
before_miss = []


def _compile_under_stance(now, fn, cache, frame_args):
    """Under a stance other than the default: may this miss compile? (False: run eagerly.)"""
    name = now.name
    if name in ("force_eager", "eager_on_recompile"):
        return False
    code = fn.__code__
    where = f"{fn.__qualname__} ({code.co_filename}:{code.co_firstlineno})"
    entries = cache.current_entries()
    if now.skip_guard_eval_unsafe:
        raise RecompileError(f"{where} would recompile under set_stance(skip_guard_eval_unsafe=True): no "
                             "compiled entry matches these arguments. Warm the function up with every kind of "
                             "input it will see before skipping guards"
                             + _first_failure(entries, frame_args))
    if name == "fail_on_recompile":
        if getattr(cache, "top_level", False) or _has_tensor_work(fn, frame_args):
            raise RecompileError(f"{where} would be compiled under set_stance('fail_on_recompile')"
                                 + _first_failure(entries, frame_args))
        return False
    if name in ("eager_then_compile", "aot_eager_then_compile"):
        # The first miss under this stance runs eagerly, what it was given kept; later misses compile,
        # with the sizes and ints that differ from that first one symbolic from the start.
        if cache.first_call is None:
            cache.first_call = [_observed(v) for v in frame_args]
            return False
        for param, before, value in zip(cache.params, cache.first_call, frame_args):
            after = _observed(value)
            if before is None or after is None or type(before) is not type(after):
                continue
            if isinstance(before, tuple) and len(before) == len(after):
                changed = {d for d, (a, b) in enumerate(zip(before, after)) if a != b}
                if changed:
                    cache.auto_dynamic.setdefault(LocalSource(param), set()).update(changed)
            elif isinstance(before, int) and before != after:
                cache.auto_dynamic_scalars.add(LocalSource(param))
    return True


def _first_failure(entries, frame_args):
    for entry in entries:
        reason = entry.explain(*frame_args)
        if reason:
            return f"; guard failure: {reason}"
    return ""


def _observed(value):
    """What ``eager_then_compile`` compares between the first two calls: a tensor's or array's
    sizes, an int."""
    if isinstance(value, (torch.Tensor, np.ndarray)):
        return tuple(value.shape)
    if type(value) is int:
        return value
    return None


def _has_tensor_work(fn, frame_args):
    """Would torch.compile compile this frame at all: tensors, modules or arrays in its
    arguments (inside lists, tuples and dicts too), or torch / NumPy among its globals?"""
    fn_globals = fn.__globals__
    for name in fn.__code__.co_names:
        value = fn_globals.get(name)
        if isinstance(value, types.ModuleType) and (value.__name__.split(".")[0] in ("torch", "numpy")):
            return True
    seen = set()

    def holds(v):
        if isinstance(v, (torch.Tensor, torch.nn.Module, np.ndarray, np.generic)):
            return True
        if type(v) in (list, tuple, dict) and id(v) not in seen:
            seen.add(id(v))
            return any(holds(x) for x in (v.values() if type(v) is dict else v))
        return False

    return any(holds(v) for v in frame_args)


def _refresh_dispatch(old, new):
    if old.changes_hits or new.changes_hits:
        for compiler in list(_compilers):
            for cache in list(compiler.caches.values()):
                cache.refresh()


stance.on_change(_refresh_dispatch)


def _quietly(fn, *args):
    """``fn(*args)`` (what a miss reads of the arguments and cache entries) with torch function
    off while TorchFunctionModes are around the call: the modes must not see those reads."""
    if not torch._C._len_torch_function_stack():
        return fn(*args)
    with torch._C.DisableTorchFunction():
        return fn(*args)


def _identity_now(cache, like, frame_args):
    """The root objects this call's arguments hold where the entries like it were told apart
    by identity, as ((source, object), ...); None when they were not."""
    keysets = {e.keyset for e in like if e.identity}
    if not keysets:
        return None
    keyset = max(keysets, key=len)
    objects = cache.key_reader(keyset)(*frame_args)
    return None if objects is None else tuple(zip(keyset, objects))


def _guard_params(code):
    return frame_params(code) + (["__closure"] if code.co_freevars else [])


def _param_count(code):
    return code.co_argcount + code.co_kwonlyargcount + bool(code.co_flags & inspect.CO_VARARGS) \
        + bool(code.co_flags & inspect.CO_VARKEYWORDS)


def _note_changed_sizes(cache, entry, frame_args):
    """Automatic dynamic shapes: dims and ints that differ from the last entry become symbolic."""
    check = entry.guard
    observe = getattr(check, "observe", None)
    if observe is None:
        return
    for g, now in zip(check.observed, observe(*frame_args)):
        if now is None:
            continue
        if g.kind.observation(g) == "shape":
            before = g.expected.shape
            if len(now) == len(before):
                changed = {d for d, (a, b) in enumerate(zip(before, now)) if a != b}
                if changed:
                    cache.auto_dynamic.setdefault(g.source, set()).update(changed)
        elif type(now) is int and now != g.expected:
            cache.auto_dynamic_scalars.add(g.source)
        elif type(now) is float and type(g.expected) is float and now != g.expected \
                and math.isfinite(now) and math.isfinite(g.expected):
            # A float that changes (a learning rate a scheduler moves): a graph input from now on.
            cache.auto_dynamic_scalars.add(g.source)
        elif isinstance(now, (np.integer, np.floating)) and type(now) is type(g.expected) and now != g.expected:
            # A NumPy scalar that changes (one handed across a graph break to the resume function):
            # a 0-d array input of the graph from now on (values/builder._wrap_numpy_scalar).
            cache.auto_dynamic_scalars.add(g.source)


def _note_changed_handovers(cache, entry, frame_args):
    """For a resume function entered for another object than ``entry`` was made for: the ints
    handed over to it (a parameter, or an item of one: the stack and locals at the break) that
    differ from ``entry``'s become symbolic. Sizes, and numbers read from the objects (a layer's
    own constants), stay as each object has them."""
    check = entry.guard
    observe = getattr(check, "observe", None)
    if observe is None:
        return
    for g, now in zip(check.observed, observe(*frame_args)):
        if type(now) is int and type(g.expected) is int and now != g.expected and _handed_over(g.source):
            cache.auto_dynamic_scalars.add(g.source)


def _handed_over(source):
    while isinstance(source, ItemSource):
        source = source.base
    return isinstance(source, LocalSource)


def reset_all() -> None:
    for compiler in list(_compilers):
        for cache in compiler.caches.values():
            cache.clear()
    _total_entries[0] = 0
    records.clear()
    timing.clear()
    progress.reset()


def _dispatch_lines(args):
    """The loop every wrapper starts with: the first entry whose guard passes runs."""
    return [
        "    for __check in __entries:",
        f"        __run = __check({args})",
        "        if __run is not None:",
        f"            return __run({args})",
    ]


def _wrapper_factory(fn, cache, compiler, marks_invocation=False):
    """A function making wrappers for functions with ``fn``'s code: compiled once per code,
    called once per function object with its own closure. A parameter left to its default gets
    the function's default at call time (``signature.default_reads``)."""
    params, passthrough, original, ns = _signature_parts(fn)
    args = ", ".join(passthrough)
    name = fn.__name__ if fn.__name__.isidentifier() else "compiled_fn"
    params = [p.split("=", 1)[0] + "=__UNSET" if "=" in p else p for p in params]
    native = f"return __fn({', '.join(original)})"
    src = "\n".join(
        ["def __make(__fn, __closure):", f"    def {name}({', '.join(params)}):"]
        + ["        " + line for line in default_reads(fn)]
        + (["        __new_invocation()"] if marks_invocation else [])
        + ["        try:"]
        + ["        " + line for line in _dispatch_lines(args)]
        + [f"            __run = __miss(__fn, __cache, ({args}{',' if passthrough else ''}))",
           "            if __run is None:",
           f"                {native}",
           f"            return __run({args})",
           "        except __GraphRaised:",
           f"            {native}",
           f"    return {name}", ""])
    namespace = {"__entries": cache.dispatch, "__miss": compiler.miss, "__cache": cache,
                 "__GraphRaised": GraphRaised,
                 "__new_invocation": new_invocation, "__UNSET": UNSET, "__default_now": default_now,
                 "__kwdefault_now": kwdefault_now}
    filename = f"<bytegraph dispatch {fn.__qualname__}>"
    linecache.cache[filename] = (len(src), None, src.splitlines(True), filename)
    exec(compile(src, filename, "exec"), namespace)
    return namespace["__make"]


def _code_wrapper(code, fn_globals, cache, compiler):
    """The wrapper of a generated code object (a resume function): its parameters are the
    code's, then ``__closure`` when the code has free variables."""
    params = list(cache.params)
    args = ", ".join(params)
    name = code_name(code) if code_name(code).isidentifier() else "resume"
    has_closure = bool(code.co_freevars)
    make = "__function(__closure)" if has_closure else "__fn"
    native = f"return {make}({', '.join(params[:len(params) - has_closure])})"
    src = "\n".join(
        [f"def {name}({args}):", "    try:"] + ["    " + line for line in _dispatch_lines(args)]
        + [f"        __f = {make}",
           f"        __run = __miss(__f, __cache, ({args}{',' if params else ''}))",
           "        if __run is None:",
           f"            {native}",
           f"        return __run({args})",
           "    except __GraphRaised:",
           f"        {native}", ""])

    def function(closure):
        return types.FunctionType(code, fn_globals, code.co_name, None, closure)

    namespace = {"__entries": cache.dispatch, "__miss": compiler.miss, "__cache": cache,
                 "__GraphRaised": GraphRaised, "__function": function, "__fn": None if has_closure else function(None)}
    filename = f"<bytegraph dispatch {code.co_qualname}>"
    linecache.cache[filename] = (len(src), None, src.splitlines(True), filename)
    exec(compile(src, filename, "exec"), namespace)
    wrapper = namespace[name]
    wrapper.__qualname__ = code.co_qualname
    wrapper._bytegraph_compiler = compiler
    return wrapper

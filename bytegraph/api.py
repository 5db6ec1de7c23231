"""The user-facing entry points: compile(), the module wrapper, reset()."""
from __future__ import annotations

import functools
import importlib.abc
import inspect
import os
import sys
import types
from typing import Any, Callable

import torch
from torch.nn.parallel import DistributedDataParallel

from .control import torch_disabled_target, torch_wrap_numpy_target, wrap_numpy
from .errors import BytegraphError
from .backends.cudagraphs import new_invocation
from .backends.registry import CompilerFn, lookup_backend
from .config import config
from .debug import records
from .debug import replay as replay_records
from .debug.explain import BreakReason, ExplainOutput, _ops
from .runtime import dispatch, dropin
from .runtime.stance import set_stance
from .runtime.dispatch import Compiler, _compilers, reset_all
from .residual import call_ddp, call_disabled, has_hooks, is_fsdp_module
from .trace.nn.hooks import has_unsupported_hooks
from .trace.core.state import is_compiling

_MODES = (None, "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


def compile(model: Callable | torch.nn.Module | None = None, *, fullgraph: bool = False, dynamic: bool | None = None,
            backend: str | CompilerFn = "inductor", mode: str | None = None, options: dict | None = None,
            disable: bool = False) -> Callable:
    """Compile a function, bound method or ``nn.Module``; same meaning as ``torch.compile``.

    Used bare (``bytegraph.compile(fn)``), or as a decorator with or without
    arguments. An ``nn.Module`` comes back wrapped in an ``OptimizedModule``
    that shares its parameters and state and compiles its ``forward``.
    """
    _check_flag("fullgraph", fullgraph)
    _check_flag("disable", disable)
    if dynamic is not None and not isinstance(dynamic, bool):
        raise BytegraphError(f"bytegraph.compile: dynamic must be None, True or False, got {dynamic!r}")
    if mode not in _MODES:
        raise BytegraphError(f"bytegraph.compile: unknown mode {mode!r}; known modes: "
                             + ", ".join(repr(m) for m in _MODES[1:]))
    if options is not None and not isinstance(options, dict):
        raise BytegraphError(f"bytegraph.compile: options must be a dict, got {type(options).__name__}")
    if mode is not None and options is not None:
        raise BytegraphError("bytegraph.compile: give either mode or options, not both")
    compiler_fn = lookup_backend(backend, mode=mode, options=options)

    def wrap(target):
        if disable:
            return target
        compiler = Compiler(compiler_fn, backend_name=_backend_name(backend),
                            fullgraph=fullgraph, dynamic=dynamic,
                            backend_spec=(backend, mode, options) if isinstance(backend, str) else None)
        if isinstance(target, torch.nn.Module):
            cls = _torch_compatible_class() if _patched is not None else OptimizedModule
            return cls(target, compiler, dict(fullgraph=fullgraph, dynamic=dynamic, backend=backend,
                                                          mode=mode, options=options))
        return compile_callable(target, compiler)

    if model is None:
        return wrap
    if not callable(model):
        raise BytegraphError(
            f"bytegraph.compile expects a function, method or nn.Module, got {type(model).__name__} {model!r}")
    return wrap(model)


# --- torch.compile on bytegraph --------------------------------------------------------------

_patched = None   # (torch.compile, nn.Module.compile) as they were before patch_torch_compile()
_replaced = []    # (module, name, original): torch.compiler / torch._dynamo functions replaced while patched

# torch.compile's own arguments bytegraph takes with another meaning or none: accepted at these values.
# isolate_recompiles=True is what bytegraph always does (each compile keeps its own entries).
_TORCH_ONLY_DEFAULTS = {"name": None, "recompile_limit": None, "isolate_recompiles": False, "shapes_spec": None}


def _torch_compile_on_bytegraph(model=None, *, fullgraph=False, dynamic=None, backend="inductor", mode=None,
                                options=None, disable=False, **torch_only):
    """``torch.compile`` with the same arguments, compiled by bytegraph (``patch_torch_compile``)."""
    for key, value in torch_only.items():
        if key not in _TORCH_ONLY_DEFAULTS:
            raise TypeError(f"torch.compile() got an unexpected keyword argument {key!r}")
        if key in ("name", "recompile_limit", "isolate_recompiles"):
            continue
        if value != _TORCH_ONLY_DEFAULTS[key]:
            raise BytegraphError(f"torch.compile({key}={value!r}) has no bytegraph counterpart yet "
                                 "(bytegraph.patch_torch_compile is active)")
    limit = torch_only.get("recompile_limit")
    if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit < 1):
        raise BytegraphError(f"torch.compile: recompile_limit must be a positive int or None, got {limit!r}")
    compiled = compile(model, fullgraph=fullgraph, dynamic=dynamic,
                       backend="inductor" if backend is None else backend, mode=mode, options=options,
                       disable=disable)
    if limit is not None:
        _set_recompile_limit(compiled, limit)
    return compiled


def _set_recompile_limit(compiled, limit):
    """torch.compile(recompile_limit=N): this compile's own cache_size_limit."""
    if callable(compiled) and not isinstance(compiled, (torch.nn.Module, types.FunctionType, types.MethodType)):
        return _set_recompile_limit_later(compiled, limit)
    compiler = getattr(compiled, "_compiler", None) or getattr(getattr(compiled, "__func__", compiled),
                                                               "_bytegraph_compiler", None)
    if compiler is not None:
        compiler.recompile_limit = limit


def _set_recompile_limit_later(decorator, limit):
    # torch.compile(recompile_limit=N) used as a decorator: the limit applies to what it compiles.
    @functools.wraps(decorator)
    def compile_with_limit(target):
        compiled = decorator(target)
        _set_recompile_limit(compiled, limit)
        return compiled
    return compile_with_limit


def _module_compile_on_bytegraph(self, *args, **kwargs):
    """``nn.Module.compile``: later calls of the module run its forward compiled by bytegraph."""
    wrapped = _torch_compile_on_bytegraph(*args, **kwargs)(self)
    # nn.Module.__call__ hands every call to _compiled_call_impl when it is set; the compiled
    # view calls forward (or _call_impl, for hooks) itself, never __call__ again.
    self._compiled_call_impl = wrapped.__call__ if isinstance(wrapped, OptimizedModule) else None


def _torch_reset():
    """``torch.compiler.reset()`` / ``torch._dynamo.reset()`` while patched: bytegraph's caches,
    and torch's own when its front end is loaded."""
    reset()
    for module, name, original in _replaced:
        if name == "reset" and module.__name__ == "torch._dynamo":
            original()


def _torch_explain(f, *extra_args, **extra_kwargs):
    """``torch._dynamo.explain`` while patched: bytegraph's ``explain``."""
    return explain(f, *extra_args, **extra_kwargs)


def _replace(module, name, value):
    if hasattr(module, name):
        _replaced.append((module, name, getattr(module, name)))
        setattr(module, name, value)


def _patch_dynamo(dynamo):
    """Replace the control functions of ``torch._dynamo`` (``torch.compiler``'s delegate to them)."""
    if any(m is dynamo for m, _, _ in _replaced):
        return
    _replace(dynamo, "set_stance", set_stance)
    _replace(dynamo, "reset", _torch_reset)
    _replace(dynamo, "explain", _torch_explain)


class _PatchWhenLoaded(importlib.abc.MetaPathFinder):
    """Patches ``torch._dynamo`` when something imports it (importing it here would cost a
    second at ``import bytegraph`` under ``BYTEGRAPH_PATCH_TORCH_COMPILE=1``)."""

    def find_spec(self, name, path, target=None):
        if name != "torch._dynamo":
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        exec_module = loader.exec_module

        def exec_then_patch(module):
            exec_module(module)
            del loader.exec_module
            if self in sys.meta_path:
                sys.meta_path.remove(self)
            if _patched is not None:
                _patch_dynamo(module)

        loader.exec_module = exec_then_patch
        return spec


_dynamo_finder = _PatchWhenLoaded()


def _torch_compatible_class():
    """Under the patch, compiled modules are also instances of torch's ``OptimizedModule``
    (libraries test ``isinstance(m, torch._dynamo.eval_frame.OptimizedModule)`` to reach
    ``m._orig_mod``); bytegraph's class comes first, so everything else is bytegraph's."""
    global _TorchOptimizedModule
    if _TorchOptimizedModule is None:
        import torch._dynamo.eval_frame as eval_frame   # patched: the first compile loads it anyway
        _TorchOptimizedModule = type("OptimizedModule", (OptimizedModule, eval_frame.OptimizedModule),
                                     {"__module__": __name__, "__doc__": OptimizedModule.__doc__})
    return _TorchOptimizedModule


_TorchOptimizedModule = None


def patch_torch_compile() -> None:
    """Make ``torch.compile`` and ``nn.Module.compile`` compile with bytegraph, with the same
    arguments, so code written for torch.compile (HF ``Trainer(torch_compile=True)``, Lightning,
    scripts) runs on bytegraph unchanged; and torch's control calls mean the same for bytegraph
    (``torch.compiler.set_stance`` and ``reset``, ``torch._dynamo.explain``, the
    ``torch._dynamo.config`` settings code sets; docs/dropin.md lists them all).
    ``unpatch_torch_compile()`` undoes it. Also done at ``import bytegraph`` when
    ``BYTEGRAPH_PATCH_TORCH_COMPILE=1``, and by ``python -m bytegraph script.py``."""
    global _patched
    if _patched is not None:
        return
    _patched = (torch.compile, torch.nn.Module.compile)
    torch.compile = _torch_compile_on_bytegraph
    torch.nn.Module.compile = _module_compile_on_bytegraph
    _replace(torch.compiler, "set_stance", set_stance)
    _replace(torch.compiler, "reset", _torch_reset)
    dynamo = sys.modules.get("torch._dynamo")
    if dynamo is not None:
        _patch_dynamo(dynamo)
    elif _dynamo_finder not in sys.meta_path:
        sys.meta_path.insert(0, _dynamo_finder)
    dropin.activate()


def unpatch_torch_compile() -> None:
    """Give ``torch.compile``, ``nn.Module.compile`` and torch's control calls back their own
    implementations, and ``bytegraph.config`` the settings it had before torch's were carried in."""
    global _patched
    if _patched is None:
        return
    torch.compile, torch.nn.Module.compile = _patched
    _patched = None
    while _replaced:
        module, name, original = _replaced.pop()
        setattr(module, name, original)
    if _dynamo_finder in sys.meta_path:
        sys.meta_path.remove(_dynamo_finder)
    dropin.deactivate()


def _check_flag(name, value):
    if not isinstance(value, bool):
        raise BytegraphError(f"bytegraph.compile: {name} must be True or False, got {value!r}")


def _backend_name(backend):
    if isinstance(backend, str):
        return backend
    return getattr(backend, "__name__", type(backend).__name__)


def compile_callable(target: Callable, compiler: Compiler) -> Callable:
    """Wrap any callable so that its Python code runs through ``compiler``."""
    if getattr(target, "_bytegraph_disabled", False):
        return functools.wraps(target)(lambda *a, **k: call_disabled(compiler, target, a, k))
    if isinstance(target, types.MethodType):
        wrapped = compiler.wrap_function(target.__func__, top_level=True)
        return types.MethodType(wrapped, target.__self__)
    if isinstance(target, types.FunctionType):
        disabled = torch_disabled_target(target)
        if disabled is not None:
            # torch.compile(torch.compiler.disable(f)) compiles f: torch.compile looks through the wrapper.
            return compile_callable(disabled, compiler)
        inner = torch_wrap_numpy_target(target)
        if inner is not None:
            # torch.compiler.wrap_numpy converts eagerly, which fails for tensors on a GPU or needing
            # grad; bytegraph.wrap_numpy means the same and traces without converting.
            return compiler.wrap_function(wrap_numpy(inner), top_level=True)
        return compiler.wrap_function(target, top_level=True)
    if isinstance(target, functools.partial):
        inner = compile_callable(target.func, compiler)
        return functools.partial(inner, *target.args, **target.keywords)
    call = getattr(type(target), "__call__", None)
    if isinstance(call, types.FunctionType):
        bound = compiler.wrap_function(call, top_level=True)
        wrapper = functools.wraps(call)(lambda *a, **k: bound(target, *a, **k))
        return wrapper
    # Builtins and other native callables hold no Python code to trace.
    return target


class OptimizedModule(torch.nn.Module):
    """A compiled view of an ``nn.Module``.

    Parameters, buffers, submodules and attributes are the original module's:
    reads, writes, ``state_dict()`` and ``load_state_dict()`` go straight to
    it. Calling the wrapper compiles ``forward``, traced together with the
    module's forward (pre-)hooks when it has any (global and backward hooks run
    natively around the compiled ``forward``).
    """

    _own = frozenset({"_orig_mod", "_compiler", "_compiled_forward", "_forward_state", "_forward_changed",
                      "_compile_args", "forward", "__call__",
                      "__class__", "__dict__", "__repr__", "_call_impl", "train", "eval",
                      "__getstate__", "__setstate__", "__reduce_ex__"})
    # Marks the class itself for values.builder, which unwraps such modules and cannot import api.
    _bytegraph_compiled_module = True

    def __init__(self, mod: torch.nn.Module, compiler: Compiler, compile_args: dict | None = None) -> None:
        object.__setattr__(self, "_orig_mod", mod)
        object.__setattr__(self, "_compiler", compiler)
        # (the forward set on the module instance when compiled, or None; its class's forward;
        # the compiled forward)
        object.__setattr__(self, "_forward_state", (mod.__dict__.get("forward"), type(mod).forward,
                                                    compile_callable(mod.forward, compiler)))
        object.__setattr__(self, "_compile_args", compile_args or {})

    @property
    def _compiled_forward(self):
        return self._forward_state[2]

    def _forward_changed(self, mod):
        """A forward set on the module instance since compiling (``m.forward = f``, as
        libraries' hooks do) or on its class, compiled: it is what runs from now on."""
        compiled = compile_callable(mod.forward, self._compiler)
        object.__setattr__(self, "_forward_state", (mod.__dict__.get("forward"), type(mod).forward, compiled))
        return compiled

    def __reduce_ex__(self, protocol):
        # A copy (copy.deepcopy, pickle, torch.save) wraps a copy of the module, compiled anew
        # with the same arguments: compiled code belongs to the objects it was traced on.
        return (_compiled_module, (self._orig_mod, self._compile_args))

    def __getattribute__(self, name):
        if name in OptimizedModule._own or (name.startswith("__") and name.endswith("__")):
            return object.__getattribute__(self, name)
        cls = type(self)
        if cls is not OptimizedModule and _defined_by_subclass(cls, name):
            return object.__getattribute__(self, name)
        mod = object.__getattribute__(self, "_orig_mod")
        value = getattr(mod, name)
        if name in _RETURNS_MODULE and getattr(value, "__self__", None) is mod:
            return _returning_wrapper(self, mod, value)
        return value

    def __setattr__(self, name, value):
        if name == "__class__":
            _take_derived_class(self, value)
            return
        if name == "_orig_mod":
            # A library putting back the module it unwrapped (accelerate's extract_model_from_parallel):
            # this view compiles that module from now on (set on the module, it would contain itself).
            if value is not self._orig_mod:
                OptimizedModule.__init__(self, value, self._compiler, self._compile_args)
            return
        setattr(self._orig_mod, name, value)

    def __delattr__(self, name):
        delattr(self._orig_mod, name)

    def __dir__(self):
        return dir(self._orig_mod)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if isinstance(self._orig_mod, DistributedDataParallel):
            return call_ddp(self._compiler, self._orig_mod, args, kwargs)
        mod = self._orig_mod
        set_then, class_then, forward = self._forward_state
        if mod.__dict__.get("forward") is not set_then or type(mod).forward is not class_then:
            forward = self._forward_changed(mod)
        return forward(*args, **kwargs)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        mod = self._orig_mod
        if isinstance(mod, DistributedDataParallel):
            # DDP's own forward runs natively around the module it wraps, which is compiled.
            return call_ddp(self._compiler, mod, args, kwargs)
        set_then, class_then, forward = self._forward_state
        if mod.__dict__.get("forward") is not set_then or type(mod).forward is not class_then:
            forward = self._forward_changed(mod)
        if not has_hooks(mod):
            return forward(*args, **kwargs)
        if has_unsupported_hooks(mod) or is_fsdp_module(mod) or is_fsdp_module(self):
            # FSDP2's hooks gather and free the module's DTensor parameters: they run natively.
            # Global or backward hooks: run them natively around the compiled forward.
            return _call_with_hooks(mod, forward, args, kwargs)
        # The module's own forward (pre-)hooks are traced with its forward.
        compiler = self._compiler
        if compiler.marks_invocations:
            new_invocation()
        return compiler.wrapper_for(_call_module)(mod, *args, **kwargs)

    def train(self, mode: bool = True) -> OptimizedModule:
        self._orig_mod.train(mode)
        return self

    def eval(self) -> OptimizedModule:
        return self.train(False)

    def __repr__(self):
        return f"OptimizedModule({self._orig_mod!r})"


# nn.Module methods that return the module itself: through the wrapper they return the wrapper
# (``model = bytegraph.compile(model).to(device)`` keeps the compiled model, as torch.compile's).
_RETURNS_MODULE = frozenset({"to", "cuda", "cpu", "xpu", "mtia", "ipu", "type", "float", "double", "half",
                             "bfloat16", "to_empty", "apply", "requires_grad_", "share_memory"})


def _returning_wrapper(wrapper, mod, method):
    @functools.wraps(method)
    def call(*args, **kwargs):
        out = method(*args, **kwargs)
        return wrapper if out is mod else out
    return call


def _compiled_module(mod, compile_args):
    """What a copied or unpickled ``OptimizedModule`` is made from."""
    return compile(mod, **compile_args)


# (derived class of OptimizedModule, class of a wrapped module) -> the same derivation of the latter
_derived_classes = {}


def _take_derived_class(wrapper, derived):
    """``wrapper.__class__ = derived``, where ``derived`` adds bases to OptimizedModule.

    torch.distributed's composable APIs (FSDP2's ``fully_shard``, ``replicate``) give the module
    they manage a class derived from its own (``FSDP<cls>``: ``FSDPModule`` first), keep their
    state in its ``__dict__`` and in a module -> state map, and find it again through
    ``named_modules()``, which reaches the *wrapped* module. So the wrapped module gets the same
    derivation of its class and the same state; the wrapper takes ``derived`` too, so the API's
    methods (``reshard()``...) work on it.
    """
    if not (isinstance(derived, type) and issubclass(derived, OptimizedModule)):
        raise BytegraphError(f"the class of an OptimizedModule can only become a subclass of OptimizedModule, "
                             f"not {derived!r}")
    mod = object.__getattribute__(wrapper, "_orig_mod")
    object.__setattr__(wrapper, "__class__", derived)
    if derived is OptimizedModule:
        return
    key = (derived, type(mod))
    cls = _derived_classes.get(key)
    if cls is None:
        bases = tuple(type(mod) if isinstance(b, type) and issubclass(b, OptimizedModule) else b
                      for b in derived.__bases__)
        if type(mod) not in bases:
            return
        namespace = {k: v for k, v in derived.__dict__.items()
                     if k not in ("__dict__", "__weakref__", "__module__", "__qualname__", "__doc__")}
        cls = type(derived.__name__.replace(OptimizedModule.__name__, type(mod).__name__), bases, namespace)
        _derived_classes[key] = cls
    mod.__class__ = cls
    own = object.__getattribute__(wrapper, "__dict__")
    for k, v in own.items():
        if k not in ("_orig_mod", "_compiler", "_compiled_forward"):
            mod.__dict__.setdefault(k, v)
    states = sys.modules.get("torch.distributed._composable_state")
    mapping = getattr(states, "_module_state_mapping", None)
    if mapping is not None and wrapper in mapping and mod not in mapping:
        mapping[mod] = mapping[wrapper]


def _defined_by_subclass(cls, name):
    """True if a class between ``cls`` and OptimizedModule in its MRO defines ``name``."""
    for klass in cls.__mro__:
        if klass is OptimizedModule:
            return False
        if name in klass.__dict__:
            return True
    return False


def _call_module(module, *args, **kwargs):
    return module(*args, **kwargs)


def _call_with_hooks(mod, forward, args, kwargs):
    # nn.Module._call_impl looks up self.forward; give it the compiled one for this call only.
    mod.__dict__["forward"] = forward
    try:
        return mod._call_impl(*args, **kwargs)
    finally:
        del mod.__dict__["forward"]


def reset() -> None:
    """Forget every compiled artefact: caches, recorded reasons, counters."""
    reset_all()


__all__ = ["compile", "reset", "OptimizedModule", "is_compiling", "inspect"]


def run(fn: Callable) -> Callable:
    """Frozen mode: call ``fn`` using only code already compiled for it; never compile.

    ``fn`` is something returned by ``bytegraph.compile`` (or the function or module it
    compiled). A call that no cache entry matches runs eagerly.
    """
    target = fn
    if isinstance(fn, torch.nn.Module) and not isinstance(fn, OptimizedModule):
        target = _find_compiled(fn.forward)
    elif not hasattr(fn, "_bytegraph_original") and not isinstance(fn, OptimizedModule):
        target = _find_compiled(fn)

    @functools.wraps(fn)
    def frozen(*args, **kwargs):
        previous = dispatch.frozen[0]
        dispatch.frozen[0] = True
        try:
            return target(*args, **kwargs)
        finally:
            dispatch.frozen[0] = previous

    return frozen


def _find_compiled(fn):
    """A compiled wrapper for ``fn``'s code from any live compiler, or ``fn`` itself."""
    func = getattr(fn, "__func__", fn)
    code = getattr(func, "__code__", None)
    for compiler in list(_compilers):
        if code in compiler.caches and compiler.caches[code].entries:
            wrapper = compiler.wrapper_for(func)
            self_obj = getattr(fn, "__self__", None)
            return types.MethodType(wrapper, self_obj) if self_obj is not None else wrapper
    return fn


def explain(fn: Callable, *extra_args: Any, **extra_kwargs: Any) -> ExplainOutput | Callable[..., ExplainOutput]:
    """``explain(fn)(*args, **kwargs)`` -> ExplainOutput (``explain(fn, *args)`` also works)."""

    def run(*args, **kwargs):
        graphs = []

        def record_graph(gm, example_inputs):
            graphs.append(gm)
            return gm.forward

        start = len(records.frames)
        compiled = compile(fn, backend=record_graph)
        compiled(*args, **kwargs)
        recs = records.frames[start:]
        out = ExplainOutput()
        out.graphs = graphs
        out.graph_count = len(graphs)
        for r in recs:
            if r.break_reason:
                out.break_reasons.append(BreakReason(r.break_reason, r.user_stack, True, r.hint))
            elif r.fallback_reason:
                out.break_reasons.append(BreakReason(r.fallback_reason, r.user_stack, False, r.hint))
            out.out_guards.extend(r.guards)
            out.ddp_splits.extend(r.ddp_splits)
        out.graph_break_count = len(out.break_reasons)
        out.ops_per_graph = [_ops(gm) for gm in graphs]
        out.op_count = sum(len(ops) for ops in out.ops_per_graph)
        return out

    if extra_args or extra_kwargs:
        return run(*extra_args, **extra_kwargs)
    return run


def replay(record_path: str | os.PathLike) -> Any:
    """Retrace the frame of a replay record (``config.replay_record_enabled``) and return its result.

    The record's function is rebuilt (code, the globals it read, closure, defaults) and called
    with the recorded arguments through ``compile(backend="eager")`` with
    ``config.suppress_errors = False``, so an internal error while tracing is raised here, with
    bytegraph's traceback. Run it in a fresh process (``python -c "import bytegraph;
    bytegraph.replay('path')"``) to reproduce a failure away from the program that met it.
    """
    record = replay_records.load(record_path)
    fn, args, kwargs = replay_records.rebuild(record)
    # Not from the persistent cache: a frame compiled once (by a replay without the fault, say)
    # would load from disk instead of being traced, and the failure would not come back.
    with config.patch(suppress_errors=False, replay_record_enabled=False, persistent_cache=False):
        return compile(fn, backend="eager")(*args, **kwargs)

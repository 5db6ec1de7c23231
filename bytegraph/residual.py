"""What generated code calls at run time: continuations, grad-mode and autocast exits, route.

``trace`` (which puts ``set_autocast_state`` in graphs and meets the exits in the
resume functions it traces) and ``codegen`` (which emits calls to all of these)
both import this module, so it sits on a low floor (docs/architecture.md).

Handing over from a transformed function to a resume function without growing the stack:
a transformed function that stops at a graph break returns
``Continuation(resume, args)`` when it was itself entered from a continuation,
and ``resolve(resume, args)`` (a loop) when it was entered by the user. So a
loop whose body breaks resumes once per iteration at constant stack depth.
"""
import dis
import functools
import sys
import threading
import types
import warnings

import torch
from torch.nn.modules import module as mm
from torch.nn.parallel import DistributedDataParallel

from .datamodel import class_attr
from .debug import logs
from .errors import BackendError
from .control import (disallowed_in_graph, fused_optimizer_step, is_disabled, torch_disable_recursive,
                      torch_disabled_target)


_log_breaks = logs.get_logger("graph_breaks")


class Continuation:
    __slots__ = ("fn", "args")

    def __init__(self, fn, args):
        self.fn = fn
        self.args = args


class GraphRaised(Exception):
    """The compiled graph at the start of a transformed function raised before anything of the
    frame took effect; the function's wrapper runs the frame natively instead, so the exception
    comes from the same line as in eager, after the same side effects (``codegen.transformed``
    raises this only for graphs that change nothing while they run)."""


def graph_raised(exc):
    """What a transformed function raises when its graph raised ``exc``:
    ``GraphRaised``, except for the reports of bytegraph's own checks (a backend's results that
    differ from eager, a failure the minifier wrote a repro for), which the user is to see."""
    if isinstance(exc, BackendError) or getattr(exc, "_bytegraph_reported", False):
        raise exc
    _log_breaks.debug("a compiled graph raised %s: %s; its frame runs natively from its start",
                      type(exc).__name__, exc)
    raise GraphRaised() from exc


def copy_inputs(tensors):
    """Copies of the inputs a graph writes in place before an op that may fail (``graph_raised``
    then puts them back before the frame runs natively)."""
    with torch.no_grad():
        return [t.clone() for t in tensors]


def put_inputs_back(tensors, copies):
    with torch.no_grad():
        for t, c in zip(tensors, copies):
            t.copy_(c)


def resolve(fn, args):
    result = fn(*args)
    while type(result) is Continuation:
        result = result.fn(*result.args)
    return result


class GradModeExit:
    """Stands where ``__exit__`` of a grad-mode ``with`` block was: restores the saved mode."""
    __slots__ = ("mode",)

    def __init__(self, mode):
        self.mode = mode

    def __call__(self, exc_type=None, exc=None, tb=None):
        torch._C._set_grad_enabled(self.mode)
        return False


_STDLIB = frozenset(getattr(sys, "stdlib_module_names", ())) | {"torch", "numpy", "builtins"}
# Python code of torch that is compiled when residual code calls it, like user code: the
# optimizers' step (it graph-breaks into its own frames, whose tensor work is worth a graph).
_COMPILED_LIBRARIES = ("torch.optim.",)
_NOT_COMPILED_LIBRARIES = ("torch.optim.lr_scheduler", "torch.optim.swa_utils")


def _is_user_function(fn):
    if getattr(fn, "_bytegraph_disabled", False):
        return False
    module = getattr(fn, "__module__", None) or ""
    if module.startswith(_COMPILED_LIBRARIES):
        # Not the fused optimizer kernels (trace/torch_api/torch_wrappers.py says why), nor the schedulers (Python
        # on floats: nothing for a graph).
        return not (getattr(fn, "__name__", "").startswith("_fused_")
                    or module.startswith(_NOT_COMPILED_LIBRARIES))
    return module.split(".")[0] not in _STDLIB


def _is_container(forward):
    """``nn.Sequential``'s forward (torch's Python, over user modules): when residual code calls a
    Sequential, its frame is compiled, so the modules it runs are traced (or routed in their turn)."""
    return getattr(forward, "__module__", None) == "torch.nn.modules.container"


def has_hooks(m):
    """True if calling ``m`` would run hooks (its own or global ones)."""
    return bool(m._forward_hooks or m._forward_pre_hooks or mm._global_forward_hooks
                or mm._global_forward_pre_hooks or m._backward_hooks or m._backward_pre_hooks
                or mm._global_backward_hooks or mm._global_backward_pre_hooks)


def route(compiler, fn):
    """What residual code calls in place of ``fn``: ``fn`` itself, or its compiled wrapper for a
    user function, method or module. Generated code calls the result itself (``route(c, f)(...)``),
    so a callee that reads its caller's frame (``warnings.warn``, a logger's ``findCaller``) finds
    the step function standing for the user's frame, not a frame of this module."""
    if getattr(fn, "_bytegraph_disabled", False):
        return lambda *args, **kwargs: call_disabled(compiler, fn, args, kwargs)
    if _is_disallowed(fn):
        return fn
    wrapper = fn.__func__ if isinstance(fn, types.MethodType) else fn
    unwrapped = torch_disabled_target(wrapper)
    if unwrapped is not None:
        if not (getattr(unwrapped, "__module__", None) or "").startswith("torch."):
            # The user's own torch.compiler.disable: honoured; with recursive=False its frame runs
            # as it is and the functions it calls are compiled (as bytegraph.disable's).
            if torch_disable_recursive(wrapper):
                return fn
            if isinstance(fn, types.MethodType):
                return lambda *args, **kwargs: call_skipped(compiler, unwrapped, False, (fn.__self__,) + args, kwargs)
            return lambda *args, **kwargs: call_skipped(compiler, unwrapped, False, args, kwargs)
        if _is_user_function(unwrapped):
            # torch._disable_dynamo(f) around torch code we compile: compile f (trace/torch_api/torch_wrappers.py).
            fn = unwrapped if not isinstance(fn, types.MethodType) else types.MethodType(unwrapped, fn.__self__)
    if isinstance(fn, DistributedDataParallel):
        return lambda *args, **kwargs: call_ddp(compiler, fn, args, kwargs)
    if isinstance(fn, types.MethodType) and fn.__func__ is _FUNCTION_APPLY and isinstance(fn.__self__, type):
        return function_with_compiled_forward(compiler, fn.__self__).apply
    if isinstance(fn, torch.nn.Module) and is_fsdp_module(fn):
        return lambda *args, **kwargs: call_fsdp(compiler, fn, args, kwargs)
    if isinstance(fn, types.FunctionType) and _is_user_function(fn) and not hasattr(fn, "_bytegraph_original"):
        return compiler.wrapper_for(fn)
    if isinstance(fn, types.MethodType) and isinstance(fn.__func__, types.FunctionType) \
            and _is_user_function(fn.__func__) and not hasattr(fn.__func__, "_bytegraph_original") \
            and not fused_optimizer_step(fn.__self__, fn.__name__):
        return types.MethodType(compiler.wrapper_for(fn.__func__), fn.__self__)
    if isinstance(fn, torch.nn.Module):
        if has_hooks(fn):
            # Its hooks run natively around its forward, which is compiled (as under torch.compile).
            forward = fn.__dict__.get("forward", getattr(type(fn), "forward", None))
            forward = getattr(forward, "__func__", forward)
            if isinstance(forward, types.FunctionType) and (_is_user_function(forward) or _is_container(forward)):
                return lambda *args, **kwargs: call_with_compiled_forward(compiler, fn, lambda: fn(*args, **kwargs))
            return fn
        if "forward" not in fn.__dict__:
            forward = next((k.__dict__["forward"] for k in type(fn).__mro__ if "forward" in k.__dict__), None)
            if isinstance(forward, staticmethod) and _is_user_function(forward.__func__):
                return compiler.wrapper_for(forward.__func__)
            if isinstance(forward, types.FunctionType) and (_is_user_function(forward) or _is_container(forward)):
                return types.MethodType(compiler.wrapper_for(forward), fn)
        return fn
    if type(fn) is functools.partial:
        return functools.partial(route(compiler, fn.func), *fn.args, **fn.keywords)
    call = class_attr(type(fn), "__call__")     # a plain function there binds to the object
    if isinstance(call, types.FunctionType) and not isinstance(fn, type) and _is_user_function(call) \
            and not hasattr(call, "_bytegraph_original"):
        # An object of a user class called: its __call__ is a frame of its own.
        return types.MethodType(compiler.wrapper_for(call), fn)
    return fn


_FUNCTION_APPLY = torch.autograd.Function.apply.__func__


def function_with_compiled_forward(compiler, cls):
    """What ``cls.apply`` is replaced with when residual code calls it: a subclass whose
    ``forward`` is ``cls.forward`` compiled by ``compiler``, or ``cls`` itself when forward is not
    user Python code. Autograd calls ``forward`` from C++, where no routing reaches; so a
    custom Function the trace could not take whole (its backward is not traceable, it is called
    at a break) still has its forward compiled as a frame of its own, as under torch.compile's
    frame hook. ``backward``, ``setup_context`` and the rest are inherited unchanged."""
    per_compiler = compiler.__dict__.setdefault("function_classes", {})   # made once per compiler
    derived = per_compiler.get(cls)
    if derived is None:
        forward = cls.__dict__.get("forward")
        forward = forward.__func__ if isinstance(forward, staticmethod) else None
        if forward is None or cls.apply.__func__ is not _FUNCTION_APPLY or not isinstance(forward, types.FunctionType) \
                or not _is_user_function(forward) or getattr(cls, "_bytegraph_disabled", False):
            derived = cls
        else:
            derived = type(cls)(cls.__name__, (cls,), {"forward": staticmethod(compiler.wrapper_for(forward)),
                                                       "__module__": cls.__module__,
                                                       "__qualname__": cls.__qualname__,
                                                       "__doc__": cls.__doc__})
        per_compiler[cls] = derived
    return derived


def call_ddp(compiler, ddp, args, kwargs):
    """Call a DistributedDataParallel module as it is, with the module it wraps compiled.

    DDP's forward is bookkeeping for its reducer (buffers broadcast, ``prepare_for_backward``,
    the join context, the active-module mark that makes graphs split at bucket boundaries) and
    runs natively, as under torch.compile; only the wrapped module's ``forward`` goes through
    ``compiler`` (its own hooks run natively around it).
    """
    inner = ddp.module
    if getattr(type(inner), "_bytegraph_compiled_module", False):
        return ddp(*args, **kwargs)    # DDP over bytegraph.compile(model): compiled already
    return call_with_compiled_forward(compiler, inner, lambda: ddp(*args, **kwargs))


def call_fsdp(compiler, module, args, kwargs):
    """Call an FSDP2 (``fully_shard``) module: its hooks, which all-gather its DTensor parameters
    before ``forward`` and free them after, run natively; its ``forward`` is compiled."""
    if getattr(type(module), "_bytegraph_compiled_module", False):
        return module(*args, **kwargs)    # fully_shard(bytegraph.compile(block)): compiled already
    return call_with_compiled_forward(compiler, module, lambda: module(*args, **kwargs))


def call_with_compiled_forward(compiler, module, call):
    """Run ``call()`` while ``module.forward`` is compiled by ``compiler``.

    The compiled forward is set on the instance for this call only (``nn.Module._call_impl``
    reads ``self.forward``), so the module's hooks run natively around it; a forward the user set
    on the instance is compiled in its place and put back after. A forward that is not Python
    code runs as it is.
    """
    own = module.__dict__.get("forward")
    if own is None:
        forward = type(module).forward
        if not isinstance(forward, types.FunctionType) or forward is torch.nn.Module.forward:
            return call()
        compiled = types.MethodType(compiler.wrapper_for(forward), module)
    elif isinstance(own, types.MethodType) and isinstance(own.__func__, types.FunctionType):
        compiled = types.MethodType(compiler.wrapper_for(own.__func__), own.__self__)
    elif isinstance(own, types.FunctionType):
        compiled = compiler.wrapper_for(own)
    else:
        return call()
    module.__dict__["forward"] = compiled
    try:
        return call()
    finally:
        if own is None:
            module.__dict__.pop("forward", None)
        else:
            module.__dict__["forward"] = own


def is_fsdp_module(module):
    """True for a module sharded by FSDP2's ``fully_shard`` (checked without importing FSDP,
    which takes most of a second: no module is sharded before FSDP is loaded)."""
    fsdp = sys.modules.get("torch.distributed.fsdp._fully_shard._fully_shard")
    cls = getattr(fsdp, "FSDPModule", None)
    return cls is not None and isinstance(module, cls)


def _is_disallowed(fn):
    try:
        return fn in disallowed_in_graph
    except TypeError:
        return False


class _RoutingGlobals(dict):
    """Globals for a non-recursive disabled frame: user functions it reads come back compiled."""

    def __init__(self, real, compiler):
        super().__init__()
        self.real = real
        self.compiler = compiler

    def __getitem__(self, name):
        value = self.real[name]
        if isinstance(value, types.FunctionType) and not is_disabled(value) \
                and not hasattr(value, "_bytegraph_original"):
            if _is_user_function(value):
                return self.compiler.wrapper_for(value)
        return value


def call_disabled(compiler, fn, args, kwargs):
    """Call a disabled function; with recursive=False its global callees go through ``compiler``."""
    if isinstance(fn, types.MethodType):
        # A disabled method, bound: the wrapped function takes the object first.
        args, fn = (fn.__self__,) + tuple(args), fn.__func__
    return call_skipped(compiler, fn._bytegraph_disabled_target, fn._bytegraph_recursive, args, kwargs)


def call_skipped(compiler, target, recursive, args, kwargs):
    """Run ``target``'s frame as it is; not ``recursive``: the global functions it calls go
    through ``compiler``."""
    if recursive or compiler is None or not isinstance(target, types.FunctionType) \
            or writes_globals(target.__code__):
        return target(*args, **kwargs)
    return _run_routing_calls(compiler, target, args, kwargs)


def _run_routing_calls(compiler, fn, args, kwargs):
    routed = types.FunctionType(fn.__code__, routing_globals(fn.__globals__, compiler), fn.__name__,
                                fn.__defaults__, fn.__closure__)
    routed.__kwdefaults__ = fn.__kwdefaults__
    return routed(*args, **kwargs)


def routing_globals(real, compiler):
    """Globals reading through to ``real`` whose user functions come back compiled by ``compiler``."""
    routed = _RoutingGlobals(real, compiler)
    # Builtins must still resolve: LOAD_GLOBAL falls back to __builtins__ of the globals mapping.
    dict.__setitem__(routed, "__builtins__", real.get("__builtins__", __builtins__))
    return routed


def writes_globals(code):
    return any(i.opname in ("STORE_GLOBAL", "DELETE_GLOBAL") for i in dis.get_instructions(code))


# `with torch.inference_mode()` blocks in a graph are entered and left through these (the graph's
# nodes), which keep the blocks a running graph has open: a graph that fails inside one leaves
# it, as eager's __exit__ does, instead of leaving the thread in inference mode.
_inference_blocks = threading.local()


def _open_inference_blocks():
    blocks = getattr(_inference_blocks, "open", None)
    if blocks is None:
        blocks = _inference_blocks.open = []
    return blocks


@torch.fx.node.has_side_effect
def enter_inference_mode(mode):
    """The start of a ``with torch.inference_mode(mode)`` block in a graph."""
    block = torch._C._InferenceMode(mode)
    block.__enter__()
    _open_inference_blocks().append(block)
    return block


@torch.fx.node.has_side_effect
def exit_inference_mode(block):
    """Its end (``block``: what ``enter_inference_mode`` returned)."""
    blocks = _open_inference_blocks()
    if blocks and blocks[-1] is block:
        blocks.pop()
    block.__exit__(None, None, None)


def inference_depth():
    return len(_open_inference_blocks())


def leave_inference_blocks(depth):
    """After a graph failed: leave the blocks it entered and did not leave, innermost first."""
    blocks = _open_inference_blocks()
    while len(blocks) > depth:
        blocks.pop().__exit__(None, None, None)


def set_autocast_state(device_type, enabled, dtype, cache_enabled):
    """Set autocast state directly; used natively and as a graph node when a block ends."""
    torch.set_autocast_enabled(device_type, enabled)
    torch.set_autocast_dtype(device_type, dtype)
    torch.set_autocast_cache_enabled(cache_enabled)


class AutocastExit:
    """Stands where ``__exit__`` of an autocast block was, for code resumed inside the block."""
    __slots__ = ("device_type", "prev")

    def __init__(self, device_type, prev):
        self.device_type = device_type
        self.prev = prev      # (enabled, dtype, cache_enabled) before the block

    @classmethod
    def enter(cls, device_type, dtype, enabled, cache_enabled):
        prev = (torch.is_autocast_enabled(device_type), torch.get_autocast_dtype(device_type),
                torch.is_autocast_cache_enabled())
        torch.autocast_increment_nesting()
        set_autocast_state(device_type, enabled, dtype, cache_enabled)
        return cls(device_type, prev)

    def __call__(self, exc_type=None, exc=None, tb=None):
        if torch.autocast_decrement_nesting() == 0:
            torch.clear_autocast_cache()
        set_autocast_state(self.device_type, *self.prev)
        return False


# --- warnings.warn calls the trace recorded (trace/stdlib_calls.py) -------------------------

# (text, category, module, lineno) of each place a traced warning was raised from: its guard asks
# by index whether the warning filters now turn it into an error.
WARNING_PLACES = []


def warning_place(text, category, module, lineno):
    """The index of a warning's place in ``WARNING_PLACES`` (added once)."""
    key = (text, category, module, lineno)
    for i, known in enumerate(WARNING_PLACES):
        if known == key:
            return i
    WARNING_PLACES.append(key)
    return len(WARNING_PLACES) - 1


def warning_action(text, category, module, lineno):
    """What Python's warning filters do with this warning now: the first matching filter's action,
    else the default one (as ``warnings.warn_explicit`` decides)."""
    for action, msg, cat, mod, ln in warnings.filters:
        if _matches(msg, text) and issubclass(category, cat) and _matches(mod, module) and (ln == 0 or ln == lineno):
            return action
    return warnings.defaultaction


def _matches(pattern, text):
    # As CPython's _warnings: None matches all, a plain str (its built-in filters) exactly, else a regex.
    if pattern is None:
        return True
    if type(pattern) is str:
        return pattern == text
    return bool(pattern.match(text))


def warning_is_error(index):
    """Guard: do the filters now turn the warning at ``WARNING_PLACES[index]`` into an error?"""
    return warning_action(*WARNING_PLACES[index]) == "error"


def replay_warning(message, category, filename, lineno, module, module_globals):
    """A warning the trace met, shown (or not: filters, once per place) as ``warnings.warn`` would
    have from that place: its module's registry, file and line."""
    registry = module_globals.setdefault("__warningregistry__", {})
    # No module_globals, as warnings.warn passes none: its loader is not asked for the source
    # (a `python -c` program's __main__ has no source to give).
    warnings.warn_explicit(message, category, filename, lineno, module, registry)


def as_function_subclass(tensor, cls):
    """``tensor`` as an object of ``cls`` (a ``__torch_function__`` class), without running the
    class's override: what a graph output of such a class is after the graph."""
    with torch._C.DisableTorchFunctionSubclass():
        return tensor.as_subclass(cls)


def without_torch_function(compiled, subclass_inputs=False):
    """``compiled`` run with ``__torch_function__`` off, TorchFunctionModes too: a graph traced
    under the modes around the call already holds what their overrides do."""
    def run(*args):
        with torch._C.DisableTorchFunction():
            return compiled(*(_as_plain(args) if subclass_inputs else args))
    return run


def without_function_subclasses(compiled):
    """``compiled`` run with subclass ``__torch_function__`` dispatch off: a graph whose inputs
    are of such classes already did what their overrides do (as torch.compile runs its graphs)."""
    def run(*args):
        with torch._C.DisableTorchFunctionSubclass():
            return compiled(*_as_plain(args))
    return run


def _as_plain(args):
    """The graph's inputs with those of ``__torch_function__`` classes seen as plain tensors (an
    alias: the same storage and autograd history). The graph's code reads methods and operators
    off its inputs (``a.add(2)``, ``operator.add(a, 2)``): on an object of a class that defines
    ``add`` or ``__add__`` in Python that would run the class's, where the trace recorded torch's."""
    return [a.as_subclass(torch.Tensor) if _function_subclass(type(a)) else a for a in args]


def _function_subclass(cls):
    return cls is not torch.Tensor and cls is not torch.nn.Parameter and issubclass(cls, torch.Tensor) \
        and not issubclass(cls, torch.nn.Parameter) and not hasattr(cls, "__tensor_flatten__")


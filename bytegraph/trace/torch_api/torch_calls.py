"""torch functions, tensor-method descriptors and torch's global-state context managers."""
from __future__ import annotations

import operator
import re
import types

import torch
import torch.amp.autocast_mode
import torch.utils._contextlib

from ...errors import Unsupported
from ...graph.higher_order import IndexByTensors
from ...guards.builder import GLOBAL_STATE
from ...residual import enter_inference_mode, exit_inference_mode, set_autocast_state
from ...values.base import ConstantValue, ContextManagerValue, ObjectValue, PrivateObjectValue, TensorValue
from ...values.builder import is_placement_type, wrap
from ..core import ops
from ..numpy_api import numpy_calls
from ..python import attrs, operators
from ..core.handlers import BUILTIN_HANDLERS
from . import function_modes, torch_function
from typing import Callable
from ...values.base import Value
from ..core.context import RunningFrame

# Python modules of torch whose functions go into the graph as one node each.
_GRAPH_MODULE_PREFIXES = ("torch.nn.functional", "torch.functional", "torch._refs", "torch.special",
                          "torch.fft", "torch.linalg", "torch.nn.init", "torch._tensor",
                          "torch._C", "torch.return_types")
_BUILTIN_MODULES = ("torch", "torch._C", "torch._C._nn", "torch._C._fft", "torch._C._linalg",
                    "torch._C._special", "torch._C._VariableFunctions", "torch.nn.functional",
                    "torch.functional", "torch._ops")

# Calls that change process state or do I/O: never traced, never folded.
_STATEFUL_NAMES = {"manual_seed", "seed", "initial_seed", "set_rng_state", "get_rng_state", "save",
                   "load", "set_default_dtype", "set_default_device", "set_printoptions",
                   "use_deterministic_algorithms", "set_num_threads", "set_grad_enabled",
                   "set_default_tensor_type", "set_anomaly_enabled", "synchronize",
                   "set_float32_matmul_precision"}


def is_graph_function(obj: object) -> bool:
    """True for callables that become one graph node: torch ops and tensor-method descriptors."""
    if isinstance(obj, (types.MethodDescriptorType, types.WrapperDescriptorType)):
        return getattr(obj, "__objclass__", None) in (torch._C.TensorBase, torch.Tensor)
    if isinstance(obj, types.BuiltinFunctionType):
        mod = getattr(obj, "__module__", None) or ""
        if mod.startswith("torch._C._distributed"):
            return False    # process groups, Work handles, stores: they act outside any graph
        if mod in _BUILTIN_MODULES or mod.startswith("torch._C"):
            return True
        owner = getattr(obj, "__self__", None)
        return owner is torch._C._VariableFunctions or isinstance(owner, types.ModuleType) and \
            owner.__name__.startswith("torch._C")
    if isinstance(obj, types.FunctionType):
        mod = obj.__module__ or ""
        if obj.__name__ in _STATEFUL_NAMES:
            return False
        return mod.startswith(_GRAPH_MODULE_PREFIXES) or (mod == "torch" and obj.__name__ in _TORCH_PY_OPS)
    if isinstance(obj, torch._ops.OpOverloadPacket) or isinstance(obj, torch._ops.OpOverload):
        return True
    return False


# Python functions defined in torch/__init__.py that compute on tensors.
_TORCH_PY_OPS = {"is_floating_point", "is_complex", "numel", "typename", "is_storage"}


def torch_call(frame: RunningFrame, fn: Callable, args: list[Value], kwargs: dict[str, Value]) -> Value:
    name = getattr(fn, "__name__", "")
    if fn is torch._C._set_grad_enabled and len(args) == 1 and not kwargs:
        # What grad-mode managers written in Python (__enter__/__exit__) call: a graph node that
        # switches grad mode, also applied here so the rest of the trace sees it.
        mode = operators.as_constant(args[0])
        if not isinstance(mode, bool):
            raise Unsupported(f"torch._C._set_grad_enabled() of {type(mode).__name__}")
        mgr = ContextManagerValue("set_grad", (mode,))
        mgr.saved = current_state(mgr)
        apply_state(frame, mgr, entering=True)
        return ConstantValue(None)
    if name in _STATEFUL_NAMES or name.startswith(("set_", "_set_")) or "nesting" in name \
            or name in ("clear_autocast_cache", "_enter_autocast", "_exit_autocast"):
        raise Unsupported(f"torch.{name}() changes global state and cannot be traced")
    function_modes.refuse_stack_query(frame, fn)
    if _acts_on_process_state(fn, args, kwargs):
        # (a graph node's target runs on fake values as it is added: it would act now, once)
        raise Unsupported(f"{getattr(fn, '__self__', torch).__name__}.{name}() changes process state "
                          "(a mode stack, a counter) and cannot be traced")
    if numpy_calls.involves_arrays(*args, *kwargs.values()):
        return numpy_calls.torch_with_arrays(frame, fn, args, kwargs)
    overridden = torch_function.dispatch(frame, fn, args, kwargs)   # a __torch_function__ class's
    if overridden is not None:
        return overridden
    if isinstance(fn, (types.MethodDescriptorType, types.WrapperDescriptorType)):
        # torch.Tensor.add(x, y) is x.add(y).
        if not args or not isinstance(args[0], TensorValue):
            raise Unsupported(f"Tensor.{name} called on {attrs.describe(args[0]) if args else 'nothing'}")
        return ops.tensor_method(frame, args[0], name, args[1:], kwargs)
    path = _state_query_path(fn) if not args and not kwargs else None
    if path is not None:
        value = fn()
        if type(value) in _STATE_VALUE_TYPES:
            if not _set_by_this_trace(frame.tx, fn):
                frame.tx.guards.add(GLOBAL_STATE, None, (f"{path}()", value), f"{path}()")
            return ConstantValue(value)
    return frame.tx.graph.call("call_function", fn, args, kwargs)


_STATE_VALUE_TYPES = (bool, int, float, str, type(None), torch.dtype, torch.device)


# Verbs of builtins that change process state when called with no arguments (not questions).
_ACTS_ON_STATE = re.compile(r"(^|_)(pop|push|clear|reset|empty|enter|exit|set|init|free|release|sync|synchronize|flush|"
                            r"record|increment|decrement|manual|seed|start|stop|enable|disable|swap|run|wait|"
                            r"destroy|shutdown|unset|add|remove|register|restore|save|load|collect)(_|$)")


def _acts_on_process_state(fn, args, kwargs):
    """A builtin of torch._C named for an action on state (``_pop_torch_function_stack``,
    ``_push_on_torch_function_stack``) called on no tensor."""
    owner = getattr(fn, "__self__", None)
    return isinstance(fn, types.BuiltinFunctionType) and isinstance(owner, types.ModuleType) \
        and owner.__name__.startswith("torch._C") and bool(_ACTS_ON_STATE.search(fn.__name__)) \
        and not any(isinstance(a, TensorValue) for a in list(args) + list(kwargs.values()))


# What a state query reads, as the changes this trace records name it (``apply_state``): the
# kind of change and, for autocast, the device (the no-argument questions ask about CUDA).
_QUERY_READS = {
    torch._C.is_grad_enabled: ("grad", "inference_mode"),
    torch._C.is_inference_mode_enabled: ("inference_mode",),
    torch._C.is_autocast_enabled: ("cuda",), torch._C.get_autocast_gpu_dtype: ("cuda",),
    torch._C.is_autocast_cpu_enabled: ("cpu",), torch._C.get_autocast_cpu_dtype: ("cpu",),
}


def _set_by_this_trace(tx, fn):
    """Does ``fn()`` (a state query) read state that the traced code set itself (inside its own
    ``with torch.autocast(...)`` or ``no_grad()``)? Then its answer follows from the state at the
    call, which every graph guards already (grad mode, autocast, inference mode), and the code
    before it; a guard on the answer would compare the state inside the block with the state at
    the next call's start, and fail every time."""
    reads = _QUERY_READS.get(fn)
    if not reads or not tx.state_changes:
        return False
    for kind, saved in tx.state_changes:
        if kind in reads:
            return True
        device = saved.device if kind == "autocast" else saved[0] if kind == "autocast_state" else None
        if device is not None and device in reads:
            return True
    return False


def _state_query_path(fn):
    """For a torch builtin called with no arguments (``torch._C._get_deterministic_algorithms``,
    ``torch.get_num_threads``: a question about process state), its dotted path from ``torch``,
    which the guard that asks it again per call is written with; None for anything else."""
    owner = getattr(fn, "__self__", None)
    if not isinstance(fn, types.BuiltinFunctionType) or not isinstance(owner, types.ModuleType) \
            or not owner.__name__.startswith("torch."):
        return None
    if _ACTS_ON_STATE.search(fn.__name__):
        return None     # _pop_torch_function_stack(), _increment_version(): asking would change it
    path = f"{owner.__name__}.{fn.__name__}"
    try:
        reached = operator.attrgetter(path[len("torch."):])(torch)   # as the guard will read it
    except AttributeError:
        return None
    return path if reached is fn else None


# --- global-state context managers ---------------------------------------------------------

def _stateless_module(cls, args, kwargs):
    """A torch.nn layer without parameters or buffers (a loss, an activation) built from
    constant arguments, or None: such a module made in forward is private to the trace."""
    if not cls.__module__.startswith("torch.nn.modules."):
        return None
    if not all(operators.is_constant(a) for a in list(args) + list(kwargs.values())):
        return None
    module = cls(*[operators.as_constant(a) for a in args],
                 **{k: operators.as_constant(v) for k, v in kwargs.items()})
    if any(True for _ in module.parameters()) or any(True for _ in module.buffers()) \
            or any(True for _ in module.children()):
        return None
    return module


def call_torch_class(frame, cls, args, kwargs):
    """``cls(...)`` for a class of torch's: the value made, or None for a plain Python class
    (``_plain_python_class``), which the caller traces as a user class."""
    if cls is torch.no_grad:
        return ContextManagerValue("grad", (False,))
    if cls is torch.enable_grad:
        return ContextManagerValue("grad", (True,))
    if cls is torch.set_grad_enabled:
        mode = operators.as_constant(args[0] if args else kwargs["mode"])
        mgr = ContextManagerValue("set_grad", (bool(mode),))
        mgr.saved = current_state(mgr)
        apply_state(frame, mgr, entering=True)
        return mgr
    if cls is torch.inference_mode:
        mode = operators.as_constant(args[0] if args else kwargs.get("mode", ConstantValue(True)))
        return ContextManagerValue("inference_mode", (bool(mode),))
    if cls is torch.autograd.profiler.record_function:
        # A profiler range: nothing for the graph to compute. (A profiler running at run time
        # does not see the range, as under torch.compile.)
        return ContextManagerValue("noop", ())
    if cls in (torch.autocast, torch.amp.autocast) or cls.__name__ == "autocast":
        return _autocast(frame, cls, args, kwargs)
    if cls is torch.Size:
        return BUILTIN_HANDLERS[torch.Size](frame, args, kwargs)
    if cls in (torch.finfo, torch.iinfo):
        return ops.fold(frame, cls, args, kwargs)
    if cls is torch.device or cls is torch.dtype:
        return ops.fold(frame, cls, args, kwargs)
    if is_placement_type(cls):
        # Shard(0), Replicate(), Partial("sum"): immutable values, constants of the trace.
        return ops.fold(frame, cls, args, kwargs, what=f"{cls.__qualname__}()")
    if issubclass(cls, torch.nn.Module):
        module = _stateless_module(cls, args, kwargs)
        if module is not None:
            return PrivateObjectValue(module)
        raise Unsupported(f"creating a {cls.__name__} module inside the compiled function is not supported yet",
                          hint="create modules in __init__, not in forward")
    if _plain_python_class(cls):
        return None     # a class like the user's own (GradScaler's _MultiDeviceReplicator): traced as one
    raise Unsupported(f"calling torch class {cls.__qualname__} is not supported yet")


_HEAPTYPE = 1 << 9      # Py_TPFLAGS_HEAPTYPE: a class made by a class statement, not by C code


def _plain_python_class(cls):
    """A class of torch's written in Python over object alone, made by ``type``: creating one
    is tracing its ``__init__`` as for a class of the user's."""
    return type(cls) is type and all(b.__flags__ & _HEAPTYPE for b in cls.__mro__[:-1]) \
        and cls.__mro__[-1] is object


def _autocast(frame, cls, args, kwargs):
    params = {}
    names = ["device_type", "dtype", "enabled", "cache_enabled"]
    for n, a in zip(names, args):
        params[n] = operators.as_constant(a)
    for k, v in kwargs.items():
        params[k] = operators.as_constant(v)
    if cls.__module__.startswith("torch.cuda"):
        params.setdefault("device_type", "cuda")
    elif cls.__module__.startswith("torch.cpu"):
        params.setdefault("device_type", "cpu")
    device_type = params["device_type"]
    dtype = params.get("dtype") or torch.get_autocast_dtype(device_type)
    enabled = params.get("enabled", True)
    cache = params.get("cache_enabled")
    if cache is None:
        cache = torch.is_autocast_cache_enabled()
    return ContextManagerValue("autocast", (device_type, dtype, enabled, cache))


def manager_of(frame, v):
    """The ContextManagerValue for a ``with`` on ``v`` when ``v`` is a real ``torch.autocast`` object
    made before the call (the one ``@torch.autocast(...)`` keeps for the function it decorates), or
    None. Its settings are read as guarded attributes; the block then becomes the graph's
    ``_enter_autocast``/``_exit_autocast`` nodes, as one made in the trace does (its Python
    ``__enter__`` switches autocast through calls that cannot be traced)."""
    if not isinstance(v, ObjectValue) or not isinstance(v.obj, torch.amp.autocast):
        return None
    read = [operators.as_constant(attrs.get_attr(frame, v, name))
            for name in ("device", "fast_dtype", "_enabled", "_cache_enabled")]
    return ContextManagerValue("autocast", tuple(read))


# What each kind of manager made in the trace is made by again, for each call of a function it
# decorates (torch's ``clone``): the class and the arguments it keeps.
_FACTORIES = {("grad", (False,)): (torch.no_grad, ()), ("grad", (True,)): (torch.enable_grad, ()),
              ("inference_mode", (True,)): (torch.inference_mode, (True,)),
              ("inference_mode", (False,)): (torch.inference_mode, (False,))}


def _clone_of(cls, *args):
    """What torch's decorator calls to make the manager again for each call (torch passes the
    manager's bound ``clone``); traced, so it is a function made in the frame."""
    def clone():
        return cls(*args)
    return clone


def decorate(frame, mgr, args, kwargs):
    """``torch.no_grad()(f)``, ``torch.autocast(...)(f)``...: a manager made in the trace used as a
    decorator (``@torch.no_grad()`` on a nested function). torch's own decorator code is traced, so
    the result is the function eager makes: each call enters the block around ``f``."""
    if len(args) != 1 or kwargs:
        raise Unsupported(f"calling a torch {mgr.kind} context manager with {len(args)} arguments "
                          "is not supported yet")
    tx = frame.tx
    if mgr.kind == "autocast":
        return ops.call(frame, wrap(tx, torch.amp.autocast_mode.autocast_decorator, None), [mgr, args[0]], {})
    if mgr.kind == "set_grad":
        # torch.set_grad_enabled(mode) switched grad mode when it was made; used as a decorator it
        # switches back at once, and each call of the function makes it again.
        apply_state(frame, mgr, entering=False)
        cls, cls_args = torch.set_grad_enabled, mgr.args
    elif (mgr.kind, mgr.args) in _FACTORIES:
        cls, cls_args = _FACTORIES[mgr.kind, mgr.args]
    else:
        raise Unsupported(f"a torch {mgr.kind} context manager used as a decorator is not supported yet")
    factory = ops.call(frame, wrap(tx, _clone_of, None),
                       [wrap(tx, cls, None)] + [ConstantValue(a) for a in cls_args], {})
    return ops.call(frame, wrap(tx, torch.utils._contextlib.context_decorator, None), [factory, args[0]], {})


def current_state(mgr):
    if mgr.kind in ("grad", "set_grad"):
        return torch.is_grad_enabled()
    return None


def apply_state(frame, mgr, entering):
    """Enter or leave ``mgr`` both in the graph and in this process (for fake propagation)."""
    tx = frame.tx
    graph = tx.graph.graph
    if mgr.kind in ("grad", "set_grad"):
        mode = mgr.args[0] if entering else mgr.saved
        if mgr.kind == "grad" and not entering and mode is None:
            return
        graph.create_node("call_function", torch._C._set_grad_enabled, (mode,), {})
        tx.state_changes.append(("grad", torch.is_grad_enabled()))
        torch._C._set_grad_enabled(mode)
        return
    if mgr.kind == "autocast":
        if entering:
            node = graph.create_node("call_function", torch.amp._enter_autocast, tuple(mgr.args), {})
            device_type, dtype, enabled, cache = mgr.args
            real = torch.autocast(device_type, dtype=dtype, enabled=enabled, cache_enabled=cache)
            real.__enter__()
            mgr.saved = (node, real)
            tx.state_changes.append(("autocast", real))
        else:
            node, real = mgr.saved
            graph.create_node("call_function", torch.amp._exit_autocast, (node,), {})
            real.__exit__(None, None, None)
            tx.state_changes.remove(("autocast", real))
        return
    if mgr.kind == "autocast_resumed":
        # Leaving a block that was entered before this resume function began.
        if entering:
            return
        device_type = mgr.args[0]
        now = (torch.is_autocast_enabled(device_type), torch.get_autocast_dtype(device_type),
               torch.is_autocast_cache_enabled())
        graph.create_node("call_function", set_autocast_state, (device_type,) + tuple(mgr.saved), {})
        set_autocast_state(device_type, *mgr.saved)
        tx.state_changes.append(("autocast_state", (device_type, now)))
        return
    if mgr.kind == "inference_mode":
        # In the graph as residual.enter/exit_inference_mode nodes; done here too, so the fake
        # tensors made inside are inference tensors and what eager refuses with them (saving one
        # for backward, an in-place change outside the block) fails while tracing as in eager.
        if entering:
            mode = mgr.args[0]
            if mode == torch.is_inference_mode_enabled():
                mgr.saved = None      # already in that mode: torch's block does nothing either
                return
            node = graph.create_node("call_function", enter_inference_mode, (mode,), {})
            real = torch._C._InferenceMode(mode)
            real.__enter__()
            mgr.saved = (node, real)
            tx.state_changes.append(("inference_mode", real))
        elif mgr.saved is not None:
            node, real = mgr.saved
            graph.create_node("call_function", exit_inference_mode, (node,), {})
            real.__exit__(None, None, None)
            tx.state_changes.remove(("inference_mode", real))
        return
    if mgr.kind == "noop":
        return
    if mgr.kind == "torch_function_off":
        # No node: the graph runs its ops as traced; inside the block the trace hands nothing to
        # __torch_function__ classes (all=True: nor to modes), as eager.
        step = 1 if entering else -1
        tx.graph.function_subclass_off += step
        if mgr.args[0]:
            tx.graph.function_modes_off += step
        return
    if mgr.kind == "index_by_tensors":
        # No node: the graph keeps each subscript, which runs under torch's own mode (FlexAttention's
        # functions); the fakes inside the block are computed under ours (graph.higher_order).
        if entering:
            mgr.saved = IndexByTensors()
            mgr.saved.__enter__()
            tx.state_changes.append(("index_by_tensors", mgr.saved))
        else:
            mgr.saved.__exit__(None, None, None)
            tx.state_changes.remove(("index_by_tensors", mgr.saved))
        return
    raise Unsupported(f"context manager {mgr.kind} is not supported yet")


def undo_state_changes(tx):
    """Restore process state after a trace, whatever happened inside it."""
    tx.undo_state_changes()

"""torch's own wrappers around its library code, understood while tracing.

torch wraps parts of its Python code (the optimizers above all) in helpers meant for its
own compiler: profiling ranges, "run this without the compiler" decorators, "am I being
compiled?" queries, explicit graph breaks. Each is decided here, with the reason:

- ``torch.autograd.profiler.record_function`` changes nothing a graph computes: a no-op
  ``with`` block (the profiler range is not recorded for the traced code; code run
  natively at a graph break is not inside it either). ``torch._C.DisableTorchFunctionSubclass``
  and ``torch._C.DisableTorchFunction`` turn overrides off for the block: the trace hands nothing
  to ``__torch_function__`` classes (and modes) inside it.
- ``torch._disable_dynamo(fn)`` marks code that torch's own front end cannot trace (or
  chooses not to); ``torch.compiler.disable`` is put on optimizer methods by torch.compile
  once it has run in the process. On torch's code neither says anything about semantics, so
  the function it wraps is traced (the user's own ``torch.compiler.disable`` is honoured:
  that function runs natively);
  anything in it that bytegraph cannot trace breaks the graph as usual, and a function
  listed in ``_RUN_NATIVELY`` runs eagerly at a graph break with its reason.
- the fused optimizer implementations (``torch.optim.adam._fused_adam``...) run natively:
  they are one kernel already, and AOTAutograd cannot functionalize them.
- an optimizer's ``_init_group`` met while its state is still empty (the first step) is run
  natively once, before it is traced: it makes the state eager's first step makes (zeros,
  step counters), and the trace then sees the state every later step has, so the first step
  compiles the graph all steps use instead of one that makes the state and is never run again.
- ``torch._dynamo.graph_break()`` is an explicit graph break (the optimizers put one
  after setting grad mode, so the step is a graph of its own that starts without grad).
- ``torch.compiler.is_compiling()``, ``torch._dynamo.is_compiling()``,
  ``torch._utils.is_compiling()`` are True while tracing; ``torch.jit.is_scripting()``,
  ``torch.jit.is_tracing()`` False: library code then takes the branches meant for a
  compiler (e.g. ``_get_value`` keeps an optimizer's step count a tensor).

Nothing here imports ``torch._dynamo``: functions are recognised by module and name.
"""
import torch

from ...control import fused_optimizer_step, torch_disabled_target
from ...errors import Unsupported
from ...values.base import ConstantValue, ContextManagerValue, DictValue, ListValue, ObjectValue

_DYNAMO_MODULES = ("torch._dynamo", "torch._dynamo.decorators", "torch._dynamo.eval_frame",
                   "torch._dynamo.external_utils", "torch.compiler", "torch._utils",
                   "torch._dynamo.utils")

# (module, name) of functions that answer "is a compiler tracing this?".
_IS_COMPILING = {(m, n) for m in _DYNAMO_MODULES for n in ("is_compiling", "is_dynamo_compiling",
                                                            "is_exporting")}
_IS_COMPILING.discard(("torch.compiler", "is_exporting"))
_IS_COMPILING.discard(("torch._dynamo", "is_exporting"))
_JIT_QUERIES = {("torch.jit", "is_scripting"), ("torch._jit_internal", "is_scripting"),
                ("torch.jit", "is_tracing"), ("torch.jit._trace", "is_tracing"),
                ("torch.compiler", "is_exporting")}

# Classes whose ``with`` blocks change nothing a graph computes.
_NOOP_MANAGERS = {"torch.autograd.profiler.record_function", "torch.profiler.record_function",
                  "torch.autograd.profiler.emit_nvtx"}
# Managers turning __torch_function__ off (subclasses' overrides; with all=True modes' too):
# what the trace hands to overrides inside the block changes (torch_calls.apply_state).
_TORCH_FUNCTION_OFF = {"torch._C.DisableTorchFunctionSubclass": False, "torch._C.DisableTorchFunction": True}

# Functions (module, name) that make ``with`` blocks changing nothing a graph computes: FX node
# annotations (flex_attention's create_block_mask marks an argsort for Inductor).
_NOOP_MANAGER_FUNCTIONS = {("torch.fx.traceback", "annotate")}
# Functions that only tell torch's own front end something (flex_attention marks its head dims
# static for it): nothing to do.
_FRONT_END_HINTS = {("torch._dynamo.decorators", "mark_static")}
# torch's mode making ``t[i]`` with tensor indices a gather (FlexAttention's functions run
# under it; create_mask enters it): entered while tracing, for the fakes (torch_calls.apply_state).
_INDEX_MODES = {"torch._dynamo._trace_wrapped_higher_order_op.TransformGetItemToIndex"}

# Functions wrapped by torch._disable_dynamo that are better run natively (qualname).
_RUN_NATIVELY = {}


def _name(obj):
    return getattr(obj, "__module__", None) or "", getattr(obj, "__name__", None) or ""


def unwrap(fn):
    """The function to trace in place of ``fn`` (a torch compiler wrapper), or None."""
    target = torch_disabled_target(fn)
    if target is not None:
        if not (getattr(target, "__module__", None) or "").startswith("torch"):
            # The user's own torch.compiler.disable: run it natively, as bytegraph.disable would.
            raise Unsupported(f"{getattr(target, '__qualname__', target)} is marked torch.compiler.disable",
                              hint="it runs eagerly at a graph break; remove the decorator to trace it")
        reason = _RUN_NATIVELY.get(getattr(target, "__qualname__", None))
        if reason is not None:
            raise Unsupported(f"{target.__qualname__} runs without the compiler: {reason}",
                              hint="it runs eagerly at a graph break")
        return target
    return None


def call(frame, obj, args, kwargs):
    """The value of calling one of torch's compiler helpers, or None for any other callable."""
    module, name = _name(obj)
    if not module.startswith("torch"):
        return None
    if (module, name) in _IS_COMPILING:
        return ConstantValue(True)
    if (module, name) in _JIT_QUERIES:
        return ConstantValue(False)
    if module.startswith("torch.optim.") and name.startswith("_fused_") and callable(obj):
        raise Unsupported(f"{name} (a fused optimizer kernel) runs natively",
                          hint="it is one kernel already, and AOTAutograd cannot functionalize it; "
                               "torch.compile does not trace it either")
    if name == "graph_break" and module.startswith("torch._dynamo"):
        raise Unsupported("torch._dynamo.graph_break() called", hint="library or user code asks for a graph "
                          "break here; it is kept (remove the call to keep one graph)")
    if isinstance(obj, type) and f"{module}.{obj.__qualname__}" in _NOOP_MANAGERS:
        return ContextManagerValue("noop", ())
    if isinstance(obj, type) and f"{module}.{obj.__qualname__}" in _TORCH_FUNCTION_OFF and not args and not kwargs:
        return ContextManagerValue("torch_function_off", (_TORCH_FUNCTION_OFF[f"{module}.{obj.__qualname__}"],))
    if (module, name) in _NOOP_MANAGER_FUNCTIONS:
        return ContextManagerValue("noop", ())
    if (module, name) in _FRONT_END_HINTS:
        return ConstantValue(None)
    if isinstance(obj, type) and f"{module}.{obj.__qualname__}" in _INDEX_MODES and not args and not kwargs:
        return ContextManagerValue("index_by_tensors", ())
    return None


def check_method(owner, name):
    """Raise Unsupported for a method of ``owner`` (a real object) that runs natively: the step
    of a fused optimizer (``control.fused_optimizer_step`` says why)."""
    if fused_optimizer_step(owner, name):
        raise Unsupported(f"{type(owner).__name__}.step() of a fused optimizer runs natively",
                          hint="its update is one fused kernel per parameter group: nothing in it is worth "
                               "a graph, so it runs eagerly, as it is")


def make_optimizer_state(frame, fn, args, kwargs):
    """Before ``fn`` (an optimizer's ``_init_group``) is traced: if the parameter group has
    parameters with gradients and no state yet, run it natively on the same group, so the
    state exists (as eager's first step makes it) before the trace reads it. Only when the trace
    has not read the optimizer's state yet, has no attribute stores pending, and every argument
    is known for real (the group dict as read, unchanged; fresh empty lists; constants);
    otherwise nothing happens and the state is made in the graph."""
    if fn.__name__ != "_init_group" or not (getattr(fn, "__module__", None) or "").startswith("torch.optim."):
        return
    if not args or not isinstance(args[0], ObjectValue) or not isinstance(args[0].obj, torch.optim.Optimizer):
        return
    tx = frame.tx
    opt = args[0].obj
    if id(opt.state) in tx.memo or tx.effects.attr_stores:
        # The trace has read the state, or holds attribute stores not done yet (``p.grad = ...``):
        # the real objects are not what the trace sees.
        return
    real = {id(value): obj for obj, value in tx.memo.values()}

    def as_real(v):
        if isinstance(v, ConstantValue):
            return v.value
        if isinstance(v, ListValue) and v.source is None and not v.items:
            return []
        if isinstance(v, DictValue) and id(v) in real and id(v) not in tx.effects.mutated:
            return real[id(v)]
        raise LookupError

    try:
        real_args = [as_real(a) for a in args[1:]]
        real_kwargs = {k: as_real(v) for k, v in kwargs.items()}
    except LookupError:
        return
    groups = [a for a in real_args + list(real_kwargs.values()) if isinstance(a, dict) and "params" in a]
    if len(groups) != 1 or not any(p.grad is not None and not opt.state.get(p) for p in groups[0]["params"]):
        return
    group = groups[0]
    # The trace reads the group as capturable (values/builder.py): make the state that path
    # makes (step counters on the parameters' device), as tracing this call would have.
    flip = id(group) in tx.param_groups and group.get("capturable") is False
    if flip:
        group["capturable"] = True
    try:
        fn(opt, *real_args, **real_kwargs)
    finally:
        if flip:
            group["capturable"] = False
    # The state just made is long-lived as the state found made is: read by identity.
    tx.note_optimizer(opt)


__all__ = ["call", "unwrap", "make_optimizer_state"]

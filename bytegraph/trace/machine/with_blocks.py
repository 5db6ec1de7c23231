"""``with`` blocks on user context managers and ``@contextlib.contextmanager`` objects.

torch's grad-mode/autocast managers keep their own path (``ContextManagerValue``
in ``opcodes.before_with``). Here: objects with Python ``__enter__``/``__exit__``
(made in the frame or pre-existing) have both methods traced; a
``contextlib._GeneratorContextManager`` is driven directly on its lazy
generator, with contextlib's rules for what ``__exit__`` returns or raises.
"""
import contextlib
import types

from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from ...datamodel import class_lookup
from ...errors import Unsupported
from ...values.base import (BoundMethodValue, ConstantValue, DictValue, ExceptionValue, GeneratorValue,
                           ObjectValue, TracebackValue, TracerCallableValue, TupleValue, UserObjectValue)
from ...values.builder import wrap
from ..callables import calls
from ..torch_api import function_modes
from ..python import attrs, protocols
from ..python.exceptions import TracedRaise, new, raise_new
from ..python.generators import resume
from ..core.handlers import builtin


def enter(frame, mgr):
    """BEFORE_WITH on a non-torch manager: (the exit callable, the value ``as`` binds)."""
    if isinstance(mgr, UserObjectValue) and mgr.cls is contextlib._GeneratorContextManager \
            and isinstance(mgr.attrs.get("gen"), GeneratorValue):
        return _enter_generator(frame, mgr.attrs["gen"])
    if isinstance(mgr, UserObjectValue):
        cls = mgr.cls
    elif isinstance(mgr, ObjectValue) and not isinstance(mgr.obj, (type, types.ModuleType)):
        cls = type(mgr.obj)
    else:
        raise Unsupported(f"with-block on {attrs.describe(mgr)} is not supported yet")
    if issubclass(cls, TorchFunctionMode):
        # Its __enter__/__exit__ traced below; TorchFunctionMode's own push and pop the trace's
        # mode stack (function_modes.push_mode), whose __torch_function__ then runs here.
        function_modes.check_block(cls)
    if issubclass(cls, TorchDispatchMode):
        # Entering one changes how every torch call after it runs (a mode stack in C++).
        raise Unsupported(f"entering a {cls.__qualname__} (a torch dispatch"
                          " mode) inside the compiled function is not supported yet",
                          hint="enter the mode around the call of the compiled function; without fullgraph=True "
                               "the with-statement runs natively at a graph break")
    methods = []
    for name in ("__enter__", "__exit__"):
        # Special methods are looked up on the class, as CPython does.
        method, found = class_lookup(cls, name)
        if not found or not isinstance(method, types.FunctionType):
            raise Unsupported(f"with-block on a {cls.__qualname__} object: {name} is not Python code")
        src = protocols.guard_class_method(frame.tx, cls, name, method)
        methods.append(BoundMethodValue(wrap(frame.tx, method, src), mgr))
    enter_method, exit_method = methods
    return exit_method, calls.call(frame, enter_method, [], {})


def call_exit(frame, exit_fn, exc):
    """WITH_EXCEPT_START: ``__exit__(type, exc, traceback)``; the result says whether to suppress."""
    return calls.call(frame, exit_fn, [wrap(frame.tx, exc.cls, None), exc, TracebackValue()], {})


def _enter_generator(frame, gen):
    kind, value = resume(gen)
    if kind != "yield":
        raise_new(RuntimeError, "generator didn't yield")

    def exit_(f, args, kwargs):
        typ, exc = args[0], args[1]
        if isinstance(typ, ConstantValue) and typ.value is None:
            kind, _ = resume(gen)
            if kind == "return":
                return ConstantValue(False)
            raise_new(RuntimeError, "generator didn't stop")
        if not isinstance(exc, ExceptionValue):
            raise Unsupported("exiting a @contextmanager block with this exception is not supported yet")
        try:
            kind, _ = resume(gen, thrown=exc)
        except TracedRaise as e:
            raised = e.value
            if issubclass(raised.cls, StopIteration):
                return ConstantValue(raised is not exc)
            if issubclass(raised.cls, RuntimeError):
                if raised is exc or (issubclass(exc.cls, StopIteration) and raised.cause is exc):
                    return ConstantValue(False)
                raise
            if raised is not exc:
                raise
            return ConstantValue(False)
        if kind == "return":
            return ConstantValue(True)
        raise TracedRaise(new(RuntimeError, "generator didn't stop after throw()"))

    return TracerCallableValue("_GeneratorContextManager.__exit__", exit_), value


@builtin(contextlib.contextmanager)
def contextmanager_in_frame(frame, args, kwargs):
    """``contextlib.contextmanager(fn)`` called inside the trace (a decorator on a nested function):
    a callable whose calls make the same manager object contextlib would."""
    if len(args) != 1 or kwargs:
        raise Unsupported("contextlib.contextmanager() takes one function")
    func = args[0]

    def make(f, call_args, call_kwargs):
        gen = calls.call(f, func, call_args, call_kwargs)
        if not isinstance(gen, GeneratorValue):
            raise Unsupported("@contextmanager function that does not return a generator")
        return UserObjectValue(contextlib._GeneratorContextManager,
                               {"gen": gen, "func": func, "args": TupleValue(call_args),
                                "kwds": DictValue(call_kwargs)})

    return TracerCallableValue("contextmanager helper", make)

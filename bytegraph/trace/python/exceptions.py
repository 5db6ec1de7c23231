"""Exceptions raised and caught inside the traced code.

One mechanism: a traced ``raise`` (or a Python error that a fold on constants
hits) becomes a ``TracedRaise`` carrying an ``ExceptionValue``. ``Frame.run``
catches it around each instruction and unwinds to the handler that the code's
exception table names; a frame without one lets it propagate to its caller
(the CALL instruction there), exactly like CPython. ``Unsupported`` is never
turned into a traced exception (except ``PythonError`` and ``MissingAttribute``,
which say that eager Python would raise), so traced handlers can never catch a
tracer limitation. An exception escaping the compiled frame becomes
``Unsupported`` at the instruction where it (or the exception it was raised
while handling) first entered that frame, so a graph break replays it natively.
"""
import dis
import types
from functools import lru_cache

from ...bytecode.instructions import decode
from ...errors import Unsupported
from ...guards.kinds import TYPE_MATCH
from ...values.base import (ConstantValue, ExceptionValue, ObjectValue, TracerCallableValue, TupleValue,
                           UserObjectValue)
from ...values.builder import wrap
from ..core import ops
from ..core.basics import MissingAttribute, PythonError, as_constant, constant_value  # noqa: F401 (re-exported)


class TracedRaise(Exception):
    """Internal: the traced code raised ``value`` (an ExceptionValue). Never reaches users."""

    def __init__(self, value):
        super().__init__(value)
        self.value = value




# --- the exception table -------------------------------------------------------------

@lru_cache(maxsize=1024)
def handler_table(code):
    """Per decoded instruction index: (handler index, stack depth, push lasti) or None."""
    rows = decode(code)
    entries = list(dis.Bytecode(code).exception_entries)
    table = []
    for row in rows:
        entry = next((e for e in entries if e.start <= row.offset < e.end), None)
        if entry is None:
            table.append(None)
            continue
        target = next((r.index for r in rows if r.offset >= entry.target), len(rows))
        table.append((target, entry.depth, entry.lasti))
    return tuple(table)


def unwind(frame, value, index):
    """Jump ``frame`` to the handler covering instruction ``index``; False if none covers it."""
    table = handler_table(frame.code)
    entry = table[index] if index < len(table) else None
    if entry is None:
        return False
    target, depth, lasti = entry
    del frame.stack[depth:]
    if lasti:
        frame.push(ConstantValue(frame.instructions[index].offset))
    frame.push(value)
    frame.ip = target
    return True


def escape_error(value):
    """The Unsupported that an exception escaping the compiled frame becomes."""
    err = Unsupported(f"the compiled function raises {describe(value)}",
                      hint="eager Python raises it too; without fullgraph=True the code from where it is raised "
                           "runs eagerly, so it reaches you as it would without bytegraph")
    err.root_index = entry_index(value)
    return err


def entry_index(value):
    """Where the compiled frame can break to replay ``value`` natively: the instruction where
    the first exception of its ``__context__`` chain entered (or was made in) that frame, so
    that any handler which raised it runs natively too. None if unknown (an exception from
    outside the trace: a function resumed inside a handler enters it again with the real
    exception, ``bytecode.resume.HANDLED_PREFIX``)."""
    index = None
    seen = set()
    v = value
    while isinstance(v, ExceptionValue) and id(v) not in seen:
        seen.add(id(v))
        if v.root_index is not None:
            index = v.root_index
        v = v.context
    return index


def break_index(frame):
    """Where the compiled frame breaks for an Unsupported met at its current instruction.

    Inside a traced handler, the break moves back to where the handled exception entered the
    frame: the native step there raises it and hands over as its ``except`` handler starts
    (``codegen.breaks._handler_entries``). An exception from outside the trace has no such
    place: the break stays where it is, and the code after it enters the handler again."""
    current = handled(frame.tx)
    index = entry_index(current) if current is not None else None
    return index if index is not None else frame.current.index


def describe(value):
    args = ", ".join(repr(a.value) if isinstance(a, ConstantValue) else "..." for a in value.args)
    return f"{value.cls.__name__}({args})"


# --- making exception objects -----------------------------------------------------------

# Builtin exceptions with more state than ``args`` (errno, path, code, ...): they stay eager.
# The others only store their positional arguments (StopIteration also as ``value``).
_RICH_BUILTINS = (OSError, ImportError, SyntaxError, UnicodeError, SystemExit, BaseExceptionGroup)


def _builtin_base(cls):
    return next(c for c in cls.__mro__ if c.__module__ == "builtins")


def is_supported_class(cls):
    if issubclass(cls, _RICH_BUILTINS) or type(cls) is not type:
        return False
    user = [c for c in cls.__mro__ if c.__module__ != "builtins"]
    return not any(n in c.__dict__ for c in user for n in ("__new__", "__setattr__", "__getattribute__",
                                                            "__slots__", "__init_subclass__"))


def make_exception(frame, cls, args, kwargs):
    """``cls(*args, **kwargs)`` for an exception class: an ExceptionValue, its ``__init__`` traced."""
    if not is_supported_class(cls):
        raise Unsupported(f"creating {cls.__qualname__} exceptions inside the compiled function is not supported yet")
    value = ExceptionValue(cls, args)
    if frame.parent is None and frame.current is not None:
        # Made in the compiled frame: if it escapes, replay from here (the stack at its
        # raise holds the object itself, which cannot be rebuilt outside the trace).
        value.root_index = frame.current.index
    init = cls.__init__
    if isinstance(init, types.FunctionType):
        result = ops.call(frame, wrap(frame.tx, init, None), [value] + list(args), kwargs)
        if not (isinstance(result, ConstantValue) and result.value is None):
            raise Unsupported(f"{cls.__qualname__}.__init__ returned a value")
    elif kwargs:
        raise Unsupported(f"{cls.__qualname__}() with keyword arguments is not supported yet")
    return value


def base_init(value, args):
    """``BaseException.__init__(self, *args)`` (super().__init__ in a user exception class)."""
    value.args = list(args)
    return ConstantValue(None)


def from_python(exc):
    """An ExceptionValue for a real exception that a fold raised (constant arguments)."""
    value = ExceptionValue(type(exc), [constant_value(a) for a in exc.args])
    if isinstance(exc, StopIteration):
        value.attrs["value"] = constant_value(exc.value)
    return value


def new(cls, *args):
    """An ExceptionValue of a builtin class with constant arguments (raised by the tracer itself)."""
    value = ExceptionValue(cls, [ConstantValue(a) for a in args])
    if cls is StopIteration:
        value.attrs["value"] = ConstantValue(args[0] if args else None)
    return value


def raise_new(cls, *args):
    raise TracedRaise(new(cls, *args))


def converted(err):
    """The ExceptionValue for an Unsupported that means eager Python raises, else None."""
    if isinstance(err, PythonError):
        return from_python(err.exc)
    if isinstance(err, MissingAttribute):
        return ExceptionValue(AttributeError, [ConstantValue(err.reason)])
    return None


def is_instance(value, cls):
    """isinstance for the traced handlers' ``except`` checks."""
    return isinstance(value, ExceptionValue) and issubclass(value.cls, cls)


# --- handler helpers --------------------------------------------------------------------

def class_of(v):
    """The class (or tuple of classes) named by an ``except`` clause value."""
    if isinstance(v, ObjectValue) and isinstance(v.obj, type):
        return v.obj
    if isinstance(v, ConstantValue) and isinstance(v.value, (type, tuple)):
        return v.value
    if isinstance(v, TupleValue):
        return tuple(class_of(i) for i in v.items)
    raise Unsupported("except clause with a non-class value is not supported yet")


def guard_class(tx, exc):
    """Before ``except`` matches ``exc``: an exception of the trace has its class; one from
    outside (a handler a resume function enters with the real exception) must be read through a
    source, and its class is guarded."""
    if isinstance(exc, ExceptionValue):
        return
    if not (isinstance(exc, ObjectValue) and isinstance(exc.obj, BaseException) and exc.source is not None):
        raise Unsupported("matching an exception made outside the trace and not read through a source "
                          "is not supported yet")
    tx.guards.add(TYPE_MATCH, exc.source, type(exc.obj))


def matches(exc, classes):
    classes = class_of(classes)
    flat = classes if isinstance(classes, tuple) else (classes,)
    for c in flat:
        if isinstance(c, tuple):
            if matches(exc, ConstantValue(c)):
                return True
        elif not (isinstance(c, type) and issubclass(c, BaseException)):
            raise_new(TypeError, "catching classes that do not inherit from BaseException is not allowed")
        elif issubclass(exc.python_type(), c):
            return True
    return False


def to_exception(frame, v, what="exceptions"):
    """The exception object that ``raise v`` raises (or ``from v`` names, ``what="exception
    causes"``): instantiate a class, check the type."""
    if isinstance(v, ExceptionValue):
        return v
    if isinstance(v, ObjectValue) and isinstance(v.obj, type) and issubclass(v.obj, BaseException):
        made = ops.call(frame, v, [], {})
        if not isinstance(made, ExceptionValue):
            raise_new(TypeError, f"calling {v.obj!r} should have returned an instance of BaseException, "
                                 f"not {type(made).__name__}")
        return made
    if isinstance(v, ObjectValue) and isinstance(v.obj, BaseException):
        raise Unsupported("raising an exception object made outside the compiled function is not supported yet")
    if isinstance(v, (ConstantValue, ObjectValue, TupleValue, UserObjectValue)):
        raise_new(TypeError, f"{what} must derive from BaseException")
    raise Unsupported("raising this kind of value is not supported yet")


def handled(tx):
    """The exception being handled (``sys.exc_info()[1]`` of the traced code), or None."""
    if tx.handled_exception is not None:
        return tx.handled_exception
    return next((e for e in reversed(tx.outer_handled) if e is not None), None)


def raise_value(frame, exc, cause=None, has_cause=False):
    """RAISE_VARARGS: set ``__context__`` (and ``__cause__``), then raise."""
    tx = frame.tx
    exc = to_exception(frame, exc)
    if has_cause:
        if isinstance(cause, ConstantValue) and cause.value is None:
            exc.cause = None
        else:
            exc.cause = to_exception(frame, cause, "exception causes")
        exc.suppress_context = True
    current = handled(tx)
    if current is not None and current is not exc and exc.context is None:
        exc.context = current
    raise TracedRaise(exc)


def reraise_current(frame):
    current = handled(frame.tx)
    if current is None:
        # The caller of the compiled function may be handling one: only eager knows.
        raise Unsupported("bare raise with no exception handled inside the compiled function")
    if not isinstance(current, ExceptionValue):
        raise Unsupported("re-raising an exception made outside the compiled function is not supported yet")
    raise TracedRaise(current)


# --- changing exception objects (reading them: lookup.exception_attr) ------------------------

def set_attr(frame, v, name, value):
    if name == "__cause__":
        v.cause = None if isinstance(value, ConstantValue) and value.value is None else value
        v.suppress_context = True
        return
    if name == "args":
        v.args = ops.iterate(frame, value)
        return
    if name in ("__context__", "__traceback__", "__suppress_context__"):
        raise Unsupported(f"setting {name} of an exception is not supported yet")
    v.attrs[name] = value


def to_str(frame, v, fn=str):
    """``str(e)`` / ``repr(e)``: a user ``__str__``/``__repr__`` is traced; else the builtin's on constants."""
    special = "__str__" if fn is str else "__repr__"
    method = getattr(v.cls, special)
    if isinstance(method, types.FunctionType):
        return ops.call(frame, wrap(frame.tx, method, None), [v], {})
    base = _builtin_base(v.cls)
    try:
        args = [as_constant(a) for a in v.args]
    except Unsupported:
        raise Unsupported(f"{fn.__name__}() of an exception with non-constant arguments is not supported yet") from None
    text = fn(base(*args))
    if fn is repr and base is not v.cls:
        text = v.cls.__name__ + text[len(base.__name__):]
    return ConstantValue(text)


def super_attr(frame, sv, name):
    """``super().__init__`` in a user exception class reaching BaseException's: store the args."""
    if name != "__init__":
        return None
    mro = sv.obj.cls.__mro__
    for klass in mro[mro.index(sv.cls) + 1:]:
        if "__init__" in klass.__dict__:
            if klass.__module__ == "builtins":
                target = sv.obj
                return TracerCallableValue("BaseException.__init__",
                                           lambda f, args, kwargs: base_init(target, args))
            return None
    return None


# --- rebuilding at a graph break -----------------------------------------------------------

def rebuild_expr(rb, v):
    """Python (for codegen.rebuild) that makes the exception object ``v`` for real.

    Made with ``__new__`` (no ``__init__`` runs twice); args, attributes, cause and
    context as traced. Its traceback is None: it was raised inside compiled code."""
    rb.ns.ns["__new_exception"] = new_exception
    args = "".join(f"{rb.expr(a)}, " for a in v.args)
    attrs = ", ".join(f"{k!r}: {rb.expr(i)}" for k, i in v.attrs.items())
    cause = rb.expr(v.cause) if v.cause is not None else "None"
    context = rb.expr(v.context) if v.context is not None else "None"
    return rb.temp(f"__new_exception({rb.ns.ref(v.cls, 'cls')}, ({args}), {{{attrs}}}, "
                   f"{cause}, {context}, {v.suppress_context!r})")


def values_inside(v):
    """The values an ExceptionValue holds (for finding the tensors a rebuild needs)."""
    out = list(v.args) + list(v.attrs.values())
    out += [e for e in (v.cause, v.context) if e is not None]
    return out


def new_exception(cls, args, attrs, cause, context, suppress_context):
    exc = cls.__new__(cls, *args)
    exc.args = args
    for name, value in attrs.items():
        setattr(exc, name, value)
    exc.__cause__ = cause
    exc.__context__ = context
    exc.__suppress_context__ = suppress_context
    return exc

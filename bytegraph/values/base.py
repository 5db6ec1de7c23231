"""Symbolic values: what the interpreter keeps on its stack and in its locals.

Values are plain data. What can be done *with* a value (call it, read an
attribute, iterate) lives in ``trace/``; building a value from a real object
read through a source (and the guards that this takes) lives in
``values/builder.py``.
"""
import collections
import functools
import itertools
import types

import torch


class Value:
    """A value seen by the tracer. ``source`` says where it can be re-read from."""

    __slots__ = ("source",)

    def __init__(self, source=None):
        self.source = source

    def python_type(self):
        raise NotImplementedError(type(self).__name__)

    def is_constant(self):
        return False

    def __repr__(self):
        src = f" from {self.source.name()}" if self.source is not None else ""
        return f"{type(self).__name__}({self._repr_body()}){src}"

    def _repr_body(self):
        return ""


class ConstantValue(Value):
    """A Python value known while tracing: numbers, strings, None, dtypes, sizes, slices...

    A constant read from a source is guarded only when the trace looks at its
    value; one that is merely passed along (to residual code, to a resume
    function) needs no guard.
    """

    __slots__ = ("_value", "_pending_guard")

    def __init__(self, value, source=None, pending_guard=None):
        super().__init__(source)
        self._value = value
        self._pending_guard = pending_guard

    @property
    def value(self):
        if self._pending_guard is not None:
            install, self._pending_guard = self._pending_guard, None
            install()
        return self._value

    @value.setter
    def value(self, v):
        self._value = v

    def python_type(self):
        return int if isinstance(self.value, TracedId) else type(self.value)   # an id is an int at run time

    def is_constant(self):
        return True

    def _repr_body(self):
        return repr(self.value)


def constant(value):
    return ConstantValue(value)


class TensorValue(Value):
    """A tensor produced by (or fed into) the graph: an FX node and its fake tensor.

    ``selected``: where Python picks one of several tensor objects by their data (``max(a, b)``
    of one-element tensors), the graph computes the pick as a new tensor (``torch.where``) and
    this is ``(first, [(cond, item), ...])``: the object eager has is ``item`` for the last
    true ``cond``, else ``first``. Outside the graph it is that object again (codegen/rebuild.py),
    so code after the graph sees eager's object; inside, asking for its identity breaks."""

    __slots__ = ("node", "fake", "cls", "selected")

    def __init__(self, node, fake, source=None, cls=torch.Tensor):
        super().__init__(source)
        self.node = node
        self.fake = fake
        # A wrapper subclass (TwoTensor, DTensor) made in the graph: its fake is of the class.
        self.cls = type(fake) if cls is torch.Tensor and hasattr(type(fake), "__tensor_flatten__") else cls
        self.selected = None

    def python_type(self):
        return self.cls

    def _repr_body(self):
        return f"{self.node.name}: {tuple(self.fake.shape)} {self.fake.dtype}"


class SymValue(Value):
    """A symbolic int (a dynamic size, or an int argument made dynamic): an FX node and its SymInt."""

    __slots__ = ("node", "sym")

    def __init__(self, node, sym, source=None):
        super().__init__(source)
        self.node = node
        self.sym = sym

    def python_type(self):
        # Tensor.item() under capture_scalar_outputs gives a SymFloat or SymBool too.
        return float if isinstance(self.sym, torch.SymFloat) else bool if isinstance(self.sym, torch.SymBool) else int

    def _repr_body(self):
        return f"{self.node.name}: {self.sym}"


class FloatTensorValue(Value):
    """A Python float that changes from call to call (a learning rate a scheduler moves): in the
    graph, a 0-d float64 tensor (an input, or computed from inputs with double arithmetic, as
    Python computes floats), so a new value needs no new graph. ``example`` is its value now.

    Where the trace needs it as a number (a comparison, an argument only a number fits) it is
    specialised: ``specialize()`` guards the floats it was computed from to their current values
    and gives ``example``. A graph input compared with a number need not be: ``decide(op,
    number, outcome)`` (None for a float computed in the graph) guards the comparison's outcome
    instead, so other values with that outcome reuse the graph."""

    __slots__ = ("node", "fake", "example", "bases", "decide")

    def __init__(self, node, fake, example, bases, decide=None):
        super().__init__(None)
        self.node = node
        self.fake = fake
        self.example = example
        self.bases = tuple(bases)   # callables installing the guards that fix its input floats
        self.decide = decide

    def specialize(self):
        for install in self.bases:
            install()
        return self.example

    def python_type(self):
        return float

    def _repr_body(self):
        return f"{self.node.name}: {self.example!r}"


class SubgraphValue(Value):
    """A function body traced into a graph of its own (an ``fx.GraphModule``), handed to a
    higher-order operation (``torch.cond``, checkpoint, torch.func transforms)."""

    __slots__ = ("gm", "name")

    def __init__(self, gm, name):
        super().__init__(None)
        self.gm = gm
        self.name = name

    def python_type(self):
        return type(self.gm)


class TupleValue(Value):
    """A tuple whose items are values. ``cls`` is tuple, torch.Size or a namedtuple class."""

    __slots__ = ("items", "cls")

    def __init__(self, items, source=None, cls=tuple):
        super().__init__(source)
        self.items = list(items)
        self.cls = cls

    def python_type(self):
        return self.cls

    def _repr_body(self):
        return ", ".join(map(repr, self.items))


class ListValue(Value):
    __slots__ = ("items",)

    def __init__(self, items, source=None):
        super().__init__(source)
        self.items = list(items)

    def python_type(self):
        return list

    def _repr_body(self):
        return ", ".join(map(repr, self.items))


class DictValue(Value):
    """A dict with known keys; keys are real hashable Python objects."""

    __slots__ = ("items", "cls")

    def __init__(self, items, source=None, cls=dict):
        super().__init__(source)
        self.items = dict(items)
        self.cls = cls

    def python_type(self):
        return self.cls

    def _repr_body(self):
        return ", ".join(f"{k!r}: {v!r}" for k, v in self.items.items())


class DictViewValue(Value):
    """``d.keys()``, ``d.values()`` or ``d.items()`` of a DictValue."""

    __slots__ = ("dict_value", "kind")

    def __init__(self, dict_value, kind):
        super().__init__(None)
        self.dict_value = dict_value
        self.kind = kind

    def python_type(self):
        return type(getattr({}, self.kind)())

    def materialize(self):
        d = self.dict_value.items
        if self.kind == "keys":
            return [constant(k) for k in d]
        if self.kind == "values":
            return list(d.values())
        return [TupleValue([constant(k), v]) for k, v in d.items()]


class SliceValue(Value):
    __slots__ = ("start", "stop", "step")

    def __init__(self, start, stop, step):
        super().__init__(None)
        self.start, self.stop, self.step = start, stop, step

    def python_type(self):
        return slice


class ObjectValue(Value):
    """A real, pre-existing Python object: a module, function, class, nn.Module, user object.

    Reads go to the real object (with guards on its source); it is never
    mutated while tracing. ``pin``: for an object read through a source, what guards which
    object it is (``pin_identity``): most objects are guarded by their type and what is read of
    them, not by their identity.
    """

    __slots__ = ("obj", "pin")

    def __init__(self, obj, source=None):
        super().__init__(source)
        self.obj = obj
        self.pin = None

    def pin_identity(self):
        """The trace relies on which object this is (a dict key made of it): guard that."""
        if self.pin is not None:
            self.pin()

    def python_type(self):
        return type(self.obj)

    def _repr_body(self):
        return type(self.obj).__name__


class PrivateObjectValue(ObjectValue):
    """A real object made at trace time (``copy.deepcopy`` of a guarded object) that only the
    trace can see: reads need no guards, stores are done on it at once, and it must not
    escape the trace (nothing could make the same object again on the next call)."""

    __slots__ = ()


class UserObjectValue(Value):
    """An instance of a user class created while tracing; its attributes are values.

    An instance of a ``dict``/``OrderedDict`` subclass (HF's ``ModelOutput``) also
    has ``dict_items``: a DictValue holding its items, which the dict methods
    the class inherits read and change.
    """

    __slots__ = ("cls", "attrs", "dict_items")

    def __init__(self, cls, attrs=None, dict_items=None):
        super().__init__(None)
        self.cls = cls
        self.attrs = dict(attrs or {})
        self.dict_items = dict_items

    def python_type(self):
        return self.cls

    def _repr_body(self):
        return self.cls.__qualname__


class SuperValue(Value):
    """``super()`` bound to a class and an object: attribute lookup starts after ``cls``."""

    __slots__ = ("cls", "obj")

    def __init__(self, cls, obj):
        super().__init__(None)
        self.cls = cls
        self.obj = obj


class FunctionValue(Value):
    """A Python function made while tracing (MAKE_FUNCTION): code plus symbolic defaults and cells."""

    __slots__ = ("code", "globals", "name", "qualname", "defaults", "kwdefaults", "closure", "attrs")

    def __init__(self, code, fn_globals, name, qualname, defaults=(), kwdefaults=None, closure=()):
        super().__init__(None)
        self.code = code
        self.globals = fn_globals
        self.name = name
        self.qualname = qualname
        self.defaults = tuple(defaults)
        self.kwdefaults = dict(kwdefaults or {})
        self.closure = tuple(closure)
        # Attributes set on it in the frame (``__doc__``, ``__module__``, ``__wrapped__``, its
        # ``__dict__``...): what decorators and functools.wraps store. name -> value.
        self.attrs = {}

    def python_type(self):
        return type(lambda: None)

    def _repr_body(self):
        return self.qualname


class CellValue(Value):
    """A closure cell made in the traced code; its contents are a value."""

    __slots__ = ("contents",)

    def __init__(self, contents=None):
        super().__init__(None)
        self.contents = contents


class RealCell(Value):
    """A real closure cell of a pre-existing function, read through a source."""

    __slots__ = ("cell",)

    def __init__(self, cell, source):
        super().__init__(source)
        self.cell = cell


class BoundMethodValue(Value):
    """``obj.method`` where method is a Python function to be inlined with ``obj`` first."""

    __slots__ = ("func", "self_value")

    def __init__(self, func, self_value, source=None):
        super().__init__(source)
        self.func = func
        self.self_value = self_value

    def python_type(self):
        return type(self.__init__)


class TensorMethodValue(Value):
    """``tensor.name`` not yet called: becomes a call_method node when called."""

    __slots__ = ("tensor", "name")

    def __init__(self, tensor, name):
        super().__init__(None)
        self.tensor = tensor
        self.name = name

    def python_type(self):
        return type(torch.Tensor.add)


class MethodOfValue(Value):
    """A method of a symbolic container or constant (``lst.append``, ``d.items``, ``s.format``)."""

    __slots__ = ("owner", "name")

    def __init__(self, owner, name):
        super().__init__(None)
        self.owner = owner
        self.name = name

    def python_type(self):
        return type([].append)


class IteratorValue(Value):
    """An iterator over a known, finite list of values. One read through a source (a tuple or
    range iterator from outside: ``values.builder``) is that real iterator; the items the trace
    takes from it are taken from the real one after the graph (``SideEffects.iterators``)."""

    __slots__ = ("items", "pos", "origins", "remake", "cls")

    def __init__(self, items, origins=(), remake=None, source=None, cls=None):
        super().__init__(source)
        self.items = list(items)
        self.pos = 0
        self.cls = cls          # the real iterator's class, where it is known
        # The lists/dicts iterated over: changing one while the loop runs is refused, as
        # the items here are a snapshot. (container, its items then)
        self.origins = [(c, list(c.items)) for c in origins]
        # (builtin, argument values) that makes the same lazy iterator at run time, for
        # code after a graph break that may still change those containers.
        self.remake = remake if self.origins else None

    def python_type(self):
        return self.cls or type(iter([]))


class ContextManagerValue(Value):
    """A torch global-state context manager (grad mode, autocast, inference mode)."""

    __slots__ = ("kind", "args", "saved")

    def __init__(self, kind, args=()):
        super().__init__(None)
        self.kind = kind      # "grad", "autocast", "inference_mode"
        self.args = args
        self.saved = None

    def python_type(self):
        return object

    def _repr_body(self):
        return f"{self.kind}{self.args!r}"


class ExitValue(Value):
    """The bound ``__exit__`` that BEFORE_WITH pushes for a context manager value."""

    __slots__ = ("manager",)

    def __init__(self, manager, source=None):
        super().__init__(source)
        self.manager = manager


class ExceptionValue(Value):
    """An exception object made while tracing (raised by the code, or by a fold on constants).

    ``cls`` is its class, ``args`` a list of values, ``attrs`` attributes its
    ``__init__`` set; ``cause``/``context`` are ExceptionValues or None.
    ``root_index`` is the instruction of the compiled frame where it first
    entered that frame (where a break replays it natively when it escapes);
    ``raised_at`` the trace's stack snapshot where it was first raised.
    """

    __slots__ = ("cls", "args", "attrs", "cause", "context", "suppress_context", "root_index", "raised_at")

    def __init__(self, cls, args=(), attrs=None):
        super().__init__(None)
        self.cls = cls
        self.args = list(args)
        self.attrs = dict(attrs or {})
        self.cause = None
        self.context = None
        self.suppress_context = False
        self.root_index = None
        self.raised_at = None

    def python_type(self):
        return self.cls

    def _repr_body(self):
        return f"{self.cls.__name__}{tuple(self.args)!r}"


class SavedExcInfoValue(Value):
    """The exception handled before an except block, as PUSH_EXC_INFO saves it on the stack.

    Not rebuilt as a value: at a graph break the code after it gets the exception handled
    from this level on and enters the handler again with it (``codegen.breaks``,
    ``bytecode.resume.HANDLED_PREFIX``), which puts this slot back as eager has it.
    """

    __slots__ = ("prev",)

    def __init__(self, prev):
        super().__init__(None)
        self.prev = prev


class TracebackValue(Value):
    """The traceback handed to ``__exit__``; only its identity can be used while tracing."""
    __slots__ = ()

    def python_type(self):
        return types.TracebackType


class GeneratorValue(Value):
    """A generator made while tracing: its suspended Frame, resumed on each ``next()``."""

    __slots__ = ("frame", "name", "state")

    def __init__(self, frame, name):
        super().__init__(None)
        self.frame = frame
        self.name = name
        self.state = "created"     # created, suspended, running, done

    def python_type(self):
        return types.GeneratorType

    def _repr_body(self):
        return f"{self.name} {self.state}"


class _GetitemOnly:
    def __getitem__(self, i):
        raise IndexError(i)


_SEQUENCE_ITERATOR = type(iter(_GetitemOnly()))   # what iter() gives for __getitem__-only objects
_GROUPER = type(next(itertools.groupby([0]))[1])     # the group iterators itertools.groupby yields


class LazyIteratorValue(Value):
    """A lazy iterator over other iterators: zip, enumerate, map, filter, islice, count, sequence.

    ``kind`` names the combinator; ``parts`` are its iterator values; ``state``
    holds what it needs between items (a counter, the function, slice bounds).
    """

    __slots__ = ("kind", "parts", "state", "done")

    def __init__(self, kind, parts, state=None):
        super().__init__(None)
        self.kind = kind
        self.parts = list(parts)
        self.state = dict(state or {})
        self.done = False

    def python_type(self):
        return {"zip": zip, "enumerate": enumerate, "map": map, "filter": filter,
                "islice": itertools.islice, "count": itertools.count,
                "groupby": itertools.groupby, "grouper": _GROUPER,
                "sequence": _SEQUENCE_ITERATOR}[self.kind]

    def _repr_body(self):
        return self.kind


class FormattedTextValue(Value):
    """A string whose text shows a tensor (an f-string, ``str(t)``): made after the graph (or at a
    break) from the tensor the graph computes, as Python would make it. ``parts`` are strings
    and ``(value, conversion or None, format spec)`` triples."""

    __slots__ = ("parts",)

    def __init__(self, parts):
        super().__init__(None)
        self.parts = list(parts)

    def python_type(self):
        return str


class TracerCallableValue(Value):
    """A callable implemented by the tracer itself (e.g. the ``__exit__`` of a
    ``@contextmanager`` object): ``impl(frame, args, kwargs) -> value``."""

    __slots__ = ("name", "impl")

    def __init__(self, name, impl):
        super().__init__(None)
        self.name = name
        self.impl = impl

    def python_type(self):
        return type(len)

    def _repr_body(self):
        return self.name


# Mutable containers of Python values that a traced frame makes are kept as real objects
# inside a ConstantValue (no source): methods run on them while tracing, and code
# generation copies them for each call.
import collections as _collections  # noqa: E402
MUTABLE_CONSTANT_TYPES = (set, _collections.deque, _collections.Counter)


class HeldValue:
    """A value the trace cannot know by its contents (a tensor, an object hashed by identity),
    held as an element of a real set, frozenset or deque made in the frame. Python hashes and
    compares such objects by identity, and so does this stand-in: equal only to the stand-in
    of the same object (``key``)."""

    __slots__ = ("value", "key")

    def __init__(self, value, key):
        self.value = value
        self.key = key

    def __eq__(self, other):
        return isinstance(other, HeldValue) and other.key == self.key

    def __hash__(self):
        return hash(self.key)

    def __repr__(self):
        return f"<held {type(self.value).__name__}>"


def holds_values(c):
    """True if the real container ``c`` (or a tuple inside it) holds a HeldValue or an id
    taken while tracing (both are rebuilt as code)."""
    if isinstance(c, (HeldValue, TracedId)):
        return True
    if isinstance(c, (tuple, set, frozenset, collections.deque)):
        return any(holds_values(x) for x in c)
    return False


def held_values(c):
    """The values the real container ``c`` (or a tuple, set or deque inside it) holds for the
    trace: HeldValues' values and the objects ids taken while tracing were taken of (rebuilding
    either reads them)."""
    if isinstance(c, HeldValue):
        return [c.value]
    if isinstance(c, TracedId):
        return [c.value] if isinstance(c.value, Value) else []
    if isinstance(c, (tuple, set, frozenset, collections.deque)):
        return [v for x in c for v in held_values(x)]
    return []


def reaches(c, kind, depth=0):
    """True if the real value ``c`` is, or holds in its tuples, lists, sets, dict keys and
    values (nested at most 8 deep), an instance of ``kind``."""
    if isinstance(c, kind):
        return True
    if depth > 8:
        return False
    if isinstance(c, (tuple, list, set, frozenset)):
        return any(reaches(x, kind, depth + 1) for x in c)
    if isinstance(c, dict):
        return any(reaches(k, kind, depth + 1) or reaches(v, kind, depth + 1) for k, v in c.items())
    return False


def holds_traced_id(c):
    """True if the real value ``c`` is or holds an id taken while tracing."""
    return reaches(c, TracedId)


class DefaultDictValue(DictValue):
    """A ``collections.defaultdict`` made while tracing: a missing key gets ``factory()``."""

    __slots__ = ("factory",)

    def __init__(self, items, factory, source=None):
        super().__init__(items, source, cls=collections.defaultdict)
        self.factory = factory


class PartialValue(Value):
    """``functools.partial(func, *args, **kwargs)`` made while tracing."""

    __slots__ = ("func", "args", "kwargs")

    def __init__(self, func, args, kwargs):
        super().__init__(None)
        self.func = func
        self.args = list(args)
        self.kwargs = dict(kwargs)

    def python_type(self):
        return functools.partial


class TracedId:
    """What ``id()`` of a value gives while tracing: equal exactly when the objects are the same.

    The real number is unknown until run time, so it only supports ``==``/``!=`` and hashing.
    Where one escapes the trace (a dict key stored, a value returned), code generation writes
    ``id(<the object>)`` for it, from ``value``: the value the id was taken of.
    """

    __slots__ = ("key", "value")

    def __init__(self, key, value=None):
        self.key = key
        self.value = value

    def __eq__(self, other):
        return isinstance(other, TracedId) and self.key == other.key

    def __ne__(self, other):
        return not self == other

    def __hash__(self):
        return hash(("TracedId", self.key))

    def __repr__(self):
        return "<id known only at run time>"

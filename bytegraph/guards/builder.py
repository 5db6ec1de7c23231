"""Guards: the Python facts a trace relied on, compiled into one function.

The tracer records guards as it reads values from their sources. At the end
of a trace ``compile_guards`` generates two functions over the frame's
arguments:

* ``check(*frame_args)``: straight-line code, cheapest checks first, shared
  sub-expressions read once; returns True when the cache entry may be used.
* ``explain(*frame_args)``: the same checks one at a time; returns the first
  failure in the user's terms ("size of x (dim 0): expected 4, got 8").
"""
import builtins
import enum
import linecache
from collections import UserString
import operator as _operator
from dataclasses import dataclass

import numpy as np
import torch
from torch.nn.modules import module as _mm
from torch.utils._device import DeviceContext
import torch.distributed as dist

from ..residual import warning_is_error
from . import coverage, stamps
from .sources import GlobalSource, ModuleEntrySource, ObjectSource, Source

# Guard kinds, in the order their checks are emitted.
GLOBAL_STATE = "GLOBAL_STATE"
ID_MATCH = "ID_MATCH"
TYPE_MATCH = "TYPE_MATCH"
CONSTANT_MATCH = "CONSTANT_MATCH"
LENGTH_MATCH = "LENGTH_MATCH"
DICT_KEYS = "DICT_KEYS"
TENSOR_MATCH = "TENSOR_MATCH"
ALIAS = "ALIAS"   # two sources named the same object when traced
SHAPE_ENV = "SHAPE_ENV"   # relations between symbolic sizes (expected: graph.shapes.Shapes)
STATE_MATCH = "STATE_MATCH"   # an object's __dict__ equals a snapshot (the object is deep-copied)
NO_HOOKS = "NO_HOOKS"   # an nn.Module called while tracing had no forward hooks
NOT_ALIAS = "NOT_ALIAS"   # two sources named different objects when traced (`is`, id(), or one is mutated)
STORAGE_SHARED = "STORAGE_SHARED"   # two tensor inputs of a graph that mutates: share storage or not
STORAGE_GROUPS = "STORAGE_GROUPS"   # tensor inputs of a graph that mutates: which of them share storage
MISSING_ATTR = "MISSING_ATTR"   # the object had no attribute ``expected`` (hasattr, except AttributeError)
HAS_ATTR = "HAS_ATTR"   # the object had the attribute ``expected`` (hasattr), whatever its value
NOT_OWN_ATTR = "NOT_OWN_ATTR"   # ``expected`` was not in the object's own __dict__ (its class's was used)
NDARRAY_MATCH = "NDARRAY_MATCH"   # an np.ndarray traced as a tensor: exact type, dtype, shape, strides, writeable
ARRAYS_APART = "ARRAYS_APART"   # an array and another array or tensor a mutating graph reads do not overlap in memory
GLOBAL_HOOKS = "GLOBAL_HOOKS"   # no global module hooks (a submodule's call was traced without them)

_NAMED_KINDS = (MISSING_ATTR, HAS_ATTR, NOT_OWN_ATTR)   # ``expected`` is an attribute name


# Dict keys a DICT_KEYS guard compares by value (as the dict's own lookups do); any other key
# is compared by identity.
_PLAIN_KEY_TYPES = (str, int, bool, float, bytes, type(None), torch.device, torch.dtype)


def _has_float_zero(v):
    """Is ``v`` a float zero, or a tuple holding one (whose sign ``==`` does not see)?"""
    if type(v) is float:
        return v == 0.0
    return type(v) is tuple and any(_has_float_zero(x) for x in v)


def _same_constant(obj, expected):
    """What a CONSTANT_MATCH guard checks: the same type and value (a zero's sign too)."""
    if type(obj) is not type(expected) or (obj == expected) is not True:
        return False
    return not _has_float_zero(expected) or repr(obj) == repr(expected)


def value_holds(kind, obj, expected):
    """Does a guard of ``kind`` that checks only its object's value hold on ``obj``? None for
    the other kinds. The checks a compiled guard function makes, for code that checks guards
    one by one (a replayed block's, a loaded cache entry's)."""
    if kind == CONSTANT_MATCH:
        return _same_constant(obj, expected)
    if kind == LENGTH_MATCH:
        return len(obj) == expected
    if kind == DICT_KEYS:
        return list(obj) == list(expected)
    if kind == NO_HOOKS:
        return not (obj._forward_hooks or obj._forward_pre_hooks or obj._backward_hooks or obj._backward_pre_hooks)
    if kind == MISSING_ATTR:
        return not hasattr(obj, expected)
    if kind == HAS_ATTR:
        return hasattr(obj, expected)
    if kind == NOT_OWN_ATTR:
        return expected not in obj.__dict__
    return None


def plain_key(k):
    """A dict key whose equality is a plain yes/no on its value: strings, numbers, devices and
    dtypes (GradScaler keeps its per-device tensors under torch.device keys), enum members,
    and tuples of these."""
    if type(k) in _PLAIN_KEY_TYPES or isinstance(k, enum.Enum):
        return True
    return type(k) is tuple and all(plain_key(x) for x in k)


class TensorMeta:
    """What a TENSOR_MATCH guard remembers of a tensor (not the tensor: it must not stay alive)."""
    __slots__ = ("cls", "dtype", "device", "shape", "stride", "requires_grad", "contiguous", "dense_order")

    def __init__(self, t):
        self.cls = type(t)
        self.dtype = t.dtype
        self.device = t.device
        self.shape = tuple(t.shape)
        self.stride = tuple(t.stride())
        self.requires_grad = t.requires_grad
        self.contiguous = t.is_contiguous()
        # A dense tensor laid out in another order (a transpose, the result of ``nonzero``): its
        # dims from the outermost to the innermost. With symbolic sizes its strides follow
        # from the sizes in that order (the fake's are symbolic too), so that is what is guarded.
        self.dense_order = None
        if not self.contiguous and t.dim() > 1:
            order = tuple(sorted(range(t.dim()), key=lambda d: (-self.stride[d], d)))
            if t.permute(order).is_contiguous():
                self.dense_order = order

    def dim(self):
        return len(self.shape)


class ArrayMeta:
    """What an NDARRAY_MATCH guard remembers of an np.ndarray (not the array itself)."""
    __slots__ = ("dtype", "shape", "strides", "writeable", "contiguous")

    def __init__(self, a):
        self.dtype = a.dtype
        self.shape = a.shape
        self.strides = a.strides
        self.writeable = bool(a.flags.writeable)
        self.contiguous = bool(a.flags.c_contiguous)


_CPU = torch.device("cpu")


def _byte_span(x):
    """[first byte, past the last byte) an array or CPU tensor reads, or None (empty, not in host memory)."""
    if isinstance(x, np.ndarray):
        if x.size == 0:
            return None
        start, steps, item = x.__array_interface__["data"][0], zip(x.shape, x.strides), x.itemsize
    elif isinstance(x, torch.Tensor):
        if x.device.type != "cpu" or x.numel() == 0:
            return None
        item = x.element_size()
        start, steps = x.data_ptr(), [(n, s * item) for n, s in zip(x.shape, x.stride())]
    else:
        return None
    lo = hi = start
    for n, step in steps:
        if step < 0:
            lo += (n - 1) * step
        else:
            hi += (n - 1) * step
    return lo, hi + item


def memory_apart(x, y):
    """Whether two arrays/tensors certainly use different bytes (conservative: ranges, not elements)."""
    a, b = _byte_span(x), _byte_span(y)
    return a is None or b is None or a[1] <= b[0] or b[1] <= a[0]


def function_modes():
    """The TorchFunctionModes entered around a call, as what a graph traced under them depends
    on: the types of the modes other than a device context (``with torch.device(...)``,
    ``set_default_device``), then the default device unless it is the CPU (so a device context
    naming the CPU is the same as none)."""
    n = torch._C._len_torch_function_stack()
    if not n:
        return ()
    modes = [torch._C._get_function_stack_at(i) for i in range(n)]
    kinds = tuple(type(m) for m in modes if not isinstance(m, DeviceContext))
    device = torch.get_default_device()
    return kinds if device == _CPU else kinds + (str(device),)


def default_device():
    """``torch.get_default_device()``, cheaply when no torch function mode is active."""
    if not torch._C._len_torch_function_stack():
        return _CPU
    return torch.get_default_device()


@dataclass
class Guard:
    kind: str
    source: Source          # None for GLOBAL_STATE
    expected: object        # what the trace saw
    detail: str = ""        # for GLOBAL_STATE: which piece of state
    dynamic_dims: tuple = ()  # for TENSOR_MATCH: dims whose size is symbolic (checked by shape guards)
    meta: object = None       # for ID_MATCH of a tensor: its TensorMeta when the guard was made

    def describe(self):
        where = self.source.name() if self.source is not None else self.detail
        if self.kind == GLOBAL_HOOKS:
            return "no global module hooks"
        if self.kind == TENSOR_MATCH:
            t = self.expected
            size = [("*" if d in self.dynamic_dims else n) for d, n in enumerate(t.shape)]
            stride = list(t.stride) if not self.dynamic_dims else "contiguous" if t.contiguous else \
                f"dense in dim order {list(t.dense_order)}" if t.dense_order is not None else list(t.stride)
            return (f"{where}: TENSOR_MATCH {t.cls.__name__} {t.dtype} {t.device} "
                    f"size={size} stride={stride} requires_grad={t.requires_grad}")
        if self.kind == SHAPE_ENV:
            return "symbolic shapes: " + "; ".join(desc for _, desc in self.expected.guards(lambda s: s.name()))
        if self.kind == ID_MATCH:
            return f"{where}: ID_MATCH {_short(self.expected)}"
        if self.kind == TYPE_MATCH:
            return f"{where}: TYPE_MATCH {self.expected.__qualname__}"
        if self.kind == GLOBAL_STATE:
            return f"{self.detail}: {self.expected[1]!r}"
        if self.kind == ALIAS:
            return f"{where}: is {self.expected.name()}"
        if self.kind == NOT_ALIAS:
            return f"{where}: is not {self.expected.name()}"
        if self.kind == NDARRAY_MATCH:
            a = self.expected
            return (f"{where}: NDARRAY_MATCH ndarray {a.dtype} shape={list(a.shape)} strides={list(a.strides)}"
                    f"{'' if a.writeable else ' read-only'}")
        if self.kind == ARRAYS_APART:
            return f"{where}: does not overlap {self.expected.name()} in memory"
        if self.kind == STORAGE_SHARED:
            return f"{where}: {'shares' if self.expected[1] else 'shares no'} storage with {self.expected[0].name()}"
        if self.kind == STORAGE_GROUPS:
            sources, groups = self.expected
            return (f"storage of {len(sources)} tensor inputs: "
                    f"{'all distinct' if len(set(groups)) == len(groups) else 'grouped as ' + repr(groups)}")
        return f"{where}: {self.kind} {self.expected!r}"


def _short(obj):
    name = getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None)
    if name:
        return f"{type(obj).__name__} {name}"
    return f"{type(obj).__name__} at 0x{id(obj):x}"


class GuardSet:
    """Guards collected during one trace, deduplicated, in insertion order."""

    def __init__(self):
        self._guards = {}
        self.objects = {}   # source -> object read there (values.builder.wrap), for guards.coverage
        self.epoch = stamps.EPOCH[0]   # the module epoch when the trace began
        self.recorders = []   # trace.blocks recorders listening to guards and wraps
        self.in_wrap = 0      # >0 while values.builder.wrap runs (its guards come with it)

    def add(self, kind, source, expected, detail="", dynamic_dims=()):
        if self.recorders and not self.in_wrap:
            # trace.blocks records what a module's forward added, to add it again for a copy.
            for r in self.recorders:
                r.on_guard(kind, source, expected, detail, dynamic_dims)
        # One source can carry several of the attribute-name kinds, one per name.
        key = (kind, source, detail, expected if kind in _NAMED_KINDS else None)
        if key not in self._guards:
            meta = TensorMeta(expected) if kind == ID_MATCH and isinstance(expected, torch.Tensor) else None
            self._guards[key] = Guard(kind, source, expected, detail, tuple(dynamic_dims), meta)

    def __iter__(self):
        return iter(self._guards.values())

    def __len__(self):
        return len(self._guards)


def storage_groups(tensors):
    """For each tensor, the index of the first one sharing its storage's address (which inputs
    alias); for one that shares it, with its storage offset too: AOTAutograd rebuilds inputs
    that alias from one base with the offsets of the call it compiled for (the rows of a tensor
    a loop iterates, each passed with the tensor to a graph that changes it)."""
    first = {}
    groups = [first.setdefault(t.untyped_storage().data_ptr(), i) for i, t in enumerate(tensors)]
    shared = {g for i, g in enumerate(groups) if g != i}
    return tuple((g, t.storage_offset()) if g in shared else g for g, t in zip(groups, tensors))


# --- global state -----------------------------------------------------------

def global_state_snapshot():
    """(detail, expression, current value) for every piece of global state a graph depends on.
    An autocast's dtype only while that autocast is on (the guard that it is on fails first)."""
    state = [
        ("grad mode", "_is_grad_enabled()", torch.is_grad_enabled()),
        ("default dtype", "_get_default_dtype()", torch.get_default_dtype()),
        ("autocast (cpu)", "_autocast_enabled('cpu')", torch.is_autocast_enabled("cpu")),
        ("autocast (cuda)", "_autocast_enabled('cuda')", torch.is_autocast_enabled("cuda")),
        ("inference mode", "_inference_mode()", torch.is_inference_mode_enabled()),
        # A TorchFunctionMode entered around the call: what a backend like AOTAutograd traced
        # under it, or without it, is not what runs now; factories follow the default device.
        ("torch function modes", "(_function_modes() if _mode_count() else ())", function_modes()),
    ]
    for device in ("cpu", "cuda"):
        if torch.is_autocast_enabled(device):
            state.append((f"autocast dtype ({device})", f"_autocast_dtype('{device}')",
                          torch.get_autocast_dtype(device)))
    return state


def process_group_state():
    """(rank, world size, group name) in the default process group; None before
    ``init_process_group`` (what traced ``dist.get_rank()`` and friends were read from)."""
    if not dist.is_available() or not dist.is_initialized():
        return None
    world = dist.group.WORLD
    return dist.get_rank(), dist.get_world_size(), world.group_name


def add_process_group_guard(guards):
    """The trace read the default process group (its rank, size or name) as constants."""
    guards.add(GLOBAL_STATE, None, ("_process_group_state()", process_group_state()), "default process group")


def add_global_state_guards(guards):
    for detail, expr, value in global_state_snapshot():
        guards.add(GLOBAL_STATE, None, (expr, value), detail)


# --- code generation ----------------------------------------------------------

class _Emitter:
    """Turns guards into (condition, message) pairs over shared local names."""

    def __init__(self, guards):
        self.ns = {
            "G": None, "B": builtins.__dict__, "torch": torch,
            "_is_grad_enabled": torch.is_grad_enabled,
            "_get_default_dtype": torch.get_default_dtype,
            "_autocast_enabled": torch.is_autocast_enabled, "_autocast_dtype": torch.get_autocast_dtype,
            "_inference_mode": torch.is_inference_mode_enabled,
            "_function_modes": function_modes, "_mode_count": torch._C._len_torch_function_stack,
            "_default_device": default_device, "_ndarray": np.ndarray, "_memory_apart": memory_apart,
            "_mm": _mm, "_process_group_state": process_group_state,
            "_warning_is_error": warning_is_error,
        }
        self._consts = {}
        self.uses = {}
        for g in guards:
            s = g.source
            while s is not None:
                self.uses[s] = self.uses.get(s, 0) + 1
                s = s.base_source
        self.names = {}
        self.assignments = []
        self.prefix = "_v"

    def fork(self, guards, prefix):
        """An emitter for another function over the same namespace and constants (its shared
        sub-expressions get names of their own)."""
        other = _Emitter(guards)
        other.ns = self.ns
        other._consts = self._consts
        other.prefix = prefix
        return other

    def const(self, value):
        key = ("device", str(value)) if isinstance(value, torch.device) else id(value)
        if key not in self._consts:
            name = f"_c{len(self._consts)}"
            self._consts[key] = name
            self.ns[name] = value
        return self._consts[key]

    def render(self, source):
        if source in self.names:
            return self.names[source]
        if isinstance(source, ObjectSource):
            self.ns[source.expr()] = source.obj
        text = source.expr_over(self.render)
        if self.uses.get(source, 0) > 1 and source.base_source is not None:
            name = f"{self.prefix}{len(self.names)}"
            self.names[source] = name
            self.assignments.append(f"{name} = {text}")
            return name
        return text

    def render_plain(self, source):
        if isinstance(source, ObjectSource):
            self.ns[source.expr()] = source.obj
        return source.expr_over(self.render_plain)

    def checks(self, g):
        """[(condition code, failure message f-string code)] for one guard."""
        if g.kind == SHAPE_ENV:
            return [(cond, f"f'symbolic shape guard failed: {desc}'") for cond, desc in g.expected.guards(self.render)]
        if g.kind == GLOBAL_HOOKS:
            return [("not (_mm._global_forward_hooks or _mm._global_forward_pre_hooks or "
                     "_mm._global_backward_hooks or _mm._global_backward_pre_hooks)",
                     "f'a global module hook is registered now; it was not traced'")]
        if g.kind == STORAGE_GROUPS:
            sources, groups = g.expected
            self.ns["_storage_groups"] = storage_groups
            tensors = ", ".join(self.render(src) for src in sources)
            return [(f"_storage_groups(({tensors},)) == {self.const(groups)}",
                     "f'tensor inputs share storage differently than when compiled (the graph mutates "
                     "inputs)'")]
        if g.kind == GLOBAL_STATE:
            expr, value = g.expected
            c = self.const(value)
            return [(f"{expr} == {c}", f"f'{g.detail} changed: {value!r} -> {{{expr}!r}}'")]
        e = self.render(g.source)
        who = g.source.name()
        if g.kind == ID_MATCH:
            c = self.const(g.expected)
            out = [(f"{e} is {c}", f"f'{who} is a different object than when compiled ({_short(g.expected)})'")]
            if isinstance(g.source, ModuleEntrySource) and isinstance(g.expected, torch.Tensor):
                # Module state keeps its identity through .to()/.half()/requires_grad_(): check
                # what the graph was built for too (its data may change freely).
                out += self._state_checks(c, who, g.meta)
            return out
        if g.kind == TYPE_MATCH:
            plain = stamps.PLAIN.get(g.expected, g.expected)
            if plain in stamps.STAMPED_FOR:
                # A module's table is a plain dict or the stamped one standing for it.
                c = self.const((plain, stamps.STAMPED_FOR[plain]))
                return [(f"type({e}) in {c}",
                         f"f'type of {who} changed: expected {plain.__qualname__}, got {{type({e}).__qualname__}}'")]
            c = self.const(g.expected)
            return [(f"type({e}) is {c}",
                     f"f'type of {who} changed: expected {g.expected.__qualname__}, got {{type({e}).__qualname__}}'")]
        if g.kind == CONSTANT_MATCH:
            v = g.expected
            if v is None or isinstance(v, bool):
                cond = f"{e} is {v!r}"
            else:
                cond = f"type({e}) is {self.const(type(v))} and {e} == {self.const(v)}"
                if _has_float_zero(v):
                    # -0.0 == 0.0, but 1 / x, copysign and atan2 tell them apart
                    cond += f" and repr({e}) == {repr(v)!r}"
            return [(cond, f"f'{who} changed: {v!r} -> {{{e}!r}}'")]
        if g.kind == ALIAS:
            other = self.render(g.expected)
            return [(f"{e} is {other}",
                     f"f'{who} and {g.expected.name()} were the same object when compiled, now they differ'")]
        if g.kind == STATE_MATCH:
            return [(f"{e}.__dict__ == {self.const(g.expected)}",
                     f"f'state of {who} changed since it was deep-copied while compiling'")]
        if g.kind == NOT_ALIAS:
            other = self.render(g.expected)
            return [(f"{e} is not {other}",
                     f"f'{who} and {g.expected.name()} were different objects when compiled, now they are the same'")]
        if g.kind == STORAGE_SHARED:
            other_source, shared = g.expected
            other = self.render(other_source)
            same = f"{e}.untyped_storage().data_ptr() == {other}.untyped_storage().data_ptr()"
            relation = "shared" if shared else "did not share"
            return [(f"({same}) is {shared}",
                     f"f'{who} and {other_source.name()} {relation} storage when compiled (the graph mutates "
                     f"inputs), now they differ'")]
        if g.kind == NDARRAY_MATCH:
            a = g.expected
            dt = self.const(a.dtype)
            out = [(f"type({e}) is _ndarray", f"f'{who} is no longer an np.ndarray: got {{type({e}).__qualname__}}'"),
                   (f"{e}.dtype == {dt}", f"f'dtype of {who} changed: expected {a.dtype}, got {{{e}.dtype}}'")]
            if not g.dynamic_dims:
                out += [(f"{e}.shape == {a.shape!r}",
                         f"f'shape of {who} changed: expected {a.shape}, got {{{e}.shape}}'"),
                        (f"{e}.strides == {a.strides!r}",
                         f"f'strides of {who} changed: expected {a.strides}, got {{{e}.strides}}'")]
            else:
                out.append((f"{e}.ndim == {len(a.shape)}",
                            f"f'rank of {who} changed: expected {len(a.shape)} dims, got {{{e}.ndim}}'"))
                out += [(f"{e}.shape[{i}] == {n}", f"f'size of {who} (dim {i}): expected {n}, got {{{e}.shape[{i}]}}'")
                        for i, n in enumerate(a.shape) if i not in g.dynamic_dims]
                out.append((f"{e}.flags.c_contiguous", f"f'{who} is no longer C-contiguous'") if a.contiguous else
                           (f"{e}.strides == {a.strides!r}",
                            f"f'strides of {who} changed: expected {a.strides}, got {{{e}.strides}}'"))
            out.append((f"{e}.flags.writeable is {a.writeable}",
                        f"f'{who} is {'no longer' if a.writeable else 'now'} writeable'"))
            return out
        if g.kind == ARRAYS_APART:
            other = self.render(g.expected)
            return [(f"_memory_apart({e}, {other})",
                     f"f'{who} and {g.expected.name()} did not overlap in memory when compiled (the graph changes "
                     f"arrays in place), now they may'")]
        if g.kind == NO_HOOKS:
            return [(f"not ({e}._forward_hooks or {e}._forward_pre_hooks or {e}._backward_hooks "
                     f"or {e}._backward_pre_hooks)",
                     f"f'{who} has hooks now; they were not traced'")]
        if g.kind == MISSING_ATTR:
            return [(f"not hasattr({e}, {g.expected!r})", f"f'{who}.{g.expected} exists now'")]
        if g.kind == HAS_ATTR:
            return [(f"hasattr({e}, {g.expected!r})", f"f'{who}.{g.expected} no longer exists'")]
        if g.kind == NOT_OWN_ATTR:
            return [(f"{g.expected!r} not in {e}.__dict__",
                     f"f'{who}.{g.expected} was set on the object itself; its class\\'s was traced'")]
        if g.kind == LENGTH_MATCH:
            return [(f"len({e}) == {g.expected}", f"f'length of {who} changed: {g.expected} -> {{len({e})}}'")]
        if g.kind == DICT_KEYS:
            keys = list(g.expected)
            c = self.const(keys)
            if all(plain_key(k) for k in keys):
                return [(f"list({e}) == {c}", f"f'keys of {who} changed: {keys!r} -> {{list({e})!r}}'")]
            # Keys compared by identity (tensors, modules): `==` on them is not a yes/no answer.
            self.ns["_is"] = _operator.is_
            return [(f"len({e}) == {len(keys)} and all(map(_is, {e}, {c}))",
                     f"f'keys of {who} changed (length {len(keys)} -> {{len({e})}}, or other objects)'")]
        if g.kind == TENSOR_MATCH:
            return self._tensor_checks(e, who, g.expected)
        raise AssertionError(g.kind)

    def _state_checks(self, c, who, t):
        return [(f"{c}.dtype is {self.const(t.dtype)} and {c}.device == {self.const(t.device)} and "
                 f"{c}.requires_grad is {t.requires_grad} and {c}.shape == {t.shape!r}",
                 f"f'{who} changed since compiled: expected {t.dtype} {t.device} size={list(t.shape)} "
                 f"requires_grad={t.requires_grad}, got {{{c}.dtype}} {{{c}.device}} size={{list({c}.shape)}} "
                 f"requires_grad={{{c}.requires_grad}}'")]

    def _tensor_checks(self, e, who, t):
        out = [(f"type({e}) is {self.const(t.cls)}",
                f"f'{who} is no longer a {t.cls.__name__}: got {{type({e}).__qualname__}}'"),
               (f"{e}.dtype is {self.const(t.dtype)}",
                f"f'dtype of {who} changed: expected {t.dtype}, got {{{e}.dtype}}'"),
               (f"{e}.device == {self.const(t.device)}",
                f"f'device of {who} changed: expected {t.device}, got {{{e}.device}}'"),
               (f"{e}.requires_grad is {t.requires_grad}",
                f"f'requires_grad of {who} changed: expected {t.requires_grad}, got {{{e}.requires_grad}}'"),
               (f"{e}.dim() == {t.dim()}",
                f"f'rank of {who} changed: expected {t.dim()} dims, got {{{e}.dim()}}'")]
        return out, t.shape, t.stride


def _layout_check(e, t):
    """The stride check of a tensor with symbolic sizes: contiguous, dense in the same dim order,
    or (another layout) the exact strides."""
    if t.contiguous:
        return f"{e}.is_contiguous()"
    if t.dense_order is not None:
        return f"{e}.permute({t.dense_order!r}).is_contiguous()"
    return f"{e}.stride() == {t.stride!r}"


def _triple(message):
    # Triple double quotes, so expressions inside the f-string may use single quotes.
    if message.startswith("f'") and message.endswith("'"):
        return 'f"""' + message[2:-1] + '"""'
    return message


def _lines(em, ordered):
    """(check lines, explain lines) for guards already in emission order."""
    check_lines = []
    explain_lines = []
    for g in ordered:
        before = len(em.assignments)
        result = em.checks(g)
        new_assign = em.assignments[before:]
        for a in new_assign:
            check_lines.append(a)
            explain_lines.append(a)
        if g.kind == TENSOR_MATCH:
            pieces, shape, stride = result
            e = em.render(g.source)
            who = g.source.name()
            conds = [c for c, _ in pieces]
            dynamic = g.dynamic_dims
            if not dynamic:
                conds.append(f"{e}.shape == {shape!r}")
                conds.append(f"{e}.stride() == {stride!r}")
            else:
                conds += [f"{e}.size({i}) == {n}" for i, n in enumerate(shape) if i not in dynamic]
                conds.append(_layout_check(e, g.expected))
            check_lines.append(f"if not ({' and '.join(conds)}): return None")
            for c, m in pieces:
                explain_lines.append(f"if not ({c}): return {_triple(m)}")
            for i, n in enumerate(shape):
                if i in dynamic:
                    continue
                explain_lines.append(f"if {e}.size({i}) != {n}: return " + _triple(
                    f"f'size of {who} (dim {i}): expected {n}, got {{{e}.size({i})}}'"))
            if dynamic and g.expected.contiguous:
                explain_lines.append(f"if not {e}.is_contiguous(): return " + _triple(
                    f"f'{who} is no longer contiguous'"))
            elif dynamic and g.expected.dense_order is not None:
                explain_lines.append(f"if not ({_layout_check(e, g.expected)}): return " + _triple(
                    f"f'{who} is no longer dense in dim order {g.expected.dense_order}: strides {{{e}.stride()}}'"))
            else:
                explain_lines.append(f"if {e}.stride() != {stride!r}: return " + _triple(
                    f"f'stride of {who} changed: expected {stride!r}, got {{{e}.stride()}}'"))
        else:
            conds = [c for c, _ in result]
            if not conds:
                continue
            check_lines.append(f"if not ({' and '.join(conds)}): return None")
            for c, m in result:
                explain_lines.append(f"if not ({c}): return {_triple(m)}")
    return check_lines, explain_lines


def _order(guards):
    # Global state first (cheap), shape relations last (they read sizes of guarded tensors).
    return sorted(guards, key=lambda g: (g.kind != GLOBAL_STATE) + 2 * (g.kind == SHAPE_ENV))


def compile_guards(guards, params, fn_globals, name="guard", hit=True):
    """Generate (check, explain, source_text) for a GuardSet over ``params``.

    ``check`` returns ``hit`` (what the cache entry runs) when every guard holds, else None,
    so a dispatch loop gets the function to call from the one call that checks.

    Guards the module stamp covers (``guards.coverage``) go into a second function,
    ``deep_<name>``, that ``check`` calls only when ``stamps.EPOCH`` moved since the entry last
    passed it; each watched module's class is checked there too.
    """
    every, covered, modules = coverage.partition(guards)
    em = _Emitter(every)
    em.ns["G"] = fn_globals
    em.ns["__hit"] = hit
    check_lines, explain_lines = _lines(em, _order(every))
    sig = ", ".join(params)
    src = [f"def {name}({sig}):", "    try:"]
    src += [f"        {line}" for line in check_lines]
    if covered:
        src += ["        __e = __EPOCH[0]",
                "        if __e != __seen[0]:",
                f"            if __detail('deep_{name}')({sig}) is None: return None",
                "            if __rewatch(__watched): __seen[0] = __e"]
    src += ["    except Exception:", "        return None", "    return __hit", ""]
    classes = [type(m) for m in modules]   # as compiled (the text below is written later)
    ordered = _order(list(guards))
    observed = [g for g in ordered if g.kind in (TENSOR_MATCH, NDARRAY_MATCH) or (
        g.kind == CONSTANT_MATCH and type(g.expected) in (int, float))]

    def detail_source():
        # The detailed checks (run when the module epoch moved), the explain and observe
        # functions (run on a miss) are long on deep models and rarely needed: written and
        # compiled on first use.
        deep_check, deep_explain = [], []
        if covered:
            dem = em.fork(covered, prefix="_d")
            deep_check, deep_explain = _lines(dem, _order(covered))
            for m, cls in zip(modules, classes):
                c, t = em.const(m), em.const(cls)
                deep_check.append(f"if type({c}) is not {t}: return None")
                deep_explain.append(f"if type({c}) is not {t}: return "
                                    f"f'class of a module changed: {cls.__qualname__} -> "
                                    f"{{type({c}).__qualname__}}'")
        detail = [f"def observe_{name}({sig}):", "    out = []"]
        for g in observed:
            e = g.source.expr_over(em.render_plain)
            value = f"tuple({e}.shape)" if g.kind in (TENSOR_MATCH, NDARRAY_MATCH) else e
            detail += ["    try:", f"        out.append({value})", "    except Exception:", "        out.append(None)"]
        detail += ["    return out", ""]
        if covered:
            detail += [f"def deep_{name}({sig}):"]
            detail += [f"    {line}" for line in deep_check]
            detail += ["    return True", ""]
        detail += [f"def explain_{name}({sig}):", "    try:"]
        detail += [f"        {line}" for line in explain_lines + deep_explain]
        detail += ["    except Exception as e:",
                   "        return f'guard raised {type(e).__name__}: {e}'",
                   "    return None", ""]
        return "\n".join(detail)

    ns = em.ns
    ns["__detail"] = lazy = _LazyDetail(ns, detail_source, f"<bytegraph {name} detail>")
    if covered:
        ns["__EPOCH"] = stamps.EPOCH
        # The epoch this entry last passed its detailed checks at: the trace read the modules
        # after it started, so they held then.
        ns["__seen"] = [guards.epoch]
        ns["__watched"] = tuple(modules)
        ns["__rewatch"] = stamps.rewatch
    text = "\n".join(src)
    filename = f"<bytegraph {name}>"
    linecache.cache[filename] = (len(text), None, text.splitlines(True), filename)
    exec(compile(text, filename, "exec"), ns)
    check = ns[name]
    # What automatic dynamic shapes compares on a miss: current sizes and ints at these sources.
    check.observe = _detail_caller(lazy, f"observe_{name}")
    check.observed = observed
    check.covered = len(covered)
    explain = _detail_caller(lazy, f"explain_{name}")
    return check, explain, GuardText(lambda: text + "\n" + lazy.text())


class GuardText(UserString):
    """Guard source text, written when first read (a deep model's detailed checks are long)."""

    def __init__(self, make):
        self._make = make
        self._data = None

    @property
    def data(self):
        if self._data is None:
            self._data = self._make()
        return self._data


class _LazyDetail:
    """Writes and compiles the detail source into the guard's namespace when first needed."""

    def __init__(self, ns, make_source, filename):
        self.ns, self.make_source, self.filename = ns, make_source, filename
        self._text = None

    def text(self):
        if self._text is None:
            self._text = self.make_source()
        return self._text

    def __call__(self, name):
        fn = self.ns.get(name)
        if fn is None:
            text = self.text()
            linecache.cache[self.filename] = (len(text), None, text.splitlines(True), self.filename)
            exec(compile(text, self.filename, "exec"), self.ns)
            fn = self.ns[name]
        return fn


def _detail_caller(detail, name):
    def call_detail(*args):
        return detail(name)(*args)
    return call_detail


def global_names(guards):
    return [g.source.global_name for g in guards if isinstance(g.source, GlobalSource)]

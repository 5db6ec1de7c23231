"""Guards: the Python facts a trace relied on, compiled into one function.

The tracer records guards as it reads values from their sources. At the end
of a trace ``compile_guards`` generates two functions over the frame's
arguments:

* ``check(*frame_args)``: straight-line code, cheapest checks first, shared
  sub-expressions read once; returns True when the cache entry may be used.
* ``explain(*frame_args)``: the same checks one at a time; returns the first
  failure in the user's terms ("size of x (dim 0): expected 4, got 8").

What each kind of guard checks, and how it says so, is its class in ``kinds`` (the kinds are
importable from here: ``builder.ID_MATCH``); this module collects guards and writes the
functions around their checks.
"""
from __future__ import annotations

import builtins
import linecache
from collections import UserString
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Callable

import torch

from . import coverage, stamps, tensor_batch
from .kinds import (ALIAS, ARRAYS_APART, CONSTANT_MATCH, DICT_KEYS, FLOAT_COMPARE, GLOBAL_HOOKS, GLOBAL_STATE, HAS_ATTR, ID_MATCH,
                    KINDS, LENGTH_MATCH, MISSING_ATTR, NDARRAY_MATCH, NO_HOOKS, NOT_ALIAS, NOT_OWN_ATTR, SHAPE_ENV,
                    SIZES_BY_SHAPE_GUARDS, STATE_MATCH, STORAGE_GROUPS, STORAGE_SHARED, SUBCLASS_META, TENSOR_MATCH,
                    TYPE_MATCH, GuardKind, plain_key, subclass_flatten_meta)
# What guard checks read, importable from here as before (values.builder, trace/).
from .probes import (default_device, function_modes, global_state_snapshot, memory_apart, process_group_state,
                     storage_groups)
from .layers import LAYER_MATCH
from .sources import GlobalSource, ObjectSource, Source

__all__ = [
    "GuardKind", "GLOBAL_STATE", "ID_MATCH", "TYPE_MATCH", "CONSTANT_MATCH", "LENGTH_MATCH", "DICT_KEYS",
    "TENSOR_MATCH", "ALIAS", "SHAPE_ENV", "STATE_MATCH", "NO_HOOKS", "NOT_ALIAS", "STORAGE_SHARED",
    "STORAGE_GROUPS", "MISSING_ATTR", "HAS_ATTR", "NOT_OWN_ATTR", "NDARRAY_MATCH", "ARRAYS_APART", "GLOBAL_HOOKS",
    "SUBCLASS_META", "FLOAT_COMPARE", "SIZES_BY_SHAPE_GUARDS", "subclass_flatten_meta", "plain_key", "default_device", "function_modes", "global_state_snapshot", "memory_apart",
    "process_group_state", "storage_groups", "value_holds", "TensorMeta", "ArrayMeta", "Guard", "GuardSet",
    "add_global_state_guards", "add_process_group_guard", "compile_guards", "GuardText", "global_names",
]


def value_holds(kind, obj, expected):
    """Does a guard of ``kind`` that checks only its object hold on ``obj``? None for the kinds
    that need more than the object (another source, global state). The checks a compiled guard
    function makes, for code that checks guards one by one (a replayed block's, a loaded cache
    entry's)."""
    return KINDS[kind].holds(obj, expected)


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
            # (strides alone: a wrapper subclass's permute runs its __torch_dispatch__)
            if _dense_in_order([self.shape[d] for d in order], [self.stride[d] for d in order]):
                self.dense_order = order

    def dim(self):
        return len(self.shape)


def _dense_in_order(sizes, strides):
    """Are sizes/strides (outermost first) those of a contiguous tensor? (as is_contiguous:
    dims of size 1 may have any stride)"""
    expected = 1
    for n, s in zip(reversed(sizes), reversed(strides)):
        if n != 1 and s != expected:
            return False
        expected *= n
    return True


class ArrayMeta:
    """What an NDARRAY_MATCH guard remembers of an np.ndarray (not the array itself)."""
    __slots__ = ("dtype", "shape", "strides", "writeable", "contiguous")

    def __init__(self, a):
        self.dtype = a.dtype
        self.shape = a.shape
        self.strides = a.strides
        self.writeable = bool(a.flags.writeable)
        self.contiguous = bool(a.flags.c_contiguous)


@dataclass
class Guard:
    kind: GuardKind
    source: Source          # None for GLOBAL_STATE
    expected: object        # what the trace saw
    detail: str = ""        # for GLOBAL_STATE: which piece of state
    dynamic_dims: tuple = ()  # for TENSOR_MATCH: dims whose size is symbolic (checked by shape guards)
    meta: object = None       # for ID_MATCH of a tensor: its TensorMeta when the guard was made

    def describe(self) -> str:
        """The guard in the user's terms (explain, the guards log, the debug directory)."""
        return self.kind.describe(self)

    def parts(self):
        """The guards this one stands for: itself, or a stamped layer's (``layers``)."""
        if self.kind is LAYER_MATCH:
            return self.expected.expand(self.source, _part_guard)
        return (self,)


def _part_guard(kind, source, expected, detail, dynamic_dims, meta):
    return Guard(kind, source, expected, detail, tuple(dynamic_dims), meta)


class GuardSet:
    """Guards collected during one trace, deduplicated, in insertion order."""

    def __init__(self):
        self._guards = {}
        self.objects = {}   # source -> object read there (values.builder.wrap), for guards.coverage
        self.epoch = stamps.EPOCH[0]   # the module epoch when the trace began
        self.recorders = []   # trace.nn.blocks recorders listening to guards and wraps
        self.in_wrap = 0      # >0 while values.builder.wrap runs (its guards come with it)
        self.layers = 0       # LAYER_MATCH entries (stamped layers' guards kept as one)
        self.tap = None       # a list taking every guard asked for, while set

    def add(self, kind: GuardKind | str, source: Source | None, expected: object, detail: str = "",
            dynamic_dims=()) -> None:
        """Record that the trace relied on ``kind``'s check of ``source`` (None for global
        state) against ``expected``; one guard per (kind, source, detail), and per ``expected``
        for the kinds that say ``per_expected`` (attribute names, comparisons)."""
        kind = KINDS[kind]
        if self.tap is not None:
            # (trace.nn.region_stamps: every guard one stamp asks for, those already here too)
            self.tap.append((kind, source, expected, detail, dynamic_dims))
        if self.recorders and not self.in_wrap:
            # trace.nn.blocks records what a module's forward added, to add it again for a copy.
            for r in self.recorders:
                r.on_guard(kind, source, expected, detail, dynamic_dims)
        # One source can carry several guards of a per_expected kind, one per expected.
        key = (kind, source, detail, expected if kind.per_expected else None)
        if key not in self._guards:
            meta = TensorMeta(expected) if kind is ID_MATCH and isinstance(expected, torch.Tensor) else None
            self._guards[key] = Guard(kind, source, expected, detail, tuple(dynamic_dims), meta)

    def add_layer(self, source: Source, facts) -> None:
        """A stamped layer's guards as one entry (``layers.LAYER_MATCH``); iterating gives them
        one by one."""
        key = (LAYER_MATCH, source, "", None)
        if key not in self._guards:
            self._guards[key] = Guard(LAYER_MATCH, source, facts)
            self.layers += 1

    def entries(self):
        """The guards as kept: a stamped layer's as one entry (``Guard.parts`` gives its guards)."""
        return self._guards.values()

    def __iter__(self):
        if not self.layers:
            return iter(self._guards.values())
        return (p for g in self._guards.values() for p in g.parts())

    def __len__(self):
        return len(self._guards)

    def listed(self):
        """The guards one by one as a list, a stamped layer's made when first read."""
        return GuardList(self) if self.layers else list(self._guards.values())


class GuardList(Sequence):
    """``list(guard_set)``, expanded on first use (a cache entry's guards are rarely read)."""

    def __init__(self, guard_set):
        self._set = guard_set
        self._list = None

    def _items(self):
        if self._list is None:
            self._list = list(self._set)
        return self._list

    def __getitem__(self, i):
        return self._items()[i]

    def __len__(self):
        return len(self._items())

    def __iter__(self):
        return iter(self._items())


# --- global state -----------------------------------------------------------

def add_process_group_guard(guards: GuardSet) -> None:
    """The trace read the default process group (its rank, size or name) as constants."""
    guards.add(GLOBAL_STATE, None, ("_process_group_state()", process_group_state()), "default process group")


def add_global_state_guards(guards: GuardSet) -> None:
    """Guard every piece of global state a graph depends on (``probes.global_state_snapshot``)."""
    for detail, expr, value in global_state_snapshot():
        guards.add(GLOBAL_STATE, None, (expr, value), detail)


# --- code generation ----------------------------------------------------------

# The guard functions' globals: what every kind's checks call (``kinds``, ``namespace``).
_NAMESPACE = {"G": None, "B": builtins.__dict__, "torch": torch}
for _kind in KINDS.values():
    _NAMESPACE.update(_kind.namespace)
del _kind


class _Emitter:
    """What a kind's checks are written with: constants and sources as names and expressions
    of the guard function, sub-expressions used by several checks read once into locals."""

    def __init__(self, guards):
        self.ns = dict(_NAMESPACE)
        self._consts = {}
        self.uses = {}
        for entry in guards:
            for g in entry.parts():
                s = g.source
                while s is not None:
                    self.uses[s] = self.uses.get(s, 0) + 1
                    s = s.base_source
        self.names = {}
        self.assignments = []
        self.prefix = "_v"
        self.batches = []      # tensor_batch.TensorBatch of the check function's lines

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

    def bind(self, source):
        """``source`` rendered, read into a local first unless it already is a name: for a
        guard whose checks read it several times (a tensor's dtype, device, sizes...)."""
        text = self.render(source)
        if text.isidentifier():
            return text
        name = f"{self.prefix}{len(self.names)}"
        self.names[source] = name
        self.assignments.append(f"{name} = {text}")
        return name

    def render_plain(self, source):
        if isinstance(source, ObjectSource):
            self.ns[source.expr()] = source.obj
        return source.expr_over(self.render_plain)


def _lines(em, ordered):
    """(check lines, explain lines) for guards already in emission order. Static TENSOR_MATCH
    guards of plain tensors, when there are enough of them, are checked by one call at the end
    (``tensor_batch``): each keeps its explain lines."""
    check_lines = []
    explain_lines = []
    batched = [g for g in ordered if g.kind is TENSOR_MATCH and tensor_batch.batchable(g)]
    if len(batched) < tensor_batch.MIN_BATCH:
        batched = []
    in_batch = set(map(id, batched))
    for g in ordered:
        before = len(em.assignments)
        check, explain = g.kind.lines(g, em)
        new_assign = em.assignments[before:]     # shared sub-expressions its checks named
        check_lines += new_assign
        explain_lines += new_assign
        if id(g) not in in_batch:
            check_lines += check
        explain_lines += explain
    if batched:
        batch = tensor_batch.TensorBatch([g.expected for g in batched], [g.source.name() for g in batched])
        em.batches.append(batch)
        name = em.const(batch)
        args = ", ".join(em.render(g.source) for g in batched)    # names bound by their lines above
        # Called through a name of the namespace, which the batch points at the C++ checker's
        # own method once primed (no Python frame repacking hundreds of arguments per call).
        em.ns[f"{name}_check"] = batch.check
        batch.bind(em.ns, f"{name}_check")
        check_lines.append(f"if not {name}_check({args}): return None")
        explain_lines += [f"__why = {name}.explain({args})", "if __why is not None: return __why"]
    return check_lines, explain_lines


def _order(guards):
    # Global state first (cheap), shape relations last (they read sizes of guarded tensors).
    return sorted(guards, key=lambda g: g.kind.order)


def _overrides_function(cls):
    return cls is not torch.Tensor and not issubclass(cls, torch.nn.Parameter) and issubclass(cls, torch.Tensor) \
        and not hasattr(cls, "__tensor_flatten__")


def _without_function_subclasses(fn):
    def run(*args):
        with torch._C.DisableTorchFunction():     # subclasses' overrides and modes
            return fn(*args)
    return run


def _observed_parts(g):
    if g.kind is LAYER_MATCH:
        return [g.expected.part(i, g.source, _part_guard) for i in g.expected.shape.observed]
    return (g,) if g.kind.observation(g) is not None else ()


def compile_guards(guards: GuardSet, params, fn_globals: dict, name: str = "guard",
                   hit: object = True) -> tuple[Callable, Callable, GuardText]:
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
    # (a stamped layer's guards check no tensor's metadata: entries, not parts)
    quiet = any(isinstance(g.expected, TensorMeta) and _overrides_function(g.expected.cls) for g in guards.entries())
    under_modes = any(isinstance(kind, type) for kind in function_modes())
    if quiet or under_modes:
        # A tensor of a __torch_function__ class, or TorchFunctionModes around the call: reading
        # its dtype, sizes... must not run the class's override or the modes' (the program did
        # not ask for those reads).
        em.ns["__no_subclass_function"] = torch._C.DisableTorchFunction if under_modes \
            else torch._C.DisableTorchFunctionSubclass
        src = [src[0], "    with __no_subclass_function():"] + ["    " + line for line in src[1:-1]] + [""]
    classes = [type(m) for m in modules]   # as compiled (the text below is written later)
    ordered = _order(list(guards.entries()))
    # (made when first asked: a stamped layer's parts are made one by one for it)
    observed = _Observed(lambda: [p for g in ordered for p in _observed_parts(g)])

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
            value = f"tuple({e}.shape)" if g.kind.observation(g) == "shape" else e
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
    check.tensor_batches = tuple(em.batches)     # (what tensor_batch.prime builds)
    # What automatic dynamic shapes compares on a miss: current sizes and ints at these sources.
    check.observe = _detail_caller(lazy, f"observe_{name}")
    check.observed = observed
    check.covered = len(covered)
    explain = _detail_caller(lazy, f"explain_{name}")
    if quiet or under_modes:
        check.observe, explain = _without_function_subclasses(check.observe), _without_function_subclasses(explain)
    return check, explain, GuardText(lambda: text + "\n" + lazy.text())


class _Observed:
    """The guards whose values automatic dynamic shapes compares on a miss, listed on first use."""

    def __init__(self, make):
        self._make, self._items = make, None

    def __iter__(self):
        if self._items is None:
            self._items = self._make()
        return iter(self._items)

    def __len__(self):
        return sum(1 for _ in self)


class GuardText(UserString):
    """Guard source text, written when first read (a deep model's detailed checks are long).
    ``make``: what writes it, or the text itself (UserString's slicing and methods that return
    text make a GuardText of their result)."""

    def __init__(self, make):
        self._make, self._data = (None, make) if isinstance(make, str) else (make, None)

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


def global_names(guards) -> list:
    return [g.source.global_name for g in guards if isinstance(g.source, GlobalSource)]

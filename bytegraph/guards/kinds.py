"""Guard kinds: one class per kind of fact a trace relies on.

A kind keeps together everything bytegraph asks of its guards:

* ``checks`` (and ``lines``): its check as Python source for the generated guard function,
  each condition with the failure message ``explain`` returns (``builder.compile_guards``);
* ``describe``: the guard in the user's terms (``bytegraph.explain``, the ``guards`` log, the
  debug directory's guards.txt);
* ``holds`` and ``evaluate``: the same check made directly on objects, for code that checks
  guards one by one (a replayed block's, a loaded cache entry's);
* the facts other modules ask: may the module stamp cover it (``covered``, ``coverage``), may
  one source carry several of it, one per ``expected`` (``per_expected``: an attribute name, a
  comparison), what automatic dynamic shapes observes at its source (``observation``), how
  ``runtime.persist`` writes it (``persisted_as``), where its checks go in the function
  (``order``).

A kind is a ``str`` equal to its name ("ID_MATCH"): listings, logs and saved cache entries
spell it as before, and ``KINDS`` maps a name back to its kind. Adding a kind is adding one
class and its one instance here.
"""
from __future__ import annotations

import enum
import operator

import numpy as np
import torch
from torch.nn.modules import module as _mm

from . import stamps
from .coverage import IMMUTABLE_CONSTANTS, is_heap_type, own_attribute
from .probes import GLOBAL_STATE_NAMES, global_state_snapshot, memory_apart, storage_groups
from .sources import AttrSource, ModuleEntrySource

# Dict keys a DICT_KEYS guard compares by value (as the dict's own lookups do); any other key
# is compared by identity.
_PLAIN_KEY_TYPES = (str, int, bool, float, bytes, type(None), torch.device, torch.dtype)


def plain_key(k) -> bool:
    """A dict key whose equality is a plain yes/no on its value: strings, numbers, devices and
    dtypes (GradScaler keeps its per-device tensors under torch.device keys), enum members,
    and tuples of these."""
    if type(k) in _PLAIN_KEY_TYPES or isinstance(k, enum.Enum):
        return True
    return type(k) is tuple and all(plain_key(x) for x in k)


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


def _short(obj):
    name = getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None)
    if name:
        return f"{type(obj).__name__} {name}"
    return f"{type(obj).__name__} at 0x{id(obj):x}"


def _where(g):
    return g.source.name() if g.source is not None else g.detail


def triple(message):
    """A failure message's f-string code in triple double quotes, so expressions inside it may
    use single quotes."""
    if message.startswith("f'") and message.endswith("'"):
        return 'f"""' + message[2:-1] + '"""'
    return message


def _no_hooks(e):
    return f"not ({e}._forward_hooks or {e}._forward_pre_hooks or {e}._backward_hooks or {e}._backward_pre_hooks)"


# Every kind by its name (a kind is equal to its name, so a kind finds itself too); filled as
# kinds are made.
KINDS = {}


class GuardKind(str):
    """One kind of guard. Its methods take the ``builder.Guard`` and, to emit code, the
    ``builder._Emitter`` (``const`` names a constant, ``render`` a source's expression)."""

    order = 1                 # where its checks go: 0 first (cheap global state), 3 last
    per_expected = False      # a source has one guard per ``expected`` (an attribute name...)
    pins = False              # checks identity: the object at its source is the traced one
    persisted_as = None       # how runtime.persist writes ``expected``; None: not portable
    holds_when_unreadable = False   # evaluate's answer when its source raises AttributeError
    namespace = {}            # names its emitted checks call (the guard function's globals)

    def __new__(cls, name):
        kind = super().__new__(cls, name)
        KINDS[name] = kind
        return kind

    def __reduce__(self):
        # Copies and pickles of a kind are the kind itself.
        return kind_named, (str(self),)

    # -- code ---------------------------------------------------------------------------------

    def checks(self, g, em):
        """[(condition code, failure message f-string code)] for one guard."""
        raise NotImplementedError(self)

    def lines(self, g, em):
        """(lines of the check function, lines of the explain function) for one guard."""
        pieces = self.checks(g, em)
        if not pieces:
            return [], []
        return ([f"if not ({' and '.join(c for c, _ in pieces)}): return None"],
                [f"if not ({c}): return {triple(m)}" for c, m in pieces])

    def describe(self, g) -> str:
        return f"{_where(g)}: {self} {g.expected!r}"

    # -- direct evaluation ---------------------------------------------------------------------

    def holds(self, obj, expected):
        """Does the check hold on ``obj``? None for a kind that needs more than its object."""
        return None

    def evaluate(self, g, resolve) -> bool:
        """Does ``g`` hold now, its sources read through ``resolve`` (source -> object)?"""
        try:
            obj = resolve(g.source)
        except AttributeError:
            return self.holds_when_unreadable
        except Exception:
            return False
        return self.holds_over(obj, g, resolve)

    def holds_over(self, obj, g, resolve):
        return bool(self.holds(obj, g.expected))

    # -- facts ---------------------------------------------------------------------------------

    def covered(self, cov, g, value) -> bool:
        """May the module stamp cover ``g`` (``coverage.Coverage``; ``value``: the object read
        at its source)? Only when its source is fixed, and then as ``covered_when_fixed`` says."""
        return cov.fixed(g.source) and self.covered_when_fixed(cov, g, value)

    def covered_when_fixed(self, cov, g, value):
        return False

    def observation(self, g):
        """What automatic dynamic shapes reads at ``g``'s source on a miss: "shape", "value" or None."""
        return None


class GlobalState(GuardKind):
    """A piece of global state (grad mode, default dtype, autocast...): ``expected`` is
    (expression reading it, value), ``detail`` names it."""
    order = 0
    persisted_as = "value"
    namespace = GLOBAL_STATE_NAMES

    def checks(self, g, em):
        expr, value = g.expected
        c = em.const(value)
        return [(f"{expr} == {c}", f"f'{g.detail} changed: {value!r} -> {{{expr}!r}}'")]

    def describe(self, g):
        return f"{g.detail}: {g.expected[1]!r}"

    def evaluate(self, g, resolve):
        now = {detail: value for detail, _, value in global_state_snapshot()}
        return now.get(g.detail, object()) == g.expected[1]


class IdMatch(GuardKind):
    """The object at the source is ``expected`` (for a tensor, ``Guard.meta`` keeps its TensorMeta)."""
    pins = True
    persisted_as = "identity"

    def checks(self, g, em):
        e, who = em.render(g.source), g.source.name()
        c = em.const(g.expected)
        out = [(f"{e} is {c}", f"f'{who} is a different object than when compiled ({_short(g.expected)})'")]
        if isinstance(g.source, ModuleEntrySource) and isinstance(g.expected, torch.Tensor):
            # Module state keeps its identity through .to()/.half()/requires_grad_(): check
            # what the graph was built for too (its data may change freely).
            t = g.meta
            out.append((f"{c}.dtype is {em.const(t.dtype)} and {c}.device == {em.const(t.device)} and "
                        f"{c}.requires_grad is {t.requires_grad} and {c}.shape == {t.shape!r}",
                        f"f'{who} changed since compiled: expected {t.dtype} {t.device} size={list(t.shape)} "
                        f"requires_grad={t.requires_grad}, got {{{c}.dtype}} {{{c}.device}} size={{list({c}.shape)}} "
                        f"requires_grad={{{c}.requires_grad}}'"))
        return out

    def describe(self, g):
        return f"{_where(g)}: ID_MATCH {_short(g.expected)}"

    def holds(self, obj, expected):
        return obj is expected

    def covered_when_fixed(self, cov, g, value):
        return True


class TypeMatch(GuardKind):
    """The object's exact type is ``expected`` (a module table's plain dict or its stamped twin)."""
    persisted_as = "ref"

    def checks(self, g, em):
        e, who = em.render(g.source), g.source.name()
        plain = stamps.PLAIN.get(g.expected, g.expected)
        if plain in stamps.STAMPED_FOR:
            # A module's table is a plain dict or the stamped one standing for it.
            c = em.const((plain, stamps.STAMPED_FOR[plain]))
            return [(f"type({e}) in {c}",
                     f"f'type of {who} changed: expected {plain.__qualname__}, got {{type({e}).__qualname__}}'")]
        c = em.const(g.expected)
        return [(f"type({e}) is {c}",
                 f"f'type of {who} changed: expected {g.expected.__qualname__}, got {{type({e}).__qualname__}}'")]

    def describe(self, g):
        return f"{_where(g)}: TYPE_MATCH {g.expected.__qualname__}"

    def holds(self, obj, expected):
        plain = stamps.PLAIN.get(type(obj), type(obj))
        return type(obj) is expected or plain is stamps.PLAIN.get(expected, expected)

    def covered(self, cov, g, value):
        if isinstance(value, torch.nn.Module):
            # ``m.__class__ = C`` goes through nn.Module.__setattr__.
            return cov.stable(g.source) and cov.watch_if(value)
        return cov.fixed(g.source) and not is_heap_type(g.expected)   # a builtin type: __class__ cannot change


class ConstantMatch(GuardKind):
    """The object has the type and value of ``expected`` (a float zero's sign too)."""
    persisted_as = "value"

    def checks(self, g, em):
        e, who = em.render(g.source), g.source.name()
        v = g.expected
        if v is None or isinstance(v, bool):
            cond = f"{e} is {v!r}"
        else:
            cond = f"type({e}) is {em.const(type(v))} and {e} == {em.const(v)}"
            if _has_float_zero(v):
                # -0.0 == 0.0, but 1 / x, copysign and atan2 tell them apart
                cond += f" and repr({e}) == {repr(v)!r}"
        return [(cond, f"f'{who} changed: {v!r} -> {{{e}!r}}'")]

    def holds(self, obj, expected):
        return _same_constant(obj, expected)

    def covered_when_fixed(self, cov, g, value):
        return isinstance(g.expected, IMMUTABLE_CONSTANTS)

    def observation(self, g):
        # NumPy integer and float scalars too: automatic dynamic treats them as it treats ints and floats.
        changes = type(g.expected) in (int, float) or isinstance(g.expected, (np.integer, np.floating))
        return "value" if changes else None


_COMPARISONS = {"<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge, "==": operator.eq,
                "!=": operator.ne}


class FloatCompare(GuardKind):
    """A float that changes between calls (a graph input) compares with a number as when
    compiled: ``expected`` is (op, number, outcome). The trace decided a branch on that
    comparison, not on the float's value, so other values with the same outcome reuse the entry
    (torch.compile's guard on a symbolic float's comparison)."""
    per_expected = True       # several comparisons of one float
    persisted_as = "value"

    def checks(self, g, em):
        e, who = em.render(g.source), g.source.name()
        op, number, outcome = g.expected
        return [(f"({e} {op} {em.const(number)}) is {outcome!r}",
                 f"f'{who} {op} {number!r} is no longer {outcome}: {who} is {{{e}!r}}'")]

    def describe(self, g):
        op, number, outcome = g.expected
        return f"{_where(g)}: FLOAT_COMPARE ({op} {number!r}) is {outcome}"

    def holds(self, obj, expected):
        op, number, outcome = expected
        return _COMPARISONS[op](obj, number) is outcome


def _table_covered(cov, g, value):
    """DICT_KEYS and LENGTH_MATCH: a tuple, or a module's own table while it is stamped (hook
    tables are, while empty)."""
    if isinstance(value, tuple):
        return True
    source = g.source
    m = cov.owner(source)
    return isinstance(source, AttrSource) and source.attr in stamps.TABLES \
        and type(m.__dict__.get(source.attr)) in stamps.STAMPED


class LengthMatch(GuardKind):
    """``len()`` of the object is ``expected``."""
    persisted_as = "value"

    def checks(self, g, em):
        e, who = em.render(g.source), g.source.name()
        return [(f"len({e}) == {g.expected}", f"f'length of {who} changed: {g.expected} -> {{len({e})}}'")]

    def holds(self, obj, expected):
        return len(obj) == expected

    def covered_when_fixed(self, cov, g, value):
        return _table_covered(cov, g, value)


class DictKeys(GuardKind):
    """The object's keys are ``expected``, in order (plain keys by value, others by identity)."""
    persisted_as = "keys"
    namespace = {"_is": operator.is_}

    def checks(self, g, em):
        e, who = em.render(g.source), g.source.name()
        keys = list(g.expected)
        c = em.const(keys)
        if all(plain_key(k) for k in keys):
            return [(f"list({e}) == {c}", f"f'keys of {who} changed: {keys!r} -> {{list({e})!r}}'")]
        # Keys compared by identity (tensors, modules): `==` on them is not a yes/no answer.
        return [(f"len({e}) == {len(keys)} and all(map(_is, {e}, {c}))",
                 f"f'keys of {who} changed (length {len(keys)} -> {{len({e})}}, or other objects)'")]

    def holds(self, obj, expected):
        return list(obj) == list(expected)

    def covered_when_fixed(self, cov, g, value):
        return _table_covered(cov, g, value)


def _layout_check(e, t):
    """The stride check of a tensor with symbolic sizes: contiguous, dense in the same dim order,
    or (another layout) the exact strides."""
    if t.contiguous:
        return f"{e}.is_contiguous()"
    if t.dense_order is not None:
        return f"{e}.permute({t.dense_order!r}).is_contiguous()"
    return f"{e}.stride() == {t.stride!r}"


def _plain_cpu(t):
    """Is ``t`` (a TensorMeta) a CPU tensor whose class reads device and is_cpu as torch.Tensor
    does? Then ``is_cpu`` is its device check (a CPU device has no index) without making a
    torch.device."""
    return t.device.type == "cpu" and t.device.index is None and t.cls.device is torch.Tensor.device \
        and t.cls.is_cpu is torch.Tensor.is_cpu


class TensorMatch(GuardKind):
    """A tensor's class, dtype, device, requires_grad, sizes and strides (``expected``: its
    TensorMeta; sizes in ``dynamic_dims`` are left to the shape guards)."""
    persisted_as = "tensor_meta"

    def checks(self, g, em):
        e, who, t = em.render(g.source), g.source.name(), g.expected
        return [(f"type({e}) is {em.const(t.cls)}",
                 f"f'{who} is no longer a {t.cls.__name__}: got {{type({e}).__qualname__}}'"),
                (f"{e}.dtype is {em.const(t.dtype)}",
                 f"f'dtype of {who} changed: expected {t.dtype}, got {{{e}.dtype}}'"),
                (f"{e}.device == {em.const(t.device)}",
                 f"f'device of {who} changed: expected {t.device}, got {{{e}.device}}'"),
                (f"{e}.requires_grad is {t.requires_grad}",
                 f"f'requires_grad of {who} changed: expected {t.requires_grad}, got {{{e}.requires_grad}}'"),
                (f"{e}.dim() == {t.dim()}",
                 f"f'rank of {who} changed: expected {t.dim()} dims, got {{{e}.dim()}}'")]

    def lines(self, g, em):
        # One condition for the check function (sizes and strides with the rest); the explain
        # function tells each size and the layout apart.
        em.bind(g.source)
        pieces = self.checks(g, em)
        e, who, t = em.render(g.source), g.source.name(), g.expected
        shape, stride, dynamic = t.shape, t.stride, g.dynamic_dims
        conds = [c for c, _ in pieces]
        if _plain_cpu(t):
            conds[2] = f"{e}.is_cpu"
        if not dynamic:
            # Per call, for every tensor of a model's optimizer step: the cheapest checks that
            # say the same. Equal sizes imply the rank; with every size at least 2, a
            # contiguous tensor has exactly the contiguous strides; a rank of 0 is all a 0-dim
            # tensor's sizes and strides (an optimizer's step counters).
            if shape:
                del conds[-1]      # the rank
                conds.append(f"{e}.shape == {shape!r}")
                if t.contiguous and all(n >= 2 for n in shape):
                    conds.append(f"{e}.is_contiguous()")
                else:
                    conds.append(f"{e}.stride() == {stride!r}")
        else:
            conds += [f"{e}.size({i}) == {n}" for i, n in enumerate(shape) if i not in dynamic]
            conds.append(_layout_check(e, t))
        check = [f"if not ({' and '.join(conds)}): return None"]
        explain = [f"if not ({c}): return {triple(m)}" for c, m in pieces]
        for i, n in enumerate(shape):
            if i in dynamic:
                continue
            explain.append(f"if {e}.size({i}) != {n}: return " + triple(
                f"f'size of {who} (dim {i}): expected {n}, got {{{e}.size({i})}}'"))
        if dynamic and t.contiguous:
            explain.append(f"if not {e}.is_contiguous(): return " + triple(f"f'{who} is no longer contiguous'"))
        elif dynamic and t.dense_order is not None:
            explain.append(f"if not ({_layout_check(e, t)}): return " + triple(
                f"f'{who} is no longer dense in dim order {t.dense_order}: strides {{{e}.stride()}}'"))
        else:
            explain.append(f"if {e}.stride() != {stride!r}: return " + triple(
                f"f'stride of {who} changed: expected {stride!r}, got {{{e}.stride()}}'"))
        return check, explain

    def describe(self, g):
        t = g.expected
        size = [("*" if d in g.dynamic_dims else n) for d, n in enumerate(t.shape)]
        stride = list(t.stride) if not g.dynamic_dims else "contiguous" if t.contiguous else \
            f"dense in dim order {list(t.dense_order)}" if t.dense_order is not None else list(t.stride)
        return (f"{_where(g)}: TENSOR_MATCH {t.cls.__name__} {t.dtype} {t.device} "
                f"size={size} stride={stride} requires_grad={t.requires_grad}")

    def holds(self, obj, t):
        # (all sizes: stricter than the compiled check where sizes are symbolic)
        return (type(obj) is t.cls and obj.dtype == t.dtype and obj.device == t.device
                and tuple(obj.shape) == t.shape and tuple(obj.stride()) == t.stride
                and obj.requires_grad == t.requires_grad)

    def observation(self, g):
        return "shape"


class Alias(GuardKind):
    """The object is the one at another source, ``expected`` (two sources named one object)."""
    persisted_as = "source"
    same = True

    def checks(self, g, em):
        e, who, other = em.render(g.source), g.source.name(), em.render(g.expected)
        return [(f"{e} is {other}",
                 f"f'{who} and {g.expected.name()} were the same object when compiled, now they differ'")]

    def describe(self, g):
        return f"{_where(g)}: is {g.expected.name()}"

    def holds_over(self, obj, g, resolve):
        return (obj is resolve(g.expected)) == self.same

    def covered_when_fixed(self, cov, g, value):
        return cov.fixed(g.expected)


class NotAlias(Alias):
    """The object is not the one at another source, ``expected`` (``is``, id(), or one is mutated)."""
    same = False

    def checks(self, g, em):
        e, who, other = em.render(g.source), g.source.name(), em.render(g.expected)
        return [(f"{e} is not {other}",
                 f"f'{who} and {g.expected.name()} were different objects when compiled, now they are the same'")]

    def describe(self, g):
        return f"{_where(g)}: is not {g.expected.name()}"


class ShapeEnv(GuardKind):
    """Relations between symbolic sizes (``expected``: graph.shapes.Shapes). Checked last: they
    read sizes of tensors the other guards checked."""
    order = 3

    def checks(self, g, em):
        return [(cond, f"f'symbolic shape guard failed: {desc}'") for cond, desc in g.expected.guards(em.render)]

    def describe(self, g):
        return "symbolic shapes: " + "; ".join(desc for _, desc in g.expected.guards(lambda s: s.name()))


class StateMatch(GuardKind):
    """The object's ``__dict__`` equals a snapshot, ``expected`` (the object was deep-copied)."""
    persisted_as = "value"

    def checks(self, g, em):
        e, who = em.render(g.source), g.source.name()
        return [(f"{e}.__dict__ == {em.const(g.expected)}",
                 f"f'state of {who} changed since it was deep-copied while compiling'")]

    def holds(self, obj, expected):
        return obj.__dict__ == expected


class NoHooks(GuardKind):
    """An nn.Module called while tracing had no forward or backward hooks."""
    persisted_as = "none"

    def checks(self, g, em):
        e, who = em.render(g.source), g.source.name()
        return [(_no_hooks(e), f"f'{who} has hooks now; they were not traced'")]

    def holds(self, obj, expected):
        return not (obj._forward_hooks or obj._forward_pre_hooks or obj._backward_hooks or obj._backward_pre_hooks)

    def covered(self, cov, g, value):
        return isinstance(value, torch.nn.Module) and cov.stable(g.source) and cov.watch_if(value) \
            and stamps.hooks_watched(value)


class GlobalHooks(GuardKind):
    """No global module hooks (a submodule's call was traced without them)."""
    persisted_as = "none"
    namespace = {"_mm": _mm}

    def checks(self, g, em):
        return [("not (_mm._global_forward_hooks or _mm._global_forward_pre_hooks or "
                 "_mm._global_backward_hooks or _mm._global_backward_pre_hooks)",
                 "f'a global module hook is registered now; it was not traced'")]

    def describe(self, g):
        return "no global module hooks"

    def evaluate(self, g, resolve):
        return not stamps.global_hooks()


class StorageShared(GuardKind):
    """Two tensor inputs of a graph that mutates share storage or not (``expected``: (the other
    source, shared))."""
    persisted_as = "storage"

    def checks(self, g, em):
        e, who = em.render(g.source), g.source.name()
        other_source, shared = g.expected
        other = em.render(other_source)
        same = f"{e}.untyped_storage().data_ptr() == {other}.untyped_storage().data_ptr()"
        relation = "shared" if shared else "did not share"
        return [(f"({same}) is {shared}",
                 f"f'{who} and {other_source.name()} {relation} storage when compiled (the graph mutates "
                 f"inputs), now they differ'")]

    def describe(self, g):
        return f"{_where(g)}: {'shares' if g.expected[1] else 'shares no'} storage with {g.expected[0].name()}"

    def holds_over(self, obj, g, resolve):
        other, shared = g.expected
        return (obj.untyped_storage().data_ptr() == resolve(other).untyped_storage().data_ptr()) == shared


class StorageGroups(GuardKind):
    """Which tensor inputs of a graph that mutates share storage (``expected``: (sources,
    ``probes.storage_groups`` of their tensors))."""
    namespace = {"_storage_groups": storage_groups}

    def checks(self, g, em):
        sources, groups = g.expected
        tensors = ", ".join(em.render(src) for src in sources)
        return [(f"_storage_groups(({tensors},)) == {em.const(groups)}",
                 "f'tensor inputs share storage differently than when compiled (the graph mutates "
                 "inputs)'")]

    def describe(self, g):
        sources, groups = g.expected
        return (f"storage of {len(sources)} tensor inputs: "
                f"{'all distinct' if len(set(groups)) == len(groups) else 'grouped as ' + repr(groups)}")

    def evaluate(self, g, resolve):
        sources, groups = g.expected
        try:
            return storage_groups([resolve(s) for s in sources]) == groups
        except Exception:
            return False


class NdarrayMatch(GuardKind):
    """An np.ndarray traced as a tensor: exact type, dtype, shape, strides, writeable
    (``expected``: its ArrayMeta)."""
    namespace = {"_ndarray": np.ndarray}

    def checks(self, g, em):
        e, who, a = em.render(g.source), g.source.name(), g.expected
        dt = em.const(a.dtype)
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

    def describe(self, g):
        a = g.expected
        return (f"{_where(g)}: NDARRAY_MATCH ndarray {a.dtype} shape={list(a.shape)} strides={list(a.strides)}"
                f"{'' if a.writeable else ' read-only'}")

    def observation(self, g):
        return "shape"


class ArraysApart(GuardKind):
    """An array and another array or tensor (at ``expected``) a mutating graph reads do not
    overlap in memory."""
    namespace = {"_memory_apart": memory_apart}

    def checks(self, g, em):
        e, who, other = em.render(g.source), g.source.name(), em.render(g.expected)
        return [(f"_memory_apart({e}, {other})",
                 f"f'{who} and {g.expected.name()} did not overlap in memory when compiled (the graph changes "
                 f"arrays in place), now they may'")]

    def describe(self, g):
        return f"{_where(g)}: does not overlap {g.expected.name()} in memory"

    def holds_over(self, obj, g, resolve):
        return memory_apart(obj, resolve(g.expected))


class MissingAttr(GuardKind):
    """The object had no attribute ``expected`` (hasattr, except AttributeError)."""
    per_expected = True
    persisted_as = "value"
    holds_when_unreadable = True

    def checks(self, g, em):
        e, who = em.render(g.source), g.source.name()
        return [(f"not hasattr({e}, {g.expected!r})", f"f'{who}.{g.expected} exists now'")]

    def holds(self, obj, expected):
        return not hasattr(obj, expected)


class HasAttr(GuardKind):
    """The object had the attribute ``expected`` (hasattr), whatever its value."""
    per_expected = True
    persisted_as = "value"

    def checks(self, g, em):
        e, who = em.render(g.source), g.source.name()
        return [(f"hasattr({e}, {g.expected!r})", f"f'{who}.{g.expected} no longer exists'")]

    def holds(self, obj, expected):
        return hasattr(obj, expected)

    def covered_when_fixed(self, cov, g, value):
        # A module's own attribute goes away only through its (stamped) __delattr__.
        return isinstance(value, torch.nn.Module) and own_attribute(value, g.expected) and cov.watch_if(value)


class NotOwnAttr(GuardKind):
    """``expected`` was not in the object's own __dict__ (its class's attribute was used)."""
    per_expected = True
    persisted_as = "value"

    def checks(self, g, em):
        e, who = em.render(g.source), g.source.name()
        return [(f"{g.expected!r} not in {e}.__dict__",
                 f"f'{who}.{g.expected} was set on the object itself; its class\\'s was traced'")]

    def holds(self, obj, expected):
        return expected not in obj.__dict__

    def covered_when_fixed(self, cov, g, value):
        # Setting it on a module goes through its (stamped) __setattr__.
        return isinstance(value, torch.nn.Module) and cov.watch_if(value)


class _CheckedByShapeGuards:
    """Stands for the sizes and strides in a flatten context that are the tensor's own (DTensor's
    ``TensorMeta``) when some of them are symbolic: TENSOR_MATCH and the shape guards check
    them, so the context compares equal there whatever they are."""

    def __eq__(self, other):
        return True

    def __ne__(self, other):
        return False

    __hash__ = object.__hash__

    def __repr__(self):
        return "<checked by the shape guards>"

    def __reduce__(self):
        return "SIZES_BY_SHAPE_GUARDS"


SIZES_BY_SHAPE_GUARDS = _CheckedByShapeGuards()


def subclass_flatten_meta(t):
    """What a traceable wrapper subclass says of its layout: (inner tensor names, context)."""
    names, ctx = t.__tensor_flatten__()
    return tuple(names), ctx


def subclass_meta_holds(t, expected):
    """Does the wrapper subclass ``t`` flatten as ``expected`` (names, context) did? The class's
    own ``__metadata_guard__`` compares contexts where it has one (as under torch.compile)."""
    names, ctx = subclass_flatten_meta(t)
    if names != expected[0]:
        return False
    same = getattr(type(t), "__metadata_guard__", None)
    try:
        ok = same(expected[1], ctx) if same is not None else ctx == expected[1]
        return ok is True or (type(ok) is not bool and bool(ok) is True)
    except Exception:
        return False


class SubclassMeta(GuardKind):
    """A traceable wrapper subclass (DTensor, TwoTensor, a quantized weight) flattens to the same
    inner tensor names and context (``expected``: both, from ``__tensor_flatten__``); its type,
    sizes and its inner tensors have TENSOR_MATCH guards of their own."""
    namespace = {"_subclass_meta_holds": subclass_meta_holds}

    def checks(self, g, em):
        e, who = em.render(g.source), g.source.name()
        c = em.const(g.expected)
        return [(f"_subclass_meta_holds({e}, {c})",
                 f"f'{who} flattens differently than when compiled: expected inner tensors {list(g.expected[0])} "
                 f"and context {g.expected[1]!r}'")]

    def describe(self, g):
        return f"{_where(g)}: SUBCLASS_META inner={list(g.expected[0])} context={g.expected[1]!r}"

    def holds(self, obj, expected):
        return subclass_meta_holds(obj, expected)


GLOBAL_STATE = GlobalState("GLOBAL_STATE")
ID_MATCH = IdMatch("ID_MATCH")
TYPE_MATCH = TypeMatch("TYPE_MATCH")
CONSTANT_MATCH = ConstantMatch("CONSTANT_MATCH")
LENGTH_MATCH = LengthMatch("LENGTH_MATCH")
DICT_KEYS = DictKeys("DICT_KEYS")
TENSOR_MATCH = TensorMatch("TENSOR_MATCH")
ALIAS = Alias("ALIAS")
SHAPE_ENV = ShapeEnv("SHAPE_ENV")
STATE_MATCH = StateMatch("STATE_MATCH")
NO_HOOKS = NoHooks("NO_HOOKS")
NOT_ALIAS = NotAlias("NOT_ALIAS")
STORAGE_SHARED = StorageShared("STORAGE_SHARED")
STORAGE_GROUPS = StorageGroups("STORAGE_GROUPS")
MISSING_ATTR = MissingAttr("MISSING_ATTR")
HAS_ATTR = HasAttr("HAS_ATTR")
NOT_OWN_ATTR = NotOwnAttr("NOT_OWN_ATTR")
NDARRAY_MATCH = NdarrayMatch("NDARRAY_MATCH")
ARRAYS_APART = ArraysApart("ARRAYS_APART")
GLOBAL_HOOKS = GlobalHooks("GLOBAL_HOOKS")
SUBCLASS_META = SubclassMeta("SUBCLASS_META")
FLOAT_COMPARE = FloatCompare("FLOAT_COMPARE")


def kind_named(name) -> GuardKind:
    """The kind called ``name`` (a saved cache entry's, a copy's)."""
    return KINDS[name]

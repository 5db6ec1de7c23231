"""``match`` statements: the pattern-matching opcodes, as CPython's ceval defines them.

MATCH_SEQUENCE / MATCH_MAPPING test the subject's type flags (so classes registered
with ``collections.abc.Sequence``/``Mapping`` count, ``str``/``bytes`` do not);
MATCH_KEYS reads each key through the subject's own ``get(key, dummy)`` (a
``defaultdict`` creates nothing, a user ``Mapping`` runs its ``__getitem__``);
MATCH_CLASS checks ``isinstance``, then reads the positional sub-patterns'
attributes through ``__match_args__`` and the keyword ones by name, stopping at the
first missing attribute (no match) and raising CPython's TypeErrors for bad patterns.
Guards and captures are ordinary bytecode around these.
"""
from ...bytecode.versions import MATCH_CLASS_NOT_A_CLASS
from ...errors import Unsupported
from ...values.base import ConstantValue, ObjectValue, TupleValue
from ...values.builder import wrap
from ..core import ops
from ..python import attrs
from ..core.basics import as_constant, describe, type_name
from ..python.exceptions import MissingAttribute, TracedRaise, raise_new
from ..python.operators import is_same, python_type

_TPFLAGS_SEQUENCE = 1 << 5
_TPFLAGS_MAPPING = 1 << 6
_TPFLAGS_MATCH_SELF = 1 << 22    # bool, int, float, str, bytes, tuple, list, dict, set... : X(v) matches v itself


def _subject_type(v):
    try:
        return python_type(v)
    except NotImplementedError:
        raise Unsupported(f"matching {describe(v)} against a pattern is not supported yet") from None


def is_sequence(v):
    """MATCH_SEQUENCE: the subject's type is a sequence for pattern matching."""
    return bool(_subject_type(v).__flags__ & _TPFLAGS_SEQUENCE)


def is_mapping(v):
    """MATCH_MAPPING."""
    return bool(_subject_type(v).__flags__ & _TPFLAGS_MAPPING)


class _Dummy:
    """The default MATCH_KEYS hands to ``get``: no mapping holds it."""

    def __repr__(self):
        return "<match dummy>"


def match_keys(frame, subject, keys):
    """MATCH_KEYS: a tuple value of the values at ``keys``, or None if one is missing."""
    keys = ops.iterate(frame, keys)
    if not keys:
        return TupleValue([])
    seen = []
    getter = attrs.get_attr(frame, subject, "get")
    dummy = ConstantValue(_Dummy())
    values = []
    for key in keys:
        k = as_constant(key) if not isinstance(key, ObjectValue) else key.obj
        if any(k is s or k == s for s in seen):
            raise_new(ValueError, f"mapping pattern checks duplicate key ({k!r})")
        seen.append(k)
        value = ops.call(frame, getter, [key, dummy], {})
        if is_same(value, dummy):
            return ConstantValue(None)
        values.append(value)
    return TupleValue(values)


def match_class(frame, subject, cls_value, count, names):
    """MATCH_CLASS: a tuple value of the sub-patterns' attributes, or None (no match)."""
    cls = cls_value.obj if isinstance(cls_value, ObjectValue) else (
        cls_value.value if isinstance(cls_value, ConstantValue) else None)
    if not isinstance(cls, type):
        raise_new(TypeError, MATCH_CLASS_NOT_A_CLASS)
    matched = ops.call(frame, wrap(frame.tx, isinstance, None), [subject, cls_value], {})
    if not as_constant(matched):
        return ConstantValue(None)
    seen = set()
    found = []
    name = type_name(cls)

    def attribute(attr_name):
        if attr_name in seen:
            raise_new(TypeError, f"{name}() got multiple sub-patterns for attribute {attr_name!r}")
        seen.add(attr_name)
        try:
            return attrs.get_attr(frame, subject, attr_name)
        except MissingAttribute:
            return None
        except TracedRaise as e:
            if issubclass(e.value.cls, AttributeError):
                return None
            raise

    if count:
        try:
            match_args = as_constant(attrs.get_attr(frame, cls_value, "__match_args__"))
        except MissingAttribute:
            match_args = None
        if match_args is None:
            if cls.__flags__ & _TPFLAGS_MATCH_SELF:
                match_args, positional_self = (), True
            else:
                match_args, positional_self = (), False
        else:
            positional_self = False
            if not isinstance(match_args, tuple):
                raise_new(TypeError, f"{name}.__match_args__ must be a tuple (got {type(match_args).__name__})")
        allowed = 1 if positional_self else len(match_args)
        if count > allowed:
            raise_new(TypeError, f"{name}() accepts {allowed} positional sub-pattern"
                                 f"{'' if allowed == 1 else 's'} ({count} given)")
        if positional_self:
            found.append(subject)
        else:
            for attr_name in match_args[:count]:
                if not isinstance(attr_name, str):
                    raise_new(TypeError, f"__match_args__ elements must be strings (got {type(attr_name).__name__})")
                value = attribute(attr_name)
                if value is None:
                    return ConstantValue(None)
                found.append(value)
    for attr_name in names:
        value = attribute(attr_name)
        if value is None:
            return ConstantValue(None)
        found.append(value)
    return TupleValue(found)

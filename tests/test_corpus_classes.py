"""Corpus: user classes and objects — made in the frame, passed in, returned.

Each case is one graph (``fullgraph=True``) compared with eager via
``helpers.check`` (results compared by type and fields). Cases that do not
work yet are strict xfails carrying the current error.
"""
import collections
import collections.abc
import dataclasses
import enum
import functools
import types
import typing

import pytest
import torch
import torch.nn as nn

from helpers import check

X = torch.randn(3, 4)


# ------------------------------------------------------------------ plain classes


class Affine:
    def __init__(self, scale, shift=0.0):
        self.scale = scale
        self.shift = shift

    def __call__(self, v):
        return v * self.scale + self.shift

    def apply_twice(self, v):
        return self(self(v))


def object_made_in_frame(x):
    a = Affine(2.0, 1.0)
    return a(x), a.scale


def method_calling_method(x):
    return Affine(0.5).apply_twice(x)


def attribute_set_after_init(x):
    a = Affine(1.0)
    a.shift = 3.0
    a.extra = x * 2
    return a(x) + a.extra


class Box:
    def __init__(self, value):
        self._value = value

    @property
    def value(self):
        return self._value

    @property
    def doubled(self):
        return self._value * 2

    @classmethod
    def of_ones(cls, like):
        return cls(torch.ones_like(like))

    @staticmethod
    def combine(a, b):
        return a + b


def property_classmethod_staticmethod(x):
    b = Box(x)
    c = Box.of_ones(x)
    return Box.combine(b.value, c.doubled), type(c).__name__


class Base:
    scale = 1.0

    def __init__(self, n):
        self.n = n

    def forward(self, v):
        return v * self.scale + self.n

    def describe(self):
        return "base"


class Child(Base):
    scale = 3.0

    def __init__(self, n, m):
        super().__init__(n)
        self.m = m

    def forward(self, v):
        return super().forward(v) - self.m

    def describe(self):
        return "child/" + super().describe()


class GrandChild(Child):
    def describe(self):
        return "grand/" + super().describe()


def inheritance_and_super(x):
    c = Child(1, 2)
    return c.forward(x), c.describe(), isinstance(c, Base)


def mro_three_levels(x):
    g = GrandChild(0, 1)
    return g.forward(x), g.describe(), [k.__name__ for k in GrandChild.__mro__]


class Left(Base):
    def describe(self):
        return "L>" + super().describe()


class Right(Base):
    def describe(self):
        return "R>" + super().describe()


class Diamond(Left, Right):
    def describe(self):
        return "D>" + super().describe()


def diamond_mro_super(x):
    return x + 1, Diamond(1).describe()


# ------------------------------------------------------------------ dunder protocols


class Registry:
    def __init__(self):
        self.items = {"a": 1.0, "b": 2.0}

    def __getitem__(self, key):
        return self.items[key]

    def __len__(self):
        return len(self.items)

    def __contains__(self, key):
        return key in self.items

    def __iter__(self):
        return iter(self.items)


def dunder_getitem_len_contains(x):
    r = Registry()
    return x * r["b"] + len(r), "a" in r, "z" in r


def dunder_iter(x):
    r = Registry()
    return [x * r[k] for k in r]


class Lazy:
    def __init__(self):
        self.known = 1

    def __getattr__(self, name):
        return name.upper()


def dunder_getattr(x):
    z = Lazy()
    return x + z.known, z.whatever


class Version:
    def __init__(self, major, minor):
        self.major, self.minor = major, minor

    def __eq__(self, other):
        return (self.major, self.minor) == (other.major, other.minor)

    def __lt__(self, other):
        return (self.major, self.minor) < (other.major, other.minor)

    def __hash__(self):
        return hash((self.major, self.minor))


def dunder_eq_lt(x):
    a, b = Version(1, 2), Version(1, 3)
    return x + 1, a == Version(1, 2), a < b, a != b


class Flag:
    def __init__(self, on):
        self.on = on

    def __bool__(self):
        return self.on


def dunder_bool(x):
    return x + 1 if Flag(True) else x - 1


class Sized:
    def __len__(self):
        return 0


def dunder_len_truth(x):
    return x + 1 if not Sized() else x - 1


# ------------------------------------------------------------------ dataclasses


@dataclasses.dataclass
class Config:
    hidden: int = 4
    act: str = "relu"
    dims: list = dataclasses.field(default_factory=lambda: [1, 2])


@dataclasses.dataclass(frozen=True)
class Frozen:
    scale: float
    name: str = "f"


@dataclasses.dataclass
class Output:
    logits: torch.Tensor
    loss: typing.Optional[torch.Tensor] = None


def dataclass_defaults_and_factory(x):
    c = Config(hidden=8)
    return x * c.hidden + len(c.dims), c.act


def dataclass_frozen_and_replace(x):
    f = Frozen(2.0)
    g = dataclasses.replace(f, scale=3.0)
    return x * f.scale + g.scale, g.name


def dataclass_asdict(x):
    return x + 1, dataclasses.asdict(Config())


def dataclass_returned(x):
    return Output(x * 2, (x * 2).sum())


def dataclass_fields_loop(x):
    c = Config()
    return x + 1, [f.name for f in dataclasses.fields(c)]


def dataclass_eq(x):
    return x + 1, Config() == Config(), Frozen(1.0) == Frozen(2.0)


# ------------------------------------------------------------------ NamedTuple, Enum, slots


class Pair(typing.NamedTuple):
    first: torch.Tensor
    second: float = 1.0


def typing_namedtuple(x):
    p = Pair(x)
    q = p._replace(second=3.0)
    return p.first * q.second, q


class Mode(enum.Enum):
    TRAIN = "train"
    EVAL = "eval"


class Level(enum.IntEnum):
    LOW = 1
    HIGH = 2


def enum_members(x):
    m = Mode.EVAL
    out = x * 2 if m is Mode.EVAL else x
    return out, m.value, m.name, Mode("train") is Mode.TRAIN


def int_enum_arithmetic(x):
    return x * Level.HIGH + Level.LOW, Level.HIGH > Level.LOW, int(Level.LOW)


def enum_iteration(x):
    return x + len(Mode), [m.value for m in Mode]


class Slotted:
    __slots__ = ("a", "b")

    def __init__(self, a, b):
        self.a = a
        self.b = b


def slots_object(x):
    s = Slotted(x, 2.0)
    return s.a * s.b


# ------------------------------------------------------------------ objects returned / passed in


class Holder:
    def __init__(self, t, tag):
        self.t = t
        self.tag = tag


def returns_user_object(x):
    return Holder(x + 1, "h")


PRE = Holder(torch.ones(3, 4), "pre")
PRE_CFG = Config(hidden=3)


def reads_preexisting_object(x):
    return x * PRE.t + PRE_CFG.hidden, PRE.tag


def object_passed_in(h, x):
    return h.t + x, h.tag.upper()


def object_method_on_passed_in(a, x):
    return a(x)


# ------------------------------------------------------------------ dict subclasses, mixins, protocols


@dataclasses.dataclass
class Outputs(collections.OrderedDict):
    """Like transformers' ModelOutput: a dataclass that is also an ordered dict of its set fields."""
    logits: torch.Tensor = None
    loss: torch.Tensor = None
    extra: typing.Any = None

    def __post_init__(self):
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if v is not None:
                self[f.name] = v

    def __setitem__(self, key, value):
        super().__setitem__(key, value)
        super().__setattr__(key, value)

    def __setattr__(self, name, value):
        if name in {f.name for f in dataclasses.fields(self)} and value is not None:
            super().__setitem__(name, value)
        super().__setattr__(name, value)

    def to_tuple(self):
        return tuple(self[k] for k in self.keys())


def dict_subclass_dataclass(x):
    out = Outputs(logits=x * 2)
    out.loss = out.logits.sum()
    return out, out.to_tuple()[1], len(out), "loss" in out, list(out.keys())


class ActivationTable(collections.abc.Mapping):
    def __init__(self, table):
        self._table = table

    def __getitem__(self, key):
        return self._table[key]

    def __iter__(self):
        return iter(self._table)

    def __len__(self):
        return len(self._table)


ACTIVATIONS = ActivationTable({"relu": torch.relu, "tanh": torch.tanh})


def mapping_mixin_methods(x):
    act = ACTIVATIONS["tanh"]
    missing = ACTIVATIONS.get("gelu", None)
    return act(x), missing is None, "relu" in ACTIVATIONS, sorted(ACTIVATIONS.keys()), len(ACTIVATIONS)


class Layers(collections.abc.Sequence):
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if i >= self.n:
            raise IndexError("layer index out of range")
        return i * 10


def sequence_mixin_iteration(x):
    total = 0
    for v in Layers(3):         # Sequence.__iter__ stops on IndexError
        total += v
    return x + total, list(reversed(Layers(2))), Layers(4).index(20)


class Vec:
    def __init__(self, t):
        self.t = t

    def __add__(self, other):
        return Vec(self.t + (other.t if isinstance(other, Vec) else other))

    def __radd__(self, other):
        return Vec(self.t + other)

    def __neg__(self):
        return Vec(-self.t)

    def __matmul__(self, other):
        return self.t @ other.t.T


def operator_special_methods(x):
    a = Vec(x)
    b = 1.0 + a + Vec(x * 2)
    return b.t, a @ b, sum([Vec(x), Vec(x)], Vec(x * 0)).t


class Config2:
    def __init__(self):
        self.hidden = 4
        self.names = ["a", "b"]


CFG2 = Config2()


def deepcopy_of_config(x):
    import copy
    c = copy.deepcopy(CFG2)
    c.hidden = c.hidden * 2     # a private copy: CFG2 itself must not change
    return x * c.hidden + CFG2.hidden, len(c.names)


def comp_class_attr(x):
    class C:
        names = ["a", "b"]
    return x + 1, [n.upper() for n in C.names]


# ------------------------------------------------------------------ tables

CASES = [
    object_made_in_frame, method_calling_method, attribute_set_after_init,
    property_classmethod_staticmethod, inheritance_and_super, mro_three_levels, diamond_mro_super,
    dunder_getitem_len_contains, dunder_iter, dunder_getattr, dunder_eq_lt, dunder_bool,
    dunder_len_truth, dataclass_defaults_and_factory, dataclass_frozen_and_replace, dataclass_asdict,
    dataclass_returned, dataclass_fields_loop, dataclass_eq, typing_namedtuple, enum_members,
    int_enum_arithmetic, enum_iteration, slots_object, returns_user_object, reads_preexisting_object,
    dict_subclass_dataclass, mapping_mixin_methods, sequence_mixin_iteration, operator_special_methods,
    deepcopy_of_config, comp_class_attr,
]

# name -> exact current error, for cases that do not work yet.
XFAIL = {
    "comp_class_attr": "Unsupported: opcode LOAD_BUILD_CLASS is not supported yet (a class statement in the frame)",
}


def _param(fn):
    reason = XFAIL.get(fn.__name__)
    if reason is None:
        return fn
    return pytest.param(fn, marks=pytest.mark.xfail(strict=True, reason=reason))


@pytest.mark.parametrize("fn", [_param(f) for f in CASES], ids=lambda f: f.__name__)
def test_corpus_classes(fn):
    check(fn, X)


def test_object_passed_in():
    check(object_passed_in, Holder(torch.randn(3, 4), "arg"), X)


def test_callable_object_passed_in():
    check(object_method_on_passed_in, Affine(3.0, -1.0), X)


def test_deepcopy_guard_sees_changed_state():
    # The copy is made while tracing, guarded on the copied object's state.
    check(deepcopy_of_config, X)
    from helpers import compile_counted
    compiled, cnt = compile_counted(deepcopy_of_config)
    before = compiled(X)[0]
    CFG2.hidden = 5
    try:
        after = compiled(X)[0]
        assert torch.allclose(after, X * 10 + 5)
        assert cnt.frame_count == 2, "a changed state must recompile"
    finally:
        CFG2.hidden = 4
    assert torch.allclose(before, X * 8 + 4)


# ------------------------------------------------------------------ pattern matching (match)
# MATCH_SEQUENCE / MATCH_MAPPING / MATCH_KEYS / MATCH_CLASS as CPython defines them.


class MatchPoint:
    __match_args__ = ("x", "y")

    def __init__(self, x, y):
        self.x = x
        self.y = y


class Labeled:
    def __init__(self, label, value):
        self.label = label
        self.value = value


class MappingConfig(collections.abc.Mapping):
    """A user Mapping: matched through its own get()/__getitem__, unpacked with ** through keys()."""

    def __init__(self, **entries):
        self._entries = dict(entries)

    def __getitem__(self, key):
        return self._entries[key]

    def __iter__(self):
        return iter(self._entries)

    def __len__(self):
        return len(self._entries)


@collections.abc.Sequence.register
class MatchPair:
    """Registered as a Sequence (a type flag), without subclassing: matched by sequence patterns."""

    def __init__(self, a, b):
        self.items = [a, b]

    def __len__(self):
        return 2

    def __getitem__(self, i):
        return self.items[i]


def match_sequences(x):
    out = x
    for v in [(1, 2), [3, 4, 5], (x,), "ab", 7, (), range(2), MatchPair(10, 20)]:
        match v:
            case ():
                out = out + 100
            case (a, b):
                out = out + a * b
            case [first, *rest] if len(rest) > 1:
                out = out * first + len(rest)
            case [torch.Tensor() as t]:
                out = out - t
            case _:
                out = out - 1
    return out


def match_star_middle(x):
    match [1, 2, 3, 4, x]:
        case [1, *middle, t]:
            return t * len(middle) + sum(middle)
    return x


def match_mappings(x):
    out = []
    for d in [{"op": "add", "v": 2}, {"op": "mul", "v": 3, "extra": 1}, {"op": "neg"}, {"v": 1}, [1]]:
        match d:
            case {"op": "add", "v": v}:
                out.append(x + v)
            case {"op": "mul", "v": v, **rest}:
                out.append(x * v + len(rest))
            case {"op": op}:
                out.append(-x if op == "neg" else x)
            case {}:
                out.append(x * 0)
            case _:
                out.append(x + 1000)
    return out


def match_user_mapping_and_defaultdict(x):
    cfg = MappingConfig(mode="scale", factor=3)
    dd = collections.defaultdict(int, {"a": 1})
    match cfg:
        case {"mode": "scale", "factor": f}:
            y = x * f
        case _:
            y = x
    match dd:
        case {"missing": _}:
            y = y + 100
        case {"a": a}:
            y = y + a
    return y, len(dd)   # MATCH_KEYS uses get(): the defaultdict gets no new key


def match_classes(x):
    out = []
    for v in [MatchPoint(1, 2), MatchPoint(x, 0), Labeled("w", x), 3, 2.5, "s", x, None, [1]]:
        match v:
            case MatchPoint(torch.Tensor() as t, 0):
                out.append(t * 2)
            case MatchPoint(x=1, y=y):
                out.append(y)
            case Labeled(label="w", value=val):
                out.append(val + 1)
            case int(n) | float(n):
                out.append(n * 10)
            case str() as s:
                out.append(s.upper())
            case torch.Tensor(shape=(3, _)):
                out.append(v.sum())
            case None:
                out.append("none")
            case _:
                out.append("other")
    return out


def match_class_errors(x):
    msgs = []
    for pattern in range(3):
        try:
            match MatchPoint(1, 2):
                case MatchPoint(1, 2, 3) if pattern == 0:
                    pass
                case MatchPoint(1, x=2) if pattern == 1:
                    pass
                case Labeled(1) if pattern == 2:
                    pass
        except TypeError as e:
            msgs.append(str(e))
    return x + len(msgs), msgs


def match_on_shape_and_dtype(x):
    match x.shape, x.dtype:
        case (3, n), torch.float32:
            return x * n
        case (_, _), _:
            return x
    return -x


def match_value_patterns(x, mode):
    match mode:
        case "relu":
            return torch.relu(x)
        case "tanh" | "sigmoid":
            return torch.tanh(x)
    return x


def test_match_sequences():
    check(match_sequences, X)


def test_match_star_in_the_middle():
    check(match_star_middle, X)


def test_match_mappings():
    check(match_mappings, X)


def test_match_user_mapping_and_defaultdict():
    check(match_user_mapping_and_defaultdict, X)


def test_match_classes():
    check(match_classes, torch.randn(3, 4))


def test_match_class_errors_are_cpythons():
    check(match_class_errors, X)


def test_match_on_shape_and_dtype():
    check(match_on_shape_and_dtype, torch.randn(3, 5))


def test_match_value_patterns_guarded():
    _, out = check(match_value_patterns, X, "tanh")
    check(match_value_patterns, X, "relu")


# ------------------------------------------------------------------ properties, text, class dicts, super


class Temperature:
    def __init__(self, celsius):
        self._c = celsius

    @property
    def celsius(self):
        return self._c

    @celsius.setter
    def celsius(self, value):
        self._c = value

    @celsius.deleter
    def celsius(self):
        self._c = None

    @property
    def kelvin(self):
        return self._c + 273.15

    @kelvin.setter
    def kelvin(self, value):
        self.celsius = value - 273.15


def property_setter_and_deleter(x):
    t = Temperature(x)
    t.kelvin = x + 300.0
    a = t.celsius
    del t.celsius
    return a, t._c


TEMP = Temperature(1.0)


def property_setter_on_existing_object(x):
    TEMP.celsius = 5.0
    return x * TEMP.kelvin


def test_property_setter_and_deleter():
    check(property_setter_and_deleter, X)


def test_property_setter_on_existing_object():
    def make():
        TEMP._c = 1.0
        return (X.clone(),), {}, lambda: TEMP._c
    from helpers import check_program
    check_program(property_setter_on_existing_object, make)


class Shown:
    def __init__(self, n):
        self.n = n

    def __str__(self):
        return f"Shown<{self.n}>"

    def __repr__(self):
        return f"Shown({self.n!r})"

    def __format__(self, spec):
        return f"S{self.n:{spec}}"


class ReprOnly:
    def __init__(self, n):
        self.n = n

    def __repr__(self):
        return "ReprOnly" + str(self.n)


def str_repr_format_of_user_objects(x):
    s, r = Shown(3), ReprOnly(4)
    texts = (str(s), repr(s), f"{s}", f"{s!r}", format(s, "03d"), f"{s:>4}", str([s, r]), f"{r}",
             str(r), ascii(r), repr((r,)), f"{r!s:>12}", str({"a": r}))
    return x + len(texts), texts


def format_spec_on_plain_object_raises(x):
    try:
        f"{ReprOnly(1):>5}"
    except TypeError as e:
        return x, str(e)
    return -x, ""


def test_str_repr_format_of_user_objects():
    check(str_repr_format_of_user_objects, X)


def test_format_spec_on_plain_object_raises():
    check(format_spec_on_plain_object_raises, X, graphs=0, fullgraph=True)


def class_dict_lookups(x):
    t = Temperature(x)
    prop = type(t).__dict__["kelvin"]
    names = sorted(k for k in Temperature.__dict__ if not k.startswith("__"))
    return prop.fget(t), "celsius" in type(t).__dict__, "missing" in vars(Temperature), names, \
        Temperature.__dict__.get("nope", 7)


def test_class_dict_lookups():
    check(class_dict_lookups, X)


class Scaled:
    base = 2

    @classmethod
    def factor(cls):
        return cls.base

    @classmethod
    def make(cls, x):
        return x * cls.factor()

    @staticmethod
    def shift(x):
        return x + 1


class MoreScaled(Scaled):
    base = 3

    @classmethod
    def factor(cls):
        return super().factor() + 10

    @classmethod
    def make(cls, x):
        return super().make(x) + super().shift(x)


def super_in_classmethods(x):
    return MoreScaled.make(x), Scaled.make(x)


def test_super_in_classmethods():
    check(super_in_classmethods, X)


class StaticForward(nn.Module):
    @staticmethod
    def forward(x):
        return x * 2


class StaticForwardChild(StaticForward):
    def forward(self, x):
        return super().forward(x) + 1


class StaticForwardGrandchild(StaticForwardChild):
    @staticmethod
    def forward(x):
        return StaticForward.forward(x) - 3


STATIC_MODULES = [StaticForward(), StaticForwardChild(), StaticForwardGrandchild()]


def staticmethod_forward_modules(x):
    return [m(x) for m in STATIC_MODULES]


def test_staticmethod_forward_modules():
    check(staticmethod_forward_modules, X)
    for m in STATIC_MODULES:
        from helpers import compile_counted
        compiled, _ = compile_counted(m, fullgraph=True)
        assert torch.allclose(compiled(X), m(X))


# ------------------------------------------------------------------ ** of mappings, partials, function attributes


def keywords(a, b=1, c=2, **rest):
    return a * b + c + len(rest)


def double_star_user_mapping(x):
    cfg = MappingConfig(b=2, c=3, extra=1)
    merged = {**cfg, "c": 5}
    return keywords(x, **cfg), keywords(x, **MappingConfig(b=4)), merged


def partial_attributes(x):
    p = functools.partial(keywords, b=3)
    q = functools.partial(p, c=4)
    r = functools.partial(q, x)
    return r(), q.func is keywords, q.args, q.keywords, p.keywords, r.args[0] is x


BASE_PARTIAL = functools.partial(keywords, c=10)


def partial_of_existing_partial(x):
    p = functools.partial(BASE_PARTIAL, b=2)
    return p(x), p.func is keywords, p.keywords


def wraps_decorator_in_frame(x):
    def deco(f):
        @functools.wraps(f)
        def wrapper(*args, **kwargs):
            return f(*args, **kwargs) + 1
        wrapper.calls = 0
        return wrapper

    @deco
    def inner(v):
        "Doubles."
        return v * 2

    return inner(x), inner.__name__, inner.__doc__, inner.__qualname__, inner.__wrapped__(x), inner.calls


def decorator_factory_sets_names(x):
    def named(name):
        def deco(f):
            def wrapper(v):
                return f(v) * 3
            wrapper.__name__ = name
            wrapper.__qualname__ = "made." + name
            wrapper.__doc__ = f"runs {f.__name__}"
            wrapper.__module__ = "somewhere"
            return wrapper
        return deco

    @named("tripled")
    def base(v):
        return v + 1

    return base(x), base.__name__, base.__qualname__, base.__doc__, base.__module__, base


def test_double_star_user_mapping():
    check(double_star_user_mapping, X)


def test_partial_attributes():
    check(partial_attributes, X)


def test_partial_of_existing_partial():
    check(partial_of_existing_partial, X)
    # Tracing it did not make BASE_PARTIAL's __dict__, which stops CPython flattening it.
    assert functools.partial(BASE_PARTIAL, b=2).func is keywords


def test_wraps_decorator_in_frame():
    check(wraps_decorator_in_frame, X)


def test_decorator_factory_sets_names():
    from helpers import compile_counted
    expected = decorator_factory_sets_names(X)
    compiled, cnt = compile_counted(decorator_factory_sets_names, fullgraph=True)
    got = compiled(X)
    assert torch.allclose(got[0], expected[0]) and got[1:5] == expected[1:5]
    fn = got[5]   # the function made in the frame, rebuilt with its names
    assert (fn.__name__, fn.__qualname__, fn.__doc__, fn.__module__) == expected[1:5]
    assert torch.allclose(fn(X), expected[5](X))
    assert cnt.frame_count == 1


# ------------------------------------------------------------------ disabled callees: graph counts


def _wrapping(f):
    @functools.wraps(f)
    def wrapper(*args, **kwargs):
        return f(*args, **kwargs)
    return wrapper


def _calls(callee):
    @_wrapping
    def caller(x):
        a = x + 1
        b = callee(a)
        return b + 1
    return caller


class _WithDisabledMethod(nn.Module):
    def __init__(self, disable):
        super().__init__()
        self.helper = types.MethodType(disable(lambda self, x: x * 2), self)

    def forward(self, x):
        return self.helper(x + 1) + 1


def test_disabled_callee_in_a_decorated_function_matches_torch_compile():
    import bytegraph
    from helpers import torch_compile_graphs
    for wrap in (lambda f: f, _wrapping):
        ours = _calls(wrap(bytegraph.disable(lambda v: v * 2)))
        theirs = _calls(wrap(torch.compiler.disable(lambda v: v * 2)))
        reference = torch_compile_graphs(theirs, (X,))
        cnt, _ = check(ours, X, graphs=reference)
        assert cnt.frame_count == reference == 2
    # A disabled method, called on its object at the break.
    check(_WithDisabledMethod(bytegraph.disable), X, graphs=torch_compile_graphs(
        _WithDisabledMethod(torch.compiler.disable), (X,)))


class WithScaleProperty(nn.Module):
    def __init__(self):
        super().__init__()
        self._scale = 1.0

    @property
    def scale(self):
        return self._scale

    @scale.setter
    def scale(self, value):
        self._scale = value

    def forward(self, x):
        self.scale = self.scale + 1.0
        return x * self.scale


def test_property_setter_on_a_module():
    from helpers import check_program
    m = WithScaleProperty()

    def make():
        m._scale = 1.0
        return (X.clone(),), {}, lambda: m._scale
    check_program(lambda x: m(x), make)

"""Tensor subclasses that define torch's names in Python (a ``device`` property, an ``add``
method, ``__add__``, ``__getitem__``, ``__iter__``...): Python finds the class's own first, so the
compiled function must run it too, with and without a ``__torch_function__`` of the class's own.
Each case compiles one operation and compares it with eager (values, class, exception type)."""
import pytest
import torch

import bytegraph

T = torch.Tensor


def _tf(cls, func, types, args=(), kwargs=None):
    return T.__torch_function__.__func__(cls, func, types, args, kwargs or {})


# name -> (the class's own definition, the operations that reach it)
OVERRIDES = {
    "__add__": (lambda self, o: T.__add__(self, o) * 10, ["a+1", "a+=1", "a+b"]),
    "__radd__": (lambda self, o: T.__radd__(self, o) * 20, ["1+a", "b+a"]),
    "__iadd__": (lambda self, o: T.__iadd__(self, o * 3), ["a+=1", "a+1"]),
    "__sub__": (lambda self, o: T.__sub__(self, o) * 10, ["a-1", "1-a"]),
    "__mul__": (lambda self, o: T.__mul__(self, o) + 100, ["a*2", "2*a"]),
    "__neg__": (lambda self: T.__neg__(self) * 7, ["-a"]),
    "__abs__": (lambda self: T.__abs__(self) + 5, ["abs"]),
    "__getitem__": (lambda self, i: T.__getitem__(self, i) * 2, ["a[0]", "list", "Tensor.__getitem__"]),
    "__setitem__": (lambda self, i, v: T.__setitem__(self, i, v * 4), ["a[0]=5", "a.__setitem__"]),
    "__eq__": (lambda self, o: T.__eq__(self, o).logical_not(), ["a==a", "a!=a"]),
    "__lt__": (lambda self, o: T.__ge__(self, o), ["a<1", "1>a"]),
    "__len__": (lambda self: 42, ["len"]),
    "__iter__": (lambda self: iter([self.sum(), self.sum()]), ["list", "unpack"]),
    "__contains__": (lambda self, v: True, ["in"]),
    "add": (lambda self, o: T.add(self, o) * 10, ["add", "a+1"]),
    "sin": (lambda self: T.cos(self), ["sin", "torch.sin"]),
    "size": (lambda self, *d: (7,), ["size", "size0", "shape"]),
    "dim": (lambda self: 9, ["dim", "list"]),
    "view": (lambda self, *s: T.view(self, *s) * 3, ["view"]),
    "numel": (lambda self: 11, ["numel"]),
    "unbind": (lambda self, d=0: tuple(t * 2 for t in T.unbind(self, d)), ["list"]),
    "device": (property(lambda self: torch.device("meta")), ["device"]),
    "shape": (property(lambda self: (5, 5)), ["shape", "size"]),
    "T": (property(lambda self: T.clone(self) * 6), ["T"]),
    "dtype": (property(lambda self: torch.int8), ["dtype"]),
    "scale": (3.0, ["scale"]),
    "twice": (property(lambda self: self * 2), ["twice"]),
    "mine": (lambda self, k: self + k, ["mine"]),
}


def _iadd(a):
    b = a.clone()
    b += 1
    return b


def _setitem(a):
    b = a.clone()
    b[0] = 5
    return b


def _dunder_setitem(a):
    b = a.clone()
    b.__setitem__(1, 7)
    return b


def _unpack(a):
    p, q = a
    return p - q


OPS = {
    "a+1": lambda a: a + 1, "1+a": lambda a: 1 + a, "a+=1": _iadd, "a-1": lambda a: a - 1, "1-a": lambda a: 1 - a,
    "a+b": lambda a: a + torch.ones(2), "b+a": lambda a: torch.ones(2) + a,
    "a*2": lambda a: a * 2, "2*a": lambda a: 2 * a, "-a": lambda a: -a, "abs": lambda a: abs(a),
    "a[0]": lambda a: a[0], "Tensor.__getitem__": lambda a: T.__getitem__(a, 1), "a[0]=5": _setitem,
    "a.__setitem__": _dunder_setitem, "a==a": lambda a: a == a, "a!=a": lambda a: a != a,
    "a<1": lambda a: a < 1.5, "1>a": lambda a: 1.5 > a, "len": lambda a: len(a), "list": lambda a: list(a),
    "unpack": _unpack, "in": lambda a: 3 in a, "add": lambda a: a.add(1), "sin": lambda a: a.sin(),
    "torch.sin": lambda a: torch.sin(a) + a, "size": lambda a: a.size(), "size0": lambda a: a.size(0),
    "dim": lambda a: a.dim(), "view": lambda a: a.view(-1), "numel": lambda a: a.numel(),
    "device": lambda a: a.device.type, "shape": lambda a: a.shape, "T": lambda a: a.T, "dtype": lambda a: a.dtype,
    "scale": lambda a: a * a.scale, "twice": lambda a: a.twice, "mine": lambda a: a.mine(2),
}

CASES = [(name, op, own_tf) for name, (_, ops) in OVERRIDES.items() for op in ops for own_tf in (False, True)]


def _make_class(name, own_tf):
    ns = {name: OVERRIDES[name][0]}
    if own_tf:
        ns["__torch_function__"] = classmethod(_tf)
    return type(f"Own_{name.strip('_')}", (torch.Tensor,), ns)


def _outcome(fn, x):
    try:
        return "value", fn(x)
    except Exception as e:  # noqa: BLE001 - the type is what is compared
        return "raised", type(e)


def _same(x, y):
    if isinstance(x, torch.Tensor) or isinstance(y, torch.Tensor):
        return type(x) is type(y) and x.shape == y.shape and x.dtype == y.dtype \
            and torch.equal(x.as_subclass(torch.Tensor), y.as_subclass(torch.Tensor))
    if isinstance(x, (list, tuple)):
        return type(x) is type(y) and len(x) == len(y) and all(_same(p, q) for p, q in zip(x, y))
    return type(x) is type(y) and x == y


@pytest.mark.parametrize("name,op,own_tf", CASES, ids=[f"{n}-{o}-{'tf' if t else 'plain'}" for n, o, t in CASES])
def test_class_defined_name_runs_as_in_eager(name, op, own_tf):
    cls = _make_class(name, own_tf)
    fn = OPS[op]
    compiled = bytegraph.compile(fn, backend="eager")
    for values in ([1.0, 2.0], [4.0, -3.0]):       # a second call runs the compiled code again
        x = torch.tensor(values).as_subclass(cls)
        expected, got = _outcome(fn, x), _outcome(compiled, x)
        assert expected[0] == got[0], (expected, got)
        assert _same(expected[1], got[1]) if expected[0] == "value" else expected[1] is got[1], (expected, got)


@pytest.mark.parametrize("name,op", [("__add__", "a+1"), ("add", "add"), ("__getitem__", "a[0]"),
                                     ("device", "device"), ("mine", "mine"), ("__setitem__", "a[0]=5")])
def test_class_defined_names_are_traced_in_one_graph(name, op):
    cls = _make_class(name, False)
    fn = OPS[op]
    x = torch.tensor([1.0, 2.0]).as_subclass(cls)
    out = bytegraph.compile(fn, backend="eager", fullgraph=True)(x)
    assert _same(out, fn(x))


def test_a_property_changed_after_compiling_is_read_again():
    class Flip(torch.Tensor):
        meta = False

        @property
        def device(self):
            return torch.device("meta") if Flip.meta else super().device

    compiled = bytegraph.compile(lambda a: a.device.type, backend="eager")
    x = torch.ones(2).as_subclass(Flip)
    assert compiled(x) == "cpu"
    Flip.meta = True
    assert compiled(x) == "meta"


def test_graph_ops_on_an_input_of_such_a_class_are_torchs():
    # The graph reads `add` off its input: the class's own `add` must not run there.
    class OwnAdd(torch.Tensor):
        def add(self, other):
            return T.add(self, other) * 10

    fn = lambda a: (a + 2, torch.add(a, 1), a.sub(1))   # noqa: E731
    x = torch.ones(3).as_subclass(OwnAdd)
    for got, want in zip(bytegraph.compile(fn, backend="eager")(x), fn(x)):
        assert _same(got, want)


def test_explicit_dunder_store_on_a_plain_tensor():
    x = torch.tensor([1.0, 2.0, 3.0])
    assert torch.equal(bytegraph.compile(_dunder_setitem, backend="eager")(x), _dunder_setitem(x))


def test_iterating_under_a_mode_hands_it_what_tensor_iter_asks():
    # Tensor.__iter__ asks dim() and then unbind(0): a mode sees those calls, not subscripts.
    from torch.overrides import TorchFunctionMode

    class Record(TorchFunctionMode):
        def __init__(self):
            super().__init__()
            self.seen = []

        def __torch_function__(self, func, types, args=(), kwargs=None):
            self.seen.append(getattr(func, "__name__", repr(func)))
            return func(*args, **(kwargs or {}))

    def fn(x):
        with mode:
            return [row * 2 for row in x]

    x = torch.randn(3, 2)
    mode = Record()
    expected = fn(x)
    expected_seen = mode.seen
    mode = Record()
    got = bytegraph.compile(fn, backend="eager")(x)
    assert mode.seen == expected_seen == ["dim", "unbind", "mul", "mul", "mul"]
    assert all(torch.equal(a, b) for a, b in zip(got, expected)) and len(got) == len(expected)

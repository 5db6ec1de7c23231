"""Python's attribute lookup rules, and the protocol builtins that ask them, compiled vs eager.

The programs of issue 34 and the smallest reproducers of what the lookup generator
(tests/generated_lookup.py) found: each gave a different result compiled than eager, with
no error and no graph break, before ``trace/python/lookup.py`` answered lookups in Python's order.
"""
import functools
import itertools

import pytest
import torch
import torch.nn as nn

import bytegraph
from helpers import check, compile_counted, run_observed, assert_same_run

import generated_lookup


def _agree_over_two_calls(f, make):
    """Eager's run of ``f`` on ``make()``'s inputs, and the counter of a compiled ``f`` whose two
    calls on fresh inputs from ``make()`` observed the same."""
    expected = run_observed(f, make)
    compiled, cnt = compile_counted(f)
    for i in range(2):
        assert_same_run(expected, run_observed(compiled, make), f"(call {i + 1})")
    return expected, cnt


@pytest.fixture(autouse=True)
def internal_errors_raise():
    with bytegraph.config.patch(suppress_errors=False):
        yield


class Scaler:
    def __init__(self, k):
        self.k = k

    def __call__(self, x):
        return x * self.k


def test_callable_of_an_object_made_in_the_function():
    def f(x):
        s = Scaler(3)
        return s(x), callable(s), callable(Scaler), callable(s.k)

    check(f, torch.randn(2))


def test_callable_answers_from_the_type():
    class Plain:
        pass

    class Later:
        pass

    def f(x):
        p, q = Plain(), Later()
        return x + 1, callable(p), callable(q), callable(x), callable(x.add), callable(f)

    check(f, torch.randn(2))


class _Base(nn.Module):
    def linear(self, x):
        return x * 3.0


class _Shadowing(_Base):
    def __init__(self):
        super().__init__()
        self.activation = nn.ReLU()          # lands in _modules
        self.linear = nn.Linear(10, 10)      # lands in _modules
        self.scale = 0.5                     # lands in __dict__

    def activation(self, x):
        return x * 1.2

    def forward(self, x):
        return self.activation(self.linear(x)) * self.scale


def test_class_methods_answer_before_submodules_of_the_same_name():
    # Python finds the class's methods before nn.Module.__getattr__ looks in _modules, so the
    # Linear and the ReLU are never called (and the output needs no grad).
    m = _Shadowing()
    x = torch.randn(3, 10)
    expected = m(x)
    compiled, cnt = compile_counted(m, fullgraph=True)
    for _ in range(2):
        x = torch.randn(3, 10)
        expected = m(x)
        actual = compiled(x)
        assert torch.allclose(expected, actual)
        assert actual.requires_grad == expected.requires_grad is False
    assert cnt.frame_count == 1


def test_class_attribute_none_shadows_a_submodule_and_a_property_shadows_a_buffer():
    class Base(nn.Module):
        proj = None                        # a class attribute: answers before _modules

        @property
        def stats(self):                   # a property: answers before _buffers
            return 2.0

    class M(Base):
        def __init__(self):
            super().__init__()
            self._modules["proj"] = nn.Linear(4, 4)
            self._buffers["stats"] = torch.ones(4)

        def forward(self, x):
            y = x if self.proj is None else self.proj(x)
            return y * self.stats

    m = M()
    check(m, torch.randn(2, 4))


def test_a_property_raising_attribute_error_hands_over_to_getattr():
    class Cfg:
        @property
        def size(self):
            raise AttributeError("not set")

        def __getattr__(self, name):
            return 7

    def f(x, cfg):
        return x * cfg.size

    check(f, torch.randn(2), Cfg())


class _DataDesc:
    def __set_name__(self, owner, name):
        self.private = "_" + name

    def __get__(self, obj, objtype=None):
        if obj is None:
            return self
        return obj.__dict__.get(self.private, 1)

    def __set__(self, obj, value):
        obj.__dict__[self.private] = value * 2


class _NonDataDesc:
    def __get__(self, obj, objtype=None):
        return 5 if obj is not None else self


def test_descriptors_written_in_python():
    class C:
        d = _DataDesc()
        n = _NonDataDesc()
        cached = functools.cached_property(lambda self: 40)

        def __init__(self):
            self.__dict__["d"] = 100   # hidden by the data descriptor
            self.n = 9                 # hides the non-data descriptor

    def f(x, outer):
        c = C()
        c.d = 3
        return x * (c.d + c.n + c.cached + outer.d + outer.n), c.__dict__.get("_d"), sorted(c.__dict__)

    check(f, torch.randn(2), C())


def test_a_class_attribute_changed_between_calls_is_seen_by_objects_made_in_the_function():
    class C:
        scale = 2

    def f(x):
        return x * C().scale

    compiled, cnt = compile_counted(f)
    x = torch.randn(3)
    assert torch.allclose(compiled(x), x * 2)
    C.scale = 5
    assert torch.allclose(compiled(x), x * 5)
    assert cnt.frame_count == 2   # recompiled for the new class attribute


def test_methods_bound_on_every_read_of_a_class_do_not_recompile():
    # type(obj).make and itertools.chain.from_iterable are new bound objects on each read:
    # the class entry they come from is what a guard can hold to.
    class Box:
        base = 1.0

        @classmethod
        def make(cls, v):
            return v + cls.base

    def f(x, b):
        return type(b).make(x), list(itertools.chain.from_iterable([[1], [2, 3]]))

    check(f, torch.randn(3), Box())
    compiled, cnt = compile_counted(f)
    x = torch.randn(3)
    compiled(x, Box())
    Box.make = classmethod(lambda cls, v: v * 2)
    assert torch.equal(compiled(x, Box())[0], x * 2)
    assert cnt.frame_count == 2


def test_tensor_attributes_the_fake_tensor_cannot_answer_break():
    # x[0]._base is x: the fake tensor's _base is a fake (answered False); _cdata is an address.
    def f(x):
        v = x[0] * 1
        w = x[0]
        return v + 1, w._base is x, x.is_xpu, v * 2

    check(f, torch.randn(3, 2), graphs=2)


def test_an_attribute_deleted_then_found_through_getattr():
    class C:
        def __getattr__(self, name):
            return ("fallback", name)

    def f(x, c):
        del c.g
        return x + 1, c.g, hasattr(c, "g")

    def make():
        c = C()
        c.g = 1
        return (torch.arange(2.0), c), {}, lambda: sorted(vars(c))

    expected, cnt = _agree_over_two_calls(f, make)
    assert cnt.frame_count == 2


def test_setattr_hook_runs_once():
    class Tripling:
        def __setattr__(self, name, value):
            super().__setattr__(name, value * 3)

    def f(x, obj):
        obj.n = 2
        return x * obj.n

    def make():
        obj = Tripling()
        return (torch.arange(2.0), obj), {}, lambda: vars(obj)

    expected, cnt = _agree_over_two_calls(f, make)
    assert cnt.frame_count == 1


def test_instancecheck_of_a_metaclass_looks_at_the_object():
    class Meta(type):
        def __instancecheck__(cls, inst):
            return hasattr(inst, "tag")

    class Tagged(metaclass=Meta):
        pass

    class Other:
        tag = 1

    def f(x, a, b):
        return x + 1, isinstance(a, Tagged), isinstance(b, Tagged), isinstance(Other(), Tagged)

    check(f, torch.randn(2), Tagged(), Other())


def test_slots_only_objects_refuse_other_names():
    class Slotted:
        __slots__ = ("a",)
        b = 4

        def __init__(self):
            self.a = 1

    def f(x):
        s = Slotted()
        out = []
        for name in ("a", "b", "c"):
            try:
                setattr(s, name, 5)
                out.append(getattr(s, name))
            except AttributeError as e:
                out.append(str(e))
        return x + 1, out

    check(f, torch.randn(2))


def test_a_deleted_attribute_stored_again_moves_to_the_end():
    class Obj:
        pass

    def f(x, o):
        del o.a
        o.a = 3
        return x + o.a

    def make():
        o = Obj()
        o.a, o.b = 1, 2
        return (torch.arange(2.0), o), {}, lambda: list(vars(o).items())

    expected, cnt = _agree_over_two_calls(f, make)
    assert cnt.frame_count == 1


def test_an_attribute_deleted_between_calls_is_not_read_back():
    class Obj:
        pass

    def f(x, o):
        return x + 1, getattr(o, "v", "missing")

    o = Obj()
    o.v = 5
    compiled, cnt = compile_counted(f)
    assert compiled(torch.ones(1), o)[1] == 5
    del o.v
    assert compiled(torch.ones(1), o)[1] == "missing"
    assert cnt.frame_count == 2   # recompiled: the attribute is gone


class _Doubler:
    def val(self, t):
        return t * 2


class _SuperAfterBreak(_Doubler):
    def val(self, t):
        u = t + 1
        print("a graph break")       # the rest runs in code copied from this method
        w = super().val(u * 3)       # zero-argument super() there: its arguments made explicit
        return w + len(str(super()))


def test_zero_argument_super_after_a_graph_break():
    # CPython finds super()'s arguments in the running frame (its first local); code copied
    # from the middle of a method took other parameters first ('super' object has no attribute).
    def f(x, obj):
        return obj.val(x)

    def make():
        return (torch.arange(3.0), _SuperAfterBreak()), {}, None

    expected, cnt = _agree_over_two_calls(f, make)
    assert cnt.frame_count == 2   # before the print, and after it
    with bytegraph.config.patch(cache_size_limit=1):
        bytegraph.reset()
        compiled, cnt = compile_counted(f)
        for i in range(3):   # the copied code also runs natively, once its cache is full
            assert_same_run(expected, run_observed(compiled, make), f"(call {i + 1}, native)")
        assert cnt.frame_count == 2   # one entry each for the frame and the code after the break


@pytest.mark.parametrize("seed", range(int(__import__("os").environ.get("BYTEGRAPH_LOOKUP_SEEDS", 60))))
def test_generated_lookup_programs(seed):
    cnt = generated_lookup.run_seed(seed)
    if cnt.frame_count == 0:
        # Nothing compiled: right only where torch.compile compiles nothing either.
        assert generated_lookup.torch_compile_graphs(seed) == 0, f"lookup program {seed}: no graph compiled"


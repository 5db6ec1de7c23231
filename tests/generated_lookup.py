"""Generated programs about Python's attribute lookup rules, compiled vs eager.

The family of issue 34: the tracer must answer ``obj.name`` as Python does. A seeded
generator (``random.Random(seed)``) writes a module with

* two plain classes ``A`` and ``B(A)`` whose members share a small pool of names and take
  random kinds: methods, properties (with and without setters), a data descriptor and a
  non-data descriptor written in Python, ``functools.cached_property``, class attributes,
  class and static methods, ``__slots__``, ``__getattr__``, ``__getattribute__`` and
  ``__setattr__`` overrides, ``__call__``/``__len__``/``__bool__``/``__iter__``/
  ``__contains__``, a metaclass with attributes and ``__instancecheck__``, an ABC with
  ``__subclasshook__``; instances set the same names in ``__init__`` (plainly, through
  ``object.__setattr__`` or straight into ``__dict__``);
* ``nn.Module`` subclasses ``Base`` and ``M(Base)`` whose methods, properties and class
  attributes share names with the parameters, buffers, submodules and plain attributes
  ``M.__init__`` registers;
* a function ``f(x, obj, m)`` that reads, stores and deletes those names on ``obj`` (made
  outside), on an object it makes itself and on classes, asks the protocol builtins
  (``callable``, ``hasattr``, ``getattr`` with a default, ``len``, ``bool``, ``iter``, ``in``,
  ``isinstance``, ``issubclass``) and calls ``m``, whose ``forward`` does the same on ``self``;
  tensors computed from what it read go into the result.

Ground truth is eager on a second copy of the module namespace. The compiled function
(``backend="eager"``, ``suppress_errors=False``: an internal error is a failure) must agree
on the result (tensor values and ``requires_grad``), the exception that escapes, printed
output and the state of every object afterwards, over three calls with fresh tensor values,
with a change to the objects or classes between calls (so guards are tested too).
"""
import contextlib
import io
import random
import sys
import types

import torch

import bytegraph
from bytegraph.testing import CompileCounter, same

NAMES = ["a", "b", "scale", "fn", "gx"]      # "gx" is what __getattr__ answers
MODULE_NAMES = ["linear", "act", "scale", "w", "buf"]

CLASS_KINDS = ["none", "none", "method", "property", "property_set", "data_desc", "nondata_desc",
               "cached", "class_int", "class_str", "classmethod", "staticmethod"]
INSTANCE_KINDS = ["none", "none", "int", "str", "tensor", "func", "setattr_bypass", "dict_write"]

PRELUDE = '''\
import abc
import functools
import itertools
import types
import torch
import torch.nn as nn


class DataDesc:
    """A data descriptor written in Python: stores doubled values under a private name."""
    def __init__(self, default):
        self.default = default

    def __set_name__(self, owner, name):
        self.private = "_dd_" + name

    def __get__(self, obj, objtype=None):
        if obj is None:
            return self
        return obj.__dict__.get(self.private, self.default)

    def __set__(self, obj, value):
        obj.__dict__[self.private] = value * 2


class NonDataDesc:
    """A non-data descriptor: an instance attribute of the same name hides it."""
    def __set_name__(self, owner, name):
        self.name = name

    def __get__(self, obj, objtype=None):
        if obj is None:
            return self
        return ("nd", self.name, type(obj).__name__)


class Meta(type):
    tag = "meta"

    def __instancecheck__(cls, inst):
        return hasattr(inst, "gx") or getattr(inst, "s1", 0) == 1


class HasLen(abc.ABC):
    @classmethod
    def __subclasshook__(cls, C):
        if any("__len__" in k.__dict__ for k in C.__mro__):
            return True
        return NotImplemented


class Sub(nn.Module):
    def __init__(self, k):
        super().__init__()
        self.k = k

    def forward(self, y):
        return y * self.k


def use(v, y):
    """What forward does with whatever a lookup answered."""
    if isinstance(v, torch.Tensor):
        return y + v.sum()
    if callable(v):
        r = v(y)
        return r if isinstance(r, torch.Tensor) else y
    if isinstance(v, bool):
        return y + 1 if v else y
    if isinstance(v, (int, float)):
        return y * v
    return y


def num(v):
    """A number for tensor arithmetic from whatever a lookup answered."""
    if isinstance(v, bool):
        return 2 if v else 3
    if isinstance(v, (int, float)):
        return v
    if isinstance(v, str):
        return len(v)
    if isinstance(v, tuple):
        return len(v)
    return 1
'''


class _Gen:
    def __init__(self, seed):
        self.r = random.Random(seed)
        self.lines = []

    def emit(self, text, indent=0):
        for line in text.splitlines():
            self.lines.append("    " * indent + line if line.strip() else "")

    # ---- plain classes

    def class_member(self, cls, name, kind, k):
        e = lambda t: self.emit(t, 1)   # noqa: E731
        if kind == "method":
            e(f"def {name}(self):\n    return ('m', '{cls}', '{name}', {k})")
        elif kind == "property":
            e(f"@property\ndef {name}(self):\n    return ('p', '{cls}', {k})")
        elif kind == "property_set":
            e(f"@property\ndef {name}(self):\n    return self.__dict__.get('_ps_{name}', {k})")
            e(f"@{name}.setter\ndef {name}(self, value):\n    self.__dict__['_ps_{name}'] = value + 100")
        elif kind == "data_desc":
            e(f"{name} = DataDesc({k})")
        elif kind == "nondata_desc":
            e(f"{name} = NonDataDesc()")
        elif kind == "cached":
            e(f"@functools.cached_property\ndef {name}(self):\n    return {k} * 10")
        elif kind == "class_int":
            e(f"{name} = {k}")
        elif kind == "class_str":
            e(f"{name} = 'c{cls}{k}'")
        elif kind == "classmethod":
            e(f"@classmethod\ndef {name}(cls):\n    return ('cm', cls.__name__, {k})")
        elif kind == "staticmethod":
            e(f"@staticmethod\ndef {name}():\n    return ('sm', {k})")

    def instance_store(self, name, kind, k):
        if kind == "int":
            return f"self.{name} = k + {k}"
        if kind == "str":
            return f"self.{name} = 'i{k}'"
        if kind == "tensor":
            return f"self.{name} = torch.full((2,), float(k + {k}))"
        if kind == "func":
            return f"self.{name} = lambda *a: ('f', {k}, len(a))"
        if kind == "setattr_bypass":
            return f"object.__setattr__(self, {name!r}, {k} + 1)"
        if kind == "dict_write":
            return f"self.__dict__[{name!r}] = {k} + 2"
        return None

    def plain_classes(self):
        r = self.r
        self.meta = r.random() < 0.25
        # __slots__ on A: with a __dict__ too ("dict"), or none at all on A and B ("only"),
        # where instances can hold nothing but the slot members.
        self.slots = r.choice([None, None, None, "dict", "only"])
        for cls, base in (("A", "object"), ("B", "A")):
            header = f"class {cls}({base}"
            if cls == "A" and self.meta:
                header += ", metaclass=Meta"
            self.emit(header + "):")
            if cls == "A" and self.slots:
                self.emit("__slots__ = ('s1', '__dict__')" if self.slots == "dict" else "__slots__ = ('s1', 's2')", 1)
            if cls == "B" and self.slots == "only":
                self.emit("__slots__ = ('s3',)", 1)
            for name in NAMES:
                if name == "gx":
                    continue
                kinds = [k for k in CLASS_KINDS if k not in ("cached", "property_set", "data_desc")] \
                    if self.slots == "only" else CLASS_KINDS   # those keep state in the instance's __dict__
                self.class_member(cls, name, r.choice(kinds), r.randint(1, 9))
            if cls == "B" and r.random() < 0.5:
                target = r.choice(NAMES)
                # (a print first: a graph break, so super() runs in code copied from the method)
                pre = "    print('in sup')\n" if r.random() < 0.5 else ""
                self.emit(f"def sup(self):\n{pre}    v = super().{target}\n"
                          f"    return v() if callable(v) and not isinstance(v, type) else v", 1)
            if cls == "A" and r.random() < 0.5:
                self.emit("def __getattr__(self, name):\n    if name.startswith('g'):\n"
                          "        return ('ga', name)\n    raise AttributeError(name)", 1)
            if cls == "B" and r.random() < 0.2:
                target = r.choice(NAMES)
                via = r.choice(["super().__getattribute__(name)", "object.__getattribute__(self, name)"])
                self.emit(f"def __getattribute__(self, name):\n    if name == {target!r}:\n"
                          f"        return 'intercepted'\n    return {via}", 1)
            if cls == "B" and r.random() < 0.2:
                self.emit("def __setattr__(self, name, value):\n"
                          "    super().__setattr__(name, value * 3 if type(value) is int else value)", 1)
            for special, body in (("__call__", "def __call__(self, *args):\n    return ('called', len(args))"),
                                  ("__len__", "def __len__(self):\n    return 3"),
                                  ("__bool__", "def __bool__(self):\n    return False"),
                                  ("__iter__", "def __iter__(self):\n    return iter([4, 5])"),
                                  ("__contains__", "def __contains__(self, item):\n    return item == 'a'")):
                if r.random() < 0.2:
                    self.emit(body, 1)
            self.emit("def __init__(self, k):" if cls == "A" else "def __init__(self, k):\n    super().__init__(k)", 1)
            stores = ["pass"]
            if cls == "A" and self.slots:
                stores.append("self.s1 = k")
            if cls == "B" and self.slots == "only" and r.random() < 0.5:
                stores.append("self.s3 = k * 2")
            for name in NAMES:
                if self.slots == "only":
                    break
                kind = r.choice(INSTANCE_KINDS)
                line = self.instance_store(name, kind, r.randint(1, 9))
                if line:
                    stores.append(line)
            self.emit("\n".join(stores), 2)
            self.emit("")

    # ---- modules

    def module_classes(self):
        r = self.r
        kinds = {}
        for cls, base in (("Base", "nn.Module"), ("M", "Base")):
            self.emit(f"class {cls}({base}):")
            for name in MODULE_NAMES:
                kind = r.choice(["none", "none", "none", "method", "property", "class_int", "class_none"])
                k = r.randint(1, 5)
                if kind == "method":
                    self.emit(f"def {name}(self, y):\n    return y * {k + 0.5}", 1)
                elif kind == "property":
                    self.emit(f"@property\ndef {name}(self):\n    return {k}", 1)
                elif kind == "class_int":
                    self.emit(f"{name} = {k}", 1)
                elif kind == "class_none":
                    self.emit(f"{name} = None", 1)
                kinds[(cls, name)] = kind
            if cls == "M":
                self.emit("def __init__(self):\n    super().__init__()", 1)
                self.emit(f"self.blocks = nn.ModuleList([Sub(2)] * {r.randint(0, 2)})", 2)
                for name in MODULE_NAMES:
                    reg = r.choice(["none", "param", "buffer", "linear", "relu", "sub", "int", "tensor",
                                    "register_module"])
                    line = {
                        "param": f"self.{name} = nn.Parameter(torch.randn(4))",
                        "buffer": f"self.register_buffer({name!r}, torch.randn(4))",
                        "linear": f"self.{name} = nn.Linear(4, 4)",
                        "relu": f"self.{name} = nn.ReLU()",
                        "sub": f"self.{name} = Sub({r.randint(2, 4)})",
                        "int": f"self.{name} = {r.randint(2, 4)}",
                        "tensor": f"self.{name} = torch.randn(4)",
                        "register_module": f"self.add_module({name!r}, Sub(3))",
                    }.get(reg)
                    if line:
                        self.emit(line, 2)
                self.forward()
            else:
                self.emit("pass", 1)
            self.emit("")

    def forward(self):
        r = self.r
        body = ["def forward(self, y):"]
        for _ in range(r.randint(3, 7)):
            n = r.choice(MODULE_NAMES)
            body.append(r.choice([
                f"    y = use(self.{n}, y)",
                f"    y = use(getattr(self, {n!r}, None), y)",
                f"    y = y + (1 if hasattr(self, {n!r}) else 2)",
                f"    y = y + (1 if callable(getattr(self, {n!r}, None)) else 3)",
                f"    y = y + (1 if isinstance(getattr(self, {n!r}, None), nn.Module) else 4)",
                f"    y = y + ({n!r} in self._modules) + 2 * ({n!r} in self._parameters) + 4 * ({n!r} in self._buffers)",
                f"    y = y * len(list(self.children())) + len(list(self.named_parameters()))",
                f"    y = y + num(type(self).__dict__.get({n!r}, 0))",
            ]))
        body.append("    return y")
        self.emit("\n".join(body), 1)

    # ---- the compiled function

    def statement(self, target):
        r = self.r
        n = r.choice(NAMES)
        k = r.randint(1, 6)
        options = [
            f"v = {target}.{n}\nout.append(v() if callable(v) and not isinstance(v, type) else v)\n"
            f"t = t + num(out[-1])",
            f"out.append(getattr({target}, {n!r}, 'missing'))",
            f"out.append(hasattr({target}, {n!r}))\nt = t * (2 if out[-1] else 3)",
            f"{target}.{n} = {k}\nout.append({target}.{n})",
            f"del {target}.{n}\nout.append(hasattr({target}, {n!r}))",
            f"out.append(callable({target}))",
            f"out.append(callable(getattr({target}, {n!r}, None)))",
            f"out.append(type({target}).{n})",
            f"out.append(len({target}))\nt = t + out[-1]",
            f"out.append(bool({target}))",
            f"out.append(list({target}))",
            f"out.append(list(reversed({target})))",
            f"out.append(type(iter({target})).__name__)",
            f"out.append('a' in {target})",
            f"out.append(isinstance({target}, A))",
            f"out.append(isinstance({target}, HasLen))",
            f"out.append(issubclass(type({target}), HasLen))",
            f"out.append({target}.__dict__.get({n!r}, 'absent'))",
            f"out.append({target}({k}))",
            f"out.append(t * num(getattr({target}, {n!r}, 1)))",
        ]
        if self.meta:
            options += [f"out.append(isinstance({target}, A))", "out.append(A.tag)", "out.append(B.tag)",
                        f"out.append(getattr({target}, 'tag', 'no tag'))", "out.append(isinstance(m, A))",
                        "out.append(isinstance(42, (A, str)))", "out.append(isinstance(x, A))"]
        if self.slots:
            sn = r.choice(["s1", "s2", "s3"])
            options += [f"out.append(getattr({target}, {sn!r}, 'unset'))", f"{target}.{sn} = {k}\nout.append({target}.{sn})",
                        f"del {target}.{sn}\nout.append(hasattr({target}, {sn!r}))"]
        options += [
            f"out.append({target}.sup())",
            f"object.__setattr__({target}, {n!r}, {k})\nout.append(getattr({target}, {n!r}))",
            # the module and tensors: protocol builtins and lookups answer as Python does there too
            f"out.append(hasattr(m, {r.choice(MODULE_NAMES)!r}))",
            f"out.append(callable(getattr(m, {r.choice(MODULE_NAMES)!r}, None)))",
            f"out.append(type(getattr(m, {r.choice(MODULE_NAMES)!r}, None)))",
            "out.append((len(m.blocks), bool(m.blocks), callable(m), isinstance(m.blocks, nn.Module)))",
            "out.append([type(b) for b in m.blocks])",
            "out.append((callable(x), hasattr(x, 'shape'), hasattr(x, 'tag'), len(x), isinstance(x, nn.Parameter)))",
            "out.append([type(it).__name__ for it in (iter(x), iter((1, 2)), iter(range(2)), reversed([1]), "
            "enumerate(x), zip(x, x), iter('ab'))])\nt = t + reversed(x)",
            "out.append([type(it).__name__ for it in (itertools.chain(x, [1]), itertools.product((1, 2), x), "
            "itertools.accumulate((1, 2)), itertools.takewhile(bool, (1, 0)), itertools.compress((1, 2), (0, 1)), "
            "m.parameters(), m.named_modules(), m.blocks.children(), {1: 2}.__iter__())])\n"
            "out.append((isinstance(m.parameters(), types.GeneratorType), isinstance(itertools.repeat(1, 2), types.GeneratorType)))",
            f"out.append(isinstance(getattr(m, {r.choice(MODULE_NAMES)!r}, None), (nn.Parameter, nn.Module, int)))",
        ]
        body = r.choice(options)
        return "try:\n" + "\n".join("    " + ln for ln in body.splitlines()) + \
            "\nexcept (AttributeError, TypeError) as e:\n    out.append(type(e).__name__)"

    def function(self):
        r = self.r
        self.emit("def f(x, obj, m):")
        self.emit("out = []\nt = x * 1.0\no2 = B(5)", 1)
        for _ in range(r.randint(4, 10)):
            self.emit(self.statement(r.choice(["obj", "obj", "o2"])), 1)
        if r.random() < 0.8:
            self.emit("t = t + m(x).sum()", 1)
        self.emit("return t, out", 1)
        self.emit("")
        # A change between calls: what the trace read must be guarded.
        n = r.choice(NAMES)
        k = r.randint(1, 9)
        mn = r.choice(MODULE_NAMES)
        self.emit("def shift(obj, m, i):\n    try:")
        self.emit(r.choice([
            "pass",
            f"obj.__dict__[{n!r}] = i + {k}",
            f"obj.__dict__.pop({n!r}, None)",
            f"B.{n} = i * {k}",
            f"A.{n} = 'shifted{k}'",
            f"m.{mn} = i + {k} if not isinstance(getattr(m, {mn!r}, None), (nn.Module, torch.Tensor)) else m.{mn}",
            "m.train(i % 2 == 0)",
        ]), 2)
        self.emit("    except (AttributeError, TypeError, KeyError):\n        pass\n")


def make_program(seed):
    """(source, namespace maker) of program ``seed``."""
    r = random.Random(seed)
    for sub in range(400):
        g = _Gen(r.randrange(1 << 30))
        g.emit(PRELUDE)
        g.plain_classes()
        g.module_classes()
        g.function()
        src = "\n".join(g.lines) + "\n"
        # Programs whose set-up fails eagerly (a descriptor without a setter hit in __init__,
        # a parameter name a class attribute already takes) are regenerated.
        try:
            ns = _namespace(src, seed)
            ns["B"](1), ns["M"]()
        except Exception:  # noqa: BLE001
            continue
        return src
    raise RuntimeError(f"seed {seed}: no program whose set-up runs")


def _namespace(src, seed):
    name = f"gen_lookup_{seed}"
    code = compile(src, f"<{name}>", "exec")
    module = types.ModuleType(name)
    sys.modules[name] = module   # dataclass-like machinery looks classes' modules up
    exec(code, module.__dict__)
    return module.__dict__


def normalize(v, depth=0):
    """A comparable form of what a program returned or holds (classes differ between copies)."""
    if isinstance(v, torch.Tensor):
        return v.detach().clone() if not v.requires_grad else ("needs grad", v.detach().clone())
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if depth > 4:
        return ("deep",)
    if isinstance(v, (list, tuple)):
        return type(v).__name__, [normalize(i, depth + 1) for i in v]
    if isinstance(v, dict):
        return "dict", [(k, normalize(i, depth + 1)) for k, i in v.items()]
    if isinstance(v, type):
        return ("class", v.__qualname__)
    if isinstance(v, types.MethodType):
        return ("method", v.__func__.__qualname__, type(v.__self__).__qualname__)
    if callable(v) and not isinstance(v, torch.nn.Module):
        return ("callable", getattr(v, "__qualname__", type(v).__qualname__))
    return ("object", type(v).__qualname__)


def observe(obj, m):
    """The state a user can see on the objects afterwards."""
    own = normalize(dict(getattr(obj, "__dict__", {})))
    slots = [normalize(getattr(obj, n, "unset")) for n in ("s1", "s2", "s3") if hasattr(type(obj), n)]
    state = [(k, normalize(v)) for k, v in m.state_dict().items()]
    plain = normalize({k: v for k, v in vars(m).items() if not k.startswith("_")})
    return own, slots, state, plain


def first_difference(a, b, path="result"):
    """Where two normalized values first differ, and how (for the failure message)."""
    if isinstance(a, tuple) and isinstance(b, tuple) and len(a) == len(b) == 2 and isinstance(a[1], list) \
            and isinstance(b[1], list) and a[0] == b[0]:
        if len(a[1]) != len(b[1]):
            return f"{path}: {len(a[1])} items in eager, {len(b[1])} compiled"
        for i, (x, y) in enumerate(zip(a[1], b[1])):
            if not same(x, y, rtol=1e-4, atol=1e-5):
                return first_difference(x, y, f"{path}[{i}]")
    return f"{path}: eager {a!r}, compiled {b!r}"


def _run(fn, x, obj, m):
    printed = io.StringIO()
    result, exc = None, None
    with contextlib.redirect_stdout(printed):
        try:
            result = fn(x, obj, m)
        except Exception as e:  # noqa: BLE001 - the same exception must escape compiled
            exc = (type(e).__name__, str(e))
    return normalize(result), exc, printed.getvalue(), observe(obj, m)


CALLS = 3


def run_seed(seed):
    """Compare program ``seed`` compiled with eager over ``CALLS`` calls. Returns the
    CompileCounter (graphs made); raises AssertionError with the program on a difference."""
    src = make_program(seed)
    eager_ns, comp_ns = _namespace(src, seed), _namespace(src, seed)
    torch.manual_seed(seed)
    eager_state = (eager_ns["B"](1), eager_ns["M"]())
    torch.manual_seed(seed)
    comp_state = (comp_ns["B"](1), comp_ns["M"]())
    cnt = CompileCounter()
    compiled = bytegraph.compile(comp_ns["f"], backend=cnt)
    gen = torch.Generator().manual_seed(seed)
    with bytegraph.config.patch(suppress_errors=False):
        for i in range(CALLS):
            x = torch.randn(2, 4, generator=gen)
            expected = _run(eager_ns["f"], x.clone(), *eager_state)
            try:
                actual = _run(compiled, x.clone(), *comp_state)
            except Exception as e:
                raise AssertionError(f"lookup program {seed}, call {i + 1}: bytegraph failed: "
                                     f"{type(e).__name__}: {e}\n{src}") from e
            for what, a, b in zip(("result", "exception", "printed output", "state afterwards"),
                                  expected, actual):
                if not same(a, b, rtol=1e-4, atol=1e-5):
                    raise AssertionError(f"lookup program {seed}, call {i + 1}: {what} differs: "
                                         f"{first_difference(a, b)}\n"
                                         f"  exceptions: eager {expected[1]}, compiled {actual[1]}\n{src}")
            eager_ns["shift"](*eager_state, i)
            comp_ns["shift"](*comp_state, i)
    return cnt


def torch_compile_graphs(seed):
    """The graphs torch.compile makes of program ``seed`` on its first call (the reference for
    a run of bytegraph that compiled nothing)."""
    import torch._dynamo
    count = [0]

    def backend(gm, example_inputs):
        count[0] += 1
        return gm.forward

    ns = _namespace(make_program(seed), seed)
    torch.manual_seed(seed)
    state = (ns["B"](1), ns["M"]())
    torch._dynamo.reset()
    try:
        x = torch.randn(2, 4, generator=torch.Generator().manual_seed(seed))
        _run(torch.compile(ns["f"], backend=backend), x, *state)
    finally:
        torch._dynamo.reset()
    return count[0]

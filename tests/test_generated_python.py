"""Randomly generated Python programs mixing tensors with real Python, compiled vs eager.

A seeded generator (``random.Random(seed)``) writes one function per seed that uses
Python ints/floats/strs/bools, containers and their methods, comprehensions, loops,
helper functions of this module, closures, lambdas, classes made in the function,
string formatting, exceptions, generators, ``print`` and mutation of module globals
and of an input list, with tensor ops mixed in (shapes tracked, so every program is
valid). Each construct sits behind a feature flag (``FEATURES``); ``FEATURE_SETS``
names the subsets that are run.

Ground truth is eager: the source is ``exec``'d into a fresh module namespace and run
eagerly; a program that fails eagerly (other than with a deliberately escaping
KeyError/ValueError/IndexError) is regenerated from the next sub-seed. The compiled
function (``fullgraph=False``) must then agree with eager on the return value, printed
output, escaping exception (type and message), the module globals it mutates and its
inputs, over several calls with other values (and, for some sets, other shapes and state).
Where the program breaks differs from torch.compile, so the exact number of graphs is not
asserted; the first call must compile at least one graph wherever torch.compile makes one
(asked when it made none), and no frame may fall back after an internal error. Whether the
first call compiled as one graph without a break is recorded per seed and summarised at the
end of the run.

``BYTEGRAPH_GEN_SEEDS=N`` runs N seeds per feature set (default ``DEFAULT_SEEDS``), from
``BYTEGRAPH_GEN_FIRST_SEED`` (default 0).
"""
import contextlib
import dataclasses
import functools
import linecache
import logging
import math
import os
import random
import sys
import tempfile
import types

import pytest
import torch

from bytegraph.debug import records
import bytegraph
from bytegraph.backends.registry import lookup_backend
from bytegraph.testing import CompileCounter
from helpers import assert_no_internal_errors, assert_same_run, run_observed

DEFAULT_SEEDS = 80
N_SEEDS = int(os.environ.get("BYTEGRAPH_GEN_SEEDS", DEFAULT_SEEDS))
# Where the seeds start (``BYTEGRAPH_GEN_FIRST_SEED=5000``: programs no run has seen yet).
FIRST_SEED = int(os.environ.get("BYTEGRAPH_GEN_FIRST_SEED", 0))
# Sets whose programs are called more often run fewer seeds by default (the suite's time).
FEWER_SEEDS = {"shapes": 30, "moving": 30}

FEATURES = (
    "arith",        # int/float/str/bool expressions and comparisons
    "if",           # if/elif/else on Python values
    "for",          # for over range/lists/enumerate/zip/dict items (+ break/continue)
    "while",        # while with a counter
    "containers",   # list/dict/set building and methods
    "comprehensions",
    "helpers",      # helper functions of this module: args, kwargs, defaults, *args
    "closures",     # nested functions and lambdas over locals
    "classes",      # classes (methods, property, dataclass) made inside the function
    "unpack",       # tuple unpacking, swaps, starred targets
    "strings",      # f-strings, %, .format, str methods
    "tensors",      # tensor ops (also tensors in containers, .item(), branches on tensors)
    "exceptions",   # try/except/else/finally, raise of builtin exceptions caught or escaping
    "generators",   # generator functions consumed with for/list/next/sum
    "print",        # print, and a logger's calls (written or not; where a record says it came from)
    "globals",      # module global list/dict mutation, `global` counter
    "inputs",       # mutation of an input list
    # families of past wrong results (issues 9 and 19):
    "nested",       # nested functions closing over arguments/locals that break, called again
    "raising",      # side effects followed by an exception eager raises too; raise on tensor conditions
    "inplace",      # in-place updates of tensor arguments (and views of them), also inside loops
    "masks",        # data-dependent shapes: boolean masks, nonzero, unique, repeat_interleave
    "grads",        # inputs that require grad; .grad compared (None vs tensor), aot_eager backend
    "shared",       # one code object, many functions: shared decorators, closure factories, lambdas
    "stale",        # a value read from module state, then a call that breaks changes that state
    "moving",       # module and object state that differs between calls (attributes, flags, training,
                    # hooks, a replaced parameter): what a trace read must be guarded
    "shapes",       # tensor shapes that change between calls (sizes 1, growing, shrinking): sizes are
                    # read from the tensors, never written as numbers; guards and dynamic shapes
)

FEATURE_SETS = {
    "core": {"arith", "if", "for", "while", "containers", "comprehensions", "unpack", "strings", "tensors"},
    "functions": {"arith", "if", "for", "helpers", "closures", "classes", "tensors", "containers"},
    "effects": {"arith", "if", "for", "containers", "print", "globals", "inputs", "tensors", "strings", "stale"},
    "control": {"arith", "if", "for", "while", "exceptions", "generators", "containers", "tensors"},
    "closures": {"arith", "if", "for", "containers", "tensors", "nested", "print", "inputs", "strings", "stale"},
    "raising": {"arith", "if", "for", "containers", "tensors", "raising", "exceptions", "globals", "inputs",
                "print"},
    "inplace": {"arith", "if", "for", "while", "tensors", "inplace", "print", "nested"},
    "grads": {"arith", "if", "for", "tensors", "masks", "grads", "nested", "print"},
    "shared": {"arith", "if", "for", "tensors", "shared", "print", "containers", "nested"},
    "shapes": {"arith", "if", "for", "while", "tensors", "containers", "shapes", "print", "nested", "masks",
               "comprehensions", "strings"},
    "moving": {"arith", "if", "for", "tensors", "containers", "moving", "print", "nested", "strings",
               "globals", "stale", "helpers"},
    "all": set(FEATURES) - {"grads", "shapes", "moving"},
}

# Seeds whose compiled run differs from eager because of a known bytegraph bug:
# (feature set, seed) -> (first Python version affected, reason). Strict xfails there.
KNOWN_MISMATCHES = {}
# Seeds that crash the interpreter or fail only depending on which tests ran before
# (so cannot run as strict xfails): skipped from that Python version on.
KNOWN_UNSTABLE = {}
# Seeds whose first call compiles no graph where torch.compile makes some (correct, WORSE):
# (feature set, seed) -> reason. Their results are still compared.
KNOWN_NO_GRAPH = {}


# ---- helpers the generated programs call (module-level functions of this file)

def h_add(a, b=2, *rest, scale=1):
    return (a + b + sum(rest)) * scale


def h_mix(t, k=1.0, *, shift=0):
    return t * k + shift


def h_join(s, *parts, sep="-"):
    return sep.join([s, *[str(p) for p in parts]])


def h_stats(values):
    return min(values, default=0), max(values, default=0), len(values)


def h_pick(d, key, default=-1):
    return d.get(key, default)


def h_count_up(n, start=0):
    for i in range(n):
        yield start + i * 2


def h_scaled(t, n):
    for i in range(n):
        yield t * (i + 1)


def h_check(k):
    if k % 3 == 0:
        raise ValueError(f"gen bad value {k}")
    return k + 1


def h_check_loud(k):
    """h_check behind a graph break: a call to it in ``lst.append(...)`` breaks with a method
    pair on the stack, and may raise into the caller's handler."""
    print("check", k)
    return h_check(k)


def h_lookup(d, key):
    return d[key]


def h_shift_state(obj, d, lst, t):
    """Changes the module state it is given, after a graph break (a branch on tensor data)."""
    if t.sum() > 0:
        print("shift", obj.a)
    obj.a = obj.a + 7
    d["ab"] = d.get("ab", 0) + 5
    lst[0] = lst[0] + 3
    return t * 2


HELPERS = {f.__name__: f for f in (h_add, h_mix, h_join, h_stats, h_pick, h_count_up, h_scaled, h_check,
                                     h_check_loud, h_lookup, h_shift_state)}

UNARY = ["torch.relu({a})", "{a}.sin()", "{a}.abs()", "torch.tanh({a})", "-{a}", "{a} * 0.5",
         "torch.sigmoid({a})", "{a}.clamp(-1.0, 1.0)", "{a}.cos() + 1"]
BINARY = ["{a} + {b}", "{a} - {b}", "{a} * {b}", "torch.maximum({a}, {b})", "{a} / ({b}.abs() + 1)",
          "torch.where({a} > 0, {a}, {b})"]
WORDS = ["ab", "cd", "xy", "k", "zz", "q1"]


class Scope:
    """What the program has defined at one block level: name -> kind ('int', 'tensor:full', ...)."""

    def __init__(self):
        self.names = {}


class ProgramGen:
    MAX_DEPTH = 2

    def __init__(self, seed, features):
        self.r = random.Random(seed)
        self.tensor_rng = torch.Generator().manual_seed(seed)   # input values: the same in any test order
        self.features = set(features)
        self.lines = []
        self.indent = 1
        self.scopes = [Scope()]
        self.frozen = []         # names being iterated (a stack, loops nest): not mutated inside the loop
        self.count = 0
        self.loop_depth = 0
        self.uses_counter = False
        self.generators = []     # local generator functions (one int parameter)
        self.closures = []       # local functions of one int parameter returning an int
        self.shape = None

    # ---- bookkeeping

    def on(self, feature):
        return feature in self.features

    def dim(self, i, tensor):
        """Size ``i`` of the program's full shape, as source: the number, or with ``shapes`` (sizes
        that change between calls) read from ``tensor``, a tensor of that shape."""
        return f"{tensor}.shape[{i}]" if self.on("shapes") else str(self.shape[i])

    def first_half(self, doubled, shape):
        """The first half of ``doubled`` (two tensors of ``shape`` concatenated), as source."""
        if self.on("shapes"):
            return f"{doubled}.chunk(2)[0]"
        return f"{doubled}[:{self.shape[0] if shape == 'full' else self.shape[1]}]"

    def fresh(self, prefix):
        self.count += 1
        return f"{prefix}{self.count}"

    def emit(self, line):
        self.lines.append("    " * self.indent + line)

    def define(self, name, kind):
        self.scopes[-1].names[name] = kind

    def visible(self, kind=None):
        out = {}
        for scope in self.scopes:
            out.update(scope.names)
        return sorted(n for n, k in out.items() if kind is None or k == kind)

    def pick(self, kind):
        names = self.visible(kind)
        return self.r.choice(names) if names else None

    def mutable(self, kind):
        names = [n for n in self.visible(kind) if n not in self.frozen]
        return self.r.choice(names) if names else None

    @contextlib.contextmanager
    def block(self, header):
        self.emit(header)
        self.indent += 1
        self.scopes.append(Scope())
        start = len(self.lines)
        try:
            yield
        finally:
            if len(self.lines) == start:
                self.emit("pass")
            self.scopes.pop()
            self.indent -= 1

    @property
    def depth(self):
        return len(self.scopes) - 1

    # ---- expressions

    def int_leaf(self):
        name = self.pick("int")
        if name and self.r.random() < 0.75:
            return name
        return str(self.r.randint(-3, 9))

    def int_expr(self, depth=0):
        r = self.r
        if depth >= 2 or r.random() < 0.3:
            return self.int_leaf()
        a, b = self.int_expr(depth + 1), self.int_expr(depth + 1)
        options = [f"({a} + {b})", f"({a} - {b})", f"({a} * {b})", f"({a} // (abs({b}) % 5 + 1))",
                   f"({a} % 7)", f"max({a}, {b})", f"min({a}, {b})", f"abs({a})"]
        if self.on("containers"):
            lst, d, st = self.pick("list"), self.pick("dict"), self.pick("set")
            if lst:
                options += [f"len({lst})", f"sum({lst})", f"({lst}[{a} % len({lst})] if {lst} else 0)"]
            if d:
                options += [f"len({d})", f"{d}.get({self.str_leaf()}, {a})"]
            if st:
                options += [f"len({st})"]
        if self.on("strings"):
            s = self.pick("str")
            if s:
                options += [f"len({s})", f"{s}.count('a')"]
        if self.on("tensors"):
            t = self.pick("tensor:full")
            if t:
                options += [f"{t}.shape[{r.randrange(2)}]", f"{t}.size(-1)", f"len({t})", f"{t}.dim()"]
        if self.on("arith"):
            f = self.pick("float")
            if f:
                options += [f"int({f})", f"round({f})"]
            options += [f"({a} if {self.bool_expr(depth + 1)} else {b})", f"int({a} > {b})"]
        if self.on("helpers"):
            options += [f"h_add({a})", f"h_add({a}, {b})", f"h_add({a}, {b}, 1, 2)", f"h_add({a}, scale=2)",
                        f"h_add(*[{a}, {b}])", f"h_add({a}, **{{'scale': 3}})"]
            d = self.pick("dict")
            if d:
                options += [f"h_pick({d}, {self.str_leaf()})", f"h_pick({d}, key={self.str_leaf()}, default={a})"]
        if self.on("closures") and self.closures:
            options += [f"{r.choice(self.closures)}({a})"]
        if self.on("generators") and self.generators:
            g = r.choice(self.generators)
            options += [f"sum({g}({a} % 4))", f"next({g}(3))", f"next(iter({g}({a} % 3)), -1)"]
        if self.on("generators") and self.on("helpers"):
            options += [f"sum(h_count_up({a} % 4, start={b}))"]
        if self.on("comprehensions"):
            lst = self.pick("list")
            if lst:
                options += [f"sum(v * v for v in {lst})", f"len([v for v in {lst} if v > {a}])"]
        return r.choice(options)

    def float_expr(self, depth=0):
        r = self.r
        a = self.int_expr(depth + 1)
        options = [f"({a} / (abs({self.int_expr(depth + 1)}) + 1))", f"float({a})", f"({a} * 0.25)"]
        f = self.pick("float")
        if f:
            options += [f"({f} * 0.5 + {a})", f"round({f} + 0.5, 2)", f"math.sqrt(abs({f}))", f"-{f}"]
        if self.on("tensors"):
            t = self.pick_tensor()
            if t:
                options += [f"round({t}.sum().item(), 3)", f"round(float({t}.mean()), 3)"]
        return r.choice(options)

    def str_leaf(self):
        name = self.pick("str")
        if name and self.r.random() < 0.6:
            return name
        return repr(self.r.choice(WORDS))

    def str_expr(self, depth=0):
        r = self.r
        s = self.str_leaf()
        if depth >= 2 or r.random() < 0.25:
            return s
        a = self.int_expr(depth + 1)
        options = [f"({s} + {self.str_leaf()})", f"str({a})", f"{s}[:3]", f"({s} * 2)[:8]"]
        if self.on("strings"):
            options += [f'f"{{{s}}}-{{{a}}}"', f'f"{{{a}:>3}}|{{{s}!r}}"', f"'%s:%d' % ({s}, {a})",
                        f"'{{}}/{{}}'.format({s}, {a})", f"{s}.upper()", f"{s}.replace('a', 'b')",
                        f"'-'.join([{s}, {self.str_leaf()}])", f"{s}.strip().title()",
                        f"('yes' if {s}.startswith('a') else 'no')"]
            f = self.pick("float")
            if f:
                options += [f'f"{{{f}:.2f}}"', f"'%.1f' % {f}"]
        if self.on("helpers"):
            options += [f"h_join({s}, {a})", f"h_join({s}, {a}, 'z', sep='+')"]
        if self.on("containers"):
            lst = self.pick("list")
            if lst:
                options += [f"','.join(str(v) for v in {lst})[:10]"]
            d = self.pick("dict")
            if d:
                options += [f"''.join(sorted({d}))[:6]"]
        return r.choice(options)

    def bool_expr(self, depth=0):
        r = self.r
        a, b = self.int_expr(depth + 1), self.int_expr(depth + 1)
        options = [f"{a} > {b}", f"{a} == {b}", f"{a} % 2 == 0", f"{a} != {b}", f"{a} <= {b} < 8"]
        s = self.pick("str")
        if s:
            options += [f"{s} == {self.str_leaf()}", f"'a' in {s}", f"len({s}) > 2"]
        lst, d, st = self.pick("list"), self.pick("dict"), self.pick("set")
        if lst:
            options += [f"{a} in {lst}", f"bool({lst})", f"not {lst}"]
        if d:
            options += [f"{self.str_leaf()} in {d}"]
        if st:
            options += [f"{a} in {st}"]
        bname = self.pick("bool")
        if bname:
            options += [bname, f"not {bname}", f"{bname} and {a} > 0", f"{bname} or {a} < 0"]
        if self.on("tensors") and r.random() < 0.15:
            t = self.pick_tensor()
            if t:
                options += [f"bool({t}.sum() > 0)", f"{t}.max() > 0.5"]   # a branch on a tensor
        return r.choice(options)

    def list_expr(self):
        r = self.r
        a, b = self.int_expr(1), self.int_expr(1)
        options = [f"[{a}, {b}]", f"[{a}, {b}, {self.int_leaf()}]", f"list(range({a} % 5))"]
        lst = self.pick("list")
        if lst:
            options += [f"sorted({lst})", f"{lst}[:3]", f"({lst} + [{a}])", f"list(reversed({lst}))",
                        f"{lst}[::-1][:4]"]
        if self.on("comprehensions"):
            src = lst or f"range({a} % 6)"
            options += [f"[v * 2 for v in {src}]", f"[v for v in {src} if v % 2 == 0]",
                        f"[v + w for v in {src} for w in range(2)]", f"[v if v > {b} else -v for v in {src}]",
                        f"[w for row in [[v, v + 1] for v in {src}] for w in row]"]
            st = self.pick("set")
            if st:
                options += [f"sorted(v - 1 for v in {st})"]
            d = self.pick("dict")
            if d:
                options += [f"[v for k, v in {d}.items() if k != 'ab']"]
        if self.on("generators") and self.generators:
            options += [f"list({r.choice(self.generators)}({a} % 4))"]
        if self.on("helpers") and self.on("generators"):
            options += [f"list(h_count_up({a} % 3))"]
        if self.on("tensors"):
            t = self.pick("tensor:full")
            if t:
                options += [f"list({t}.shape)"]
        return r.choice(options)

    def dict_expr(self):
        r = self.r
        a = self.int_expr(1)
        options = [f"{{{self.str_leaf()}: {a}, 'k': {self.int_leaf()}}}", f"dict(ab={a}, cd=2)"]
        d = self.pick("dict")
        if d:
            options += [f"dict({d})", f"{{**{d}, 'zz': {a}}}"]
        if self.on("comprehensions"):
            lst = self.pick("list") or f"range({a} % 4)"
            options += [f"{{str(v): v * v for v in {lst}}}", f'{{f"k{{i}}": v for i, v in enumerate({lst}) if i < 3}}']
            if d:
                options += [f"{{k: v + 1 for k, v in {d}.items()}}"]
        return r.choice(options)

    def set_expr(self):
        r = self.r
        a = self.int_expr(1)
        options = [f"{{{a}, {self.int_leaf()}, 3}}", f"set(range({a} % 4))"]
        lst = self.pick("list")
        if lst:
            options += [f"set({lst})"]
        st = self.pick("set")
        if st:
            options += [f"({st} | {{{a}}})", f"({st} - {{1}})", f"({st} & {{0, 1, 2, {a}}})"]
        if self.on("comprehensions"):
            options += [f"{{v % 3 for v in {lst or 'range(5)'}}}"]
        return r.choice(options)

    # tensors: every tensor has shape 'full' (S), 'row' (S[1:]) or 'scalar' (()); they all broadcast.
    def pick_tensor(self, shape=None):
        if shape is None:
            names = [n for k in ("tensor:full", "tensor:row", "tensor:scalar") for n in self.visible(k)]
            return self.r.choice(names) if names else None
        return self.pick(f"tensor:{shape}")

    def tensor_expr(self, shape, depth=0):
        r = self.r
        own = self.pick_tensor(shape)
        if shape == "full":
            base = own
        elif shape == "row":
            full = self.pick_tensor("full")
            base = own if own and r.random() < 0.6 else r.choice(
                [f"{full}.sum(0)", f"{full}[{self.int_leaf()} % {self.dim(0, full)}]", f"{full}.mean(dim=0)",
                 f"{full}.amax(0)"])
        else:
            src = self.pick_tensor()
            base = own if own and r.random() < 0.5 else r.choice(
                [f"{src}.sum()", f"{src}.mean()", f"{src}.max()", f"{src}.abs().sum()"])
            if self.on("masks") and r.random() < 0.3:
                base = self.mask_expr()
        if depth >= 2 or r.random() < 0.25:
            return base
        choice = r.randrange(6)
        if choice == 0:
            return "(" + r.choice(UNARY).format(a=base) + ")"
        if choice == 1:
            smaller = {"full": ["full", "row", "scalar"], "row": ["row", "scalar"], "scalar": ["scalar"]}[shape]
            other = self.tensor_expr(r.choice(smaller), depth + 1)
            return "(" + r.choice(BINARY).format(a=base, b=other) + ")"
        if choice == 2:
            return f"({base} * {self.int_expr(2)})"
        if choice == 3 and self.pick("float"):
            return f"({base} + {self.pick('float')})"
        if choice == 4 and self.on("helpers"):
            return r.choice([f"h_mix({base})", f"h_mix({base}, 2.0)", f"h_mix({base}, shift={self.int_leaf()})"])
        if choice == 5 and shape != "scalar":
            other = self.tensor_expr(shape, depth + 1)
            return r.choice([f"torch.stack([{base}, {other}]).sum(0)", self.first_half(f"(torch.cat([{base}, {other}]) * 0.5)", shape)])
        return "(" + r.choice(UNARY).format(a=base) + ")"

    def expr(self, kind):
        if kind.startswith("tensor:"):
            return self.tensor_expr(kind.split(":")[1])
        return getattr(self, f"{kind}_expr")()

    # ---- statements

    def kinds(self):
        kinds = ["int", "int", "bool"]
        if self.on("arith"):
            kinds += ["float"]
        if self.on("strings") or self.on("arith"):
            kinds += ["str"]
        if self.on("containers") or self.on("comprehensions"):
            kinds += ["list", "dict", "set"]
        if self.on("tensors"):
            kinds += ["tensor:full", "tensor:full", "tensor:row", "tensor:scalar"]
        return kinds

    def stmt_define(self):
        kind = self.r.choice(self.kinds())
        name = self.fresh({"int": "n", "float": "f", "str": "s", "bool": "b", "list": "lst", "dict": "d",
                           "set": "st"}.get(kind, "t"))
        self.emit(f"{name} = {self.expr(kind)}")
        self.define(name, kind)

    def stmt_update(self):
        r = self.r
        kind = r.choice(self.kinds())
        name = self.mutable(kind)
        if name is None:
            return self.stmt_define() if self.depth == 0 else None
        if kind == "int":
            self.emit(r.choice([f"{name} = ({name} + {self.int_expr()}) % 101", f"{name} += {self.int_leaf()}",
                                f"{name} = max({name} - 1, {self.int_expr()})", f"{name} *= 2"]))
            if f"{name} *= 2" in self.lines[-1]:
                self.emit(f"{name} %= 1000")
        elif kind == "float":
            self.emit(f"{name} = {name} * 0.5 + {self.float_expr()}")
        elif kind == "str":
            self.emit(f"{name} = ({name} + {self.str_expr()})[:12]")
        elif kind == "bool":
            self.emit(f"{name} = {name} or {self.bool_expr()}" if r.random() < 0.5 else f"{name} = not {name}")
        elif kind.startswith("tensor:"):
            shape = kind.split(":")[1]
            other = self.tensor_expr(shape, 1)
            self.emit(r.choice([f"{name} = {name} + {other}", f"{name} = ({name} * 0.5 - {other}).tanh()"]))
        elif kind == "list" and self.on("containers"):
            a = self.int_expr(1)
            self.emit(r.choice([f"{name}.append({a})", f"{name}.extend([{a}, 1])", f"{name}.insert(0, {a})",
                                f"{name}.sort()", f"{name}.reverse()", f"{name} += [{a}]",
                                f"{name}.sort(key=lambda v: -v)", f"{name}.remove({name}[0]) if {name} else None"]))
            if r.random() < 0.3:
                with self.block(f"if {name}:"):
                    self.emit(r.choice([f"{name}.pop()", f"{name}[{a} % len({name})] = {self.int_leaf()}",
                                        f"del {name}[0]", f"{name}.pop(0)"]))
        elif kind == "dict" and self.on("containers"):
            a = self.int_expr(1)
            key = self.str_leaf()
            self.emit(r.choice([f"{name}[{key}] = {a}", f"{name}.update({{{key}: {a}}})",
                                f"{name}.setdefault({key}, {a})", f"{name}.pop({key}, None)",
                                f"{name}[{key}] = {name}.get({key}, 0) + {a}"]))
        elif kind == "set" and self.on("containers"):
            a = self.int_expr(1)
            self.emit(r.choice([f"{name}.add({a})", f"{name}.discard({a})", f"{name}.update([{a}, 2])",
                                f"{name} |= {{{a}}}"]))

    def stmt_if(self):
        r = self.r
        with self.block(f"if {self.bool_expr()}:"):
            self.body()
        for _ in range(r.randint(0, 2)):
            with self.block(f"elif {self.bool_expr()}:"):
                self.body()
        if r.random() < 0.6:
            with self.block("else:"):
                self.body()

    def stmt_for(self):
        r = self.r
        i, v = self.fresh("i"), self.fresh("v")
        options = [("range", f"for {i} in range({r.randint(0, 4)}):", {i: "int"}, None),
                   ("range", f"for {i} in range({self.int_leaf()} % 4, 5):", {i: "int"}, None)]
        if self.on("containers") or self.on("comprehensions"):
            lst, d = self.pick("list"), self.pick("dict")
            if lst:
                options += [("list", f"for {v} in {lst}:", {v: "int"}, lst),
                            ("enumerate", f"for {i}, {v} in enumerate({lst}):", {i: "int", v: "int"}, lst),
                            ("zip", f"for {i}, {v} in zip(range(3), {lst}):", {i: "int", v: "int"}, lst)]
            if d:
                options += [("items", f"for {v}, {i} in {d}.items():", {v: "str", i: "int"}, d),
                            ("keys", f"for {v} in sorted({d}):", {v: "str"}, None)]
        options += [("zip", f"for {i}, {v} in zip([1, 2, 3], 'abc'):", {i: "int", v: "str"}, None)]
        if self.on("tensors"):
            t = self.pick("tensor:full")
            if t:
                options += [("tensor", f"for {v} in {t}:", {v: "tensor:row"}, None)]
        _, header, loop_vars, frozen = r.choice(options)
        with self.block(header):
            for name, kind in loop_vars.items():
                self.define(name, kind)
            self.frozen.append(frozen)
            self.loop_depth += 1
            self.body()
            if r.random() < 0.25:
                with self.block(f"if {self.bool_expr()}:"):
                    self.emit(r.choice(["break", "continue"]))
            self.loop_depth -= 1
            self.frozen.remove(frozen)

    def stmt_while(self):
        w = self.fresh("w")
        self.emit(f"{w} = 0")
        with self.block(f"while {w} < {self.r.randint(1, 4)}:"):
            self.emit(f"{w} += 1")
            self.define(w, "int")
            self.frozen.append(w)
            self.loop_depth += 1
            self.body()
            self.loop_depth -= 1
            self.frozen.remove(w)
        self.define(w, "int")

    def stmt_unpack(self):
        r = self.r
        ints = self.visible("int")
        a, b = self.fresh("n"), self.fresh("n")
        choice = r.randrange(5)
        if choice == 0 and len(ints) >= 2:
            x, y = [n for n in r.sample(ints, 2)]
            if x in self.frozen or y in self.frozen:
                return
            self.emit(f"{x}, {y} = {y}, {x}")
            return
        if choice == 1:
            self.emit(f"{a}, {b} = {self.int_expr()}, {self.int_expr()}")
        elif choice == 2:
            c = self.fresh("n")
            self.emit(f"({a}, {b}), {c} = ({self.int_expr()}, {self.int_leaf()}), {self.int_leaf()}")
            self.define(c, "int")
        elif choice == 3 and self.on("containers"):
            rest = self.fresh("lst")
            self.emit(f"{a}, *{rest} = {self.list_expr()} + [{self.int_leaf()}]")
            self.define(rest, "list")
            self.emit(f"{b} = len({rest})")
        elif choice == 4 and self.on("helpers"):
            c = self.fresh("n")
            lst = self.pick("list") or f"[{self.int_leaf()}, 4]"
            self.emit(f"{a}, {b}, {c} = h_stats({lst})")
            self.define(c, "int")
        else:
            self.emit(f"{a}, {b} = divmod(abs({self.int_expr()}), 3)")
        self.define(a, "int")
        self.define(b, "int")

    def stmt_print(self):
        r = self.r
        args = [self.int_leaf(), self.str_leaf()]
        f = self.pick("float")
        if f:
            args.append(f"round({f}, 2)")
        lst = self.pick("list")
        if lst:
            args.append(lst)
        d = self.pick("dict")
        if d:
            args.append(d)
        st = self.pick("set")
        if st:
            args.append(f"sorted({st})")
        t = self.pick_tensor()
        if t and r.random() < 0.3:
            args.append(f"{t}.shape")
        chosen = r.sample(args, r.randint(1, min(3, len(args))))
        if r.random() < 0.25:
            # G_LOG writes INFO and above; each record keeps its line and function (compared)
            level = r.choice(["debug", "info", "warning"])
            self.emit(r.choice([f"G_LOG.{level}('gen %s', {chosen[0]})",
                                f"G_LOG.log(logging.{level.upper()}, '%s|%s', {chosen[0]}, {chosen[-1]})"]))
            return
        self.emit(r.choice([f"print({', '.join(chosen)})", f"print({', '.join(chosen)}, sep='|')",
                            f'print(f"{{{chosen[0]}}}!", end="")', f"print('%s' % ({chosen[0]},))"]))

    def stmt_global(self):
        r = self.r
        choice = r.randrange(5)
        if choice == 4:
            # State kept under the id of an outside object (GradScaler's per-optimizer state):
            # the key stored must be the real id, found again after a break and on the next call.
            n = self.fresh("n")
            owner = r.choice(["G_OBJ", "G_LIST", "G_DICT"])
            self.emit(f"G_IDS.setdefault(id({owner}), []).append({self.int_expr()})")
            self.emit(f"{n} = len(G_IDS.get(id({owner}), [])) + len(G_IDS)")
            if r.random() < 0.3:
                # the number of an id of an object made here: known only at run time
                self.emit(f"{n} += int((id([{n}]) + 1) > 0)")
            self.define(n, "int")
        elif choice == 0:
            self.emit(f"G_LIST.append({self.int_expr()})")
        elif choice == 1:
            self.emit(f"G_DICT[{self.str_leaf()}] = {self.int_expr()}")
        elif choice == 2:
            self.uses_counter = True
            self.emit(r.choice(["COUNTER += 1", f"COUNTER = COUNTER + {self.int_leaf()}"]))
        else:
            n = self.fresh("n")
            self.emit(r.choice([f"{n} = len(G_LIST) + G_DICT.get('ab', 0)", f"{n} = sum(G_LIST) % 50"]))
            self.define(n, "int")

    def stmt_stale(self):
        """Read module state into a local, let a call that breaks change the state, use the local
        (it must hold what was read, not what the state holds after the call)."""
        r = self.r
        t = self.pick("tensor:full")
        if not t:
            return
        n, out = self.fresh("n"), self.fresh("t")
        read = r.choice(["G_OBJ.a", "G_DICT.get('ab', 0)", "G_LIST[0]", "len(G_LIST)"])
        self.emit(f"{n} = {read}")
        self.emit(f"{out} = h_shift_state(G_OBJ, G_DICT, G_LIST, {t})")
        self.emit(r.choice([f"G_OBJ.hist.append({n})", f"{out} = {out} + {n}"]))
        self.define(n, "int")
        self.define(out, "tensor:full")

    def stmt_moving(self):
        """Read state that the test changes between calls (``MOVING``): attributes of G_OBJ, and
        G_MOD, a module whose training flag, attributes, hooks and parameter change."""
        r = self.r
        t = self.pick("tensor:full")
        if not t:
            return
        out, n = self.fresh("t"), self.fresh("n")
        choice = r.randrange(11)
        if choice == 0:
            self.emit(f"{out} = G_MOD({self.tensor_expr('full', 1)})")
        elif choice == 10:   # a float that changes between calls, compared twice: both outcomes decide
            self.emit(f"{out} = {t} * (2 if G_OBJ.scale > 0.75 else 3)")
            with self.block(f"if {r.choice(['G_OBJ.scale < 1.5', '1.5 > G_OBJ.scale', 'G_OBJ.scale != 2.0'])}:"):
                self.emit(f"{out} = {out} + G_MOD.shift")
        elif choice == 9:    # the object changed here, then read back through its __dict__
            self.emit(f"G_OBJ.a = G_OBJ.a + {self.int_expr()}")
            self.emit(f"{out} = {t} + vars(G_OBJ)['a'] + len(G_OBJ.__dict__)")
        elif choice == 7:    # only whether it is there (the value read is dropped)
            with self.block("try:"):
                self.emit(r.choice(["G_OBJ.extra", "G_MOD.mode"]))
                self.emit(f"{out} = {t} + 1")
            with self.block("except AttributeError:"):
                self.emit(f"{out} = {t} - 1")
        elif choice == 1:
            self.emit(f"{out} = {t} * 1")
            with self.block("if G_OBJ.on:"):
                self.emit(f"{out} = {out} * G_OBJ.scale")
        elif choice == 2:
            self.emit(f"{n} = {self.int_expr()} + G_OBJ.a")
            self.define(n, "int")
            return
        elif choice == 3:
            self.emit(f"{out} = {t} + getattr(G_OBJ, 'extra', 0.5)")
        elif choice == 4:
            self.emit(f"{out} = {t} * (2 if G_MOD.training else 3) + len(G_OBJ.tags)")
        elif choice == 5:
            self.emit(f"{out} = {t} + G_MOD.w * G_MOD.shift")
            with self.block("if hasattr(G_OBJ, 'extra'):"):
                self.emit(f"print('extra', G_OBJ.extra, G_MOD.mode)")
        elif choice == 8:    # two names probed on one object, present on different calls
            first, second = r.sample(["extra", "flag", "a"], 2)
            self.emit(f"{out} = {t} + (1 if hasattr(G_OBJ, {first!r}) else 0)"
                      f" + (10 if hasattr(G_OBJ, {second!r}) else 0)")
        else:
            self.emit(f"{out} = G_MOD({t}) if G_OBJ.tags else {t} - 1")
        self.define(out, "tensor:full")

    def stmt_input(self):
        r = self.r
        if "items" in self.frozen:
            return
        self.emit(r.choice([f"items.append({self.int_expr()})", f"items[0] = {self.int_expr()}",
                            "items.sort()", f"items.extend([{self.int_leaf()}])", "items.pop()"]))

    def raising_stmt(self):
        """(statement, exception type it raises)."""
        r = self.r
        a = self.int_expr(1)
        options = [(f'raise ValueError(f"gen value {{{a}}}")', "ValueError"),
                   (f"raise KeyError({self.str_leaf()})", "KeyError"),
                   (f"raise IndexError('gen index ' + str({a}))", "IndexError"),
                   ("raise ValueError('gen plain')", "ValueError")]
        d = self.pick("dict")
        if d:
            options += [(f"{self.fresh('n')} = {d}['missing']", "KeyError")]
        lst = self.pick("list")
        if lst:
            options += [(f"{self.fresh('n')} = {lst}[len({lst}) + {r.randint(0, 2)}]", "IndexError")]
        if self.on("helpers"):
            options += [(f"{self.fresh('n')} = h_check({a})", "ValueError"),
                        (f"{self.fresh('n')} = h_lookup({{'ab': 1}}, {self.str_leaf()})", "KeyError")]
        t = self.pick_tensor() if self.on("tensors") else None
        if t:        # an op in the graph that fails at run time for some data only
            options.append((f"{self.fresh('t')} = torch.index_select({t}.flatten(), 0, "
                            f"({t}.abs().sum() * {r.choice([1, 3])}).long().reshape(1)) + 1", "IndexError"))
        target = self.mutable("list")
        if target:   # a break under a method call that may raise into a handler (in a loop too)
            options.append((r.choice([f"{target}.append(h_check_loud({a}))",
                                      f"{target}.insert(0, h_check_loud({a}) * 2)"]), "ValueError"))
        return r.choice(options)

    def stmt_try(self):
        r = self.r
        with self.block("try:"):
            self.body(small=True)
            stmt, raised = self.raising_stmt()
            if r.random() < 0.5:
                with self.block(f"if {self.bool_expr()}:"):
                    self.emit(stmt)
            else:
                self.emit(stmt)
        if r.random() < 0.85:   # a clause that matches (also via a base class or a tuple)
            caught = r.choice([raised, "Exception", f"({raised}, TypeError)",
                               "LookupError" if raised != "ValueError" else "(ArithmeticError, ValueError)"])
        else:                   # one that lets the exception escape
            caught = r.choice([k for k in ("KeyError", "ValueError", "IndexError") if k != raised])
        e = self.fresh("e")
        with self.block(f"except {caught} as {e}:"):
            s = self.mutable("str")
            if s:
                self.emit(r.choice([f"{s} = ({s} + str({e}))[:16]", f"{s} = type({e}).__name__"]))
            else:
                self.emit(f"{self.fresh('s')} = repr({e})")
            if r.random() < 0.3:
                self.body(small=True)
        if r.random() < 0.3:
            with self.block("else:"):
                self.body(small=True)
        if r.random() < 0.3:
            with self.block("finally:"):
                self.body(small=True)

    def stmt_escape(self):
        with self.block(f"if {self.bool_expr()}:"):
            self.emit(self.raising_stmt()[0])

    def stmt_closure(self):
        r = self.r
        name = self.fresh("fn")
        a = self.int_leaf()
        if r.random() < 0.5:
            body = r.choice([f"v * {a} + 1", f"(v + {a}) % 9", f"v - len([{a}])"])
            self.emit(f"{name} = lambda v, w=2: {body} + w")
        else:
            with self.block(f"def {name}(v, w={r.randint(0, 3)}):"):
                self.emit(f"return (v * w + {a}) % 50")
        self.closures.append(name)
        n = self.fresh("n")
        self.emit(f"{n} = {name}({self.int_expr()})")
        self.define(n, "int")
        if self.on("comprehensions") or self.on("containers"):
            lst = self.pick("list")
            if lst:
                out = self.fresh("lst")
                self.emit(r.choice([f"{out} = [{name}(v) for v in {lst}]", f"{out} = list(map({name}, {lst}))",
                                    f"{out} = sorted({lst}, key=lambda v: ({name}(v), v))"]))
                self.define(out, "list")

    def stmt_generator(self):
        r = self.r
        name = self.fresh("gen")
        a = self.int_leaf()
        with self.block(f"def {name}(k):"):
            self.emit(r.choice([f"for j in range(k):\n{'    ' * (self.indent + 1)}yield j * 2 + {a}",
                                f"j = 0\n{'    ' * self.indent}while j < k:\n{'    ' * (self.indent + 1)}yield j - {a}\n"
                                f"{'    ' * (self.indent + 1)}j += 1",
                                f"yield {a}\n{'    ' * self.indent}yield from range(k)"]))
        self.generators.append(name)
        r2 = r.randrange(4)
        n = self.fresh("n")
        if r2 == 0:
            with self.block(f"for {n} in {name}({r.randint(0, 3)}):"):
                self.define(n, "int")
                self.loop_depth += 1
                self.body(small=True)
                self.loop_depth -= 1
        elif r2 == 1:
            g = self.fresh("g")
            self.emit(f"{g} = {name}(3)")
            self.emit(f"{n} = next({g}) + next({g})")
            self.define(n, "int")
            lst = self.fresh("lst")
            self.emit(f"{lst} = list({g})")
            self.define(lst, "list")
        elif r2 == 2 and self.on("tensors") and self.on("helpers"):
            t = self.fresh("t")
            self.emit(f"{t} = sum(h_scaled({self.pick_tensor('full')}, {r.randint(1, 3)}))")
            self.define(t, "tensor:full")
        else:
            lst = self.fresh("lst")
            self.emit(f"{lst} = list({name}({r.randint(0, 4)}))")
            self.define(lst, "list")

    def stmt_class(self):
        r = self.r
        choice = r.randrange(3)
        name = self.fresh("C")
        obj = self.fresh("obj")
        n = self.fresh("n")
        if choice == 0:
            with self.block(f"class {name}:"):
                with self.block("def __init__(self, v):"):
                    self.emit("self.v = v")
                    self.emit("self.seen = []")
                with self.block("def add(self, k):"):
                    self.emit("self.v = self.v + k")
                    self.emit("self.seen.append(k)")
                    self.emit("return self")
                self.emit("@property")
                with self.block("def total(self):"):
                    self.emit("return self.v + len(self.seen)")
            self.emit(f"{obj} = {name}({self.int_expr()})")
            self.emit(f"{obj}.add({self.int_leaf()}).add({self.int_expr()})")
            self.emit(f"{n} = {obj}.total + {obj}.v")
            self.define(n, "int")
        elif choice == 1:
            self.emit("@dataclasses.dataclass")
            with self.block(f"class {name}:"):
                self.emit("x: int")
                self.emit("y: int = 3")
                with self.block("def norm(self):"):
                    self.emit("return abs(self.x) + abs(self.y)")
            self.emit(f"{obj} = {name}({self.int_expr()}, y={self.int_leaf()})")
            self.emit(f"{obj}.x += 1")
            self.emit(f"{n} = {obj}.norm() + ({obj} == {name}({obj}.x, {obj}.y))")
            self.define(n, "int")
        else:
            with self.block(f"class {name}:"):
                self.emit(f"scale = {r.randint(1, 3)}")
                with self.block("def __init__(self, k):"):
                    self.emit("self.k = k")
                with self.block("def __call__(self, t):"):
                    self.emit("return t * self.scale + self.k")
            self.emit(f"{obj} = {name}({self.int_leaf()})")
            if self.on("tensors"):
                t = self.fresh("t")
                self.emit(f"{t} = {obj}({self.pick_tensor('full')})")
                self.define(t, "tensor:full")
            else:
                self.emit(f"{n} = {obj}({self.int_expr()})")
                self.define(n, "int")

    def stmt_tensor_list(self):
        r = self.r
        acc, i, t = self.fresh("acc"), self.fresh("i"), self.fresh("t")
        full = self.pick_tensor("full")
        self.emit(f"{acc} = []")
        with self.block(f"for {i} in range({r.randint(1, 3)}):"):
            self.emit(f"{acc}.append({full} * {i} + {self.int_leaf()})")
        self.emit(r.choice([f"{t} = torch.stack({acc}).sum(0)", f"{t} = sum({acc})",
                            f"{t} = torch.cat({acc}).reshape(-1, {self.dim(1, full)})[:{self.dim(0, full)}]"]))
        self.define(t, "tensor:full")

    def stmt_tensor_groups(self):
        """Tensors handed back by torch inside containers other than a list of results (the
        family of a fake tensor frozen into the code: a dict from
        torch._C._group_tensors_by_device_and_dtype returned the trace's fake tensors)."""
        r = self.r
        acc, key, lists, idx, g = (self.fresh(n) for n in ("acc", "key", "lists", "idx", "g"))
        a, b = self.pick_tensor("full"), self.pick_tensor("full")
        self.emit(f"{acc} = {a} * 0")
        choice = r.randrange(3)
        if choice == 0:
            group = r.choice(["torch._C._group_tensors_by_device_and_dtype",
                              "torch.utils._foreach_utils._group_tensors_by_device_and_dtype"])
            with self.block(f"for {key}, ({lists}, {idx}) in {group}([[{a}, {b}.double(), {a} + 1]], "
                            f"{r.choice(['True', 'False'])}).items():"):
                with self.block(f"for {g} in {lists}[0]:"):
                    self.emit(f"{acc} = {acc} + {g}.to({acc}.dtype) * (len({idx}) + 1)")
        elif choice == 1:
            d = self.fresh("d")
            self.emit(f"{d} = dict(zip('xyz', torch.unbind(torch.stack([{a}, {b}, {a} * {b}]))))")
            with self.block(f"for {key} in sorted({d}):"):
                self.emit(f"{acc} = {acc} + {d}[{key}] * len({key})")
        else:
            self.emit(f"{acc} = {acc} + sum({{id({g}): {g} for {g} in ({a}, {b}, {a})}}.values())")
        self.define(acc, "tensor:full")

    # ---- families of past wrong results (issues 9 and 19)

    def stmt_nested(self):
        """A nested function closing over arguments and locals that breaks inside (print,
        .item(), a tensor branch), defined here and called now and later (also after the
        variables it closes over were reassigned)."""
        r = self.r
        name = self.fresh("inner")
        t_free = self.pick_tensor("full")
        other = self.pick_tensor() or t_free
        i_free = self.pick("int")
        lst = self.pick("list")
        rebinds = self.mutable("int") if r.random() < 0.2 else None
        with self.block(f"def {name}(u, k={r.randint(1, 3)}):"):
            if rebinds:
                self.emit(f"nonlocal {rebinds}")
            choice = r.randrange(5)
            if choice == 0:
                self.emit(f'print(f"{name}={{{t_free}.sum().item():.3f}} {{{i_free}}}")')
            elif choice == 1:
                with self.block(f"if {other}.sum() > {r.choice(['0', '0.5', '-1'])}:"):
                    self.emit(f"u = u + {t_free} * k")
            elif choice == 2:
                self.emit(f"k = k + int({other}.abs().sum().item() > {r.choice(['1', '2'])})")
            elif choice == 3:
                with self.block(f"if {t_free}.max() > 0.3:"):
                    self.emit(f"print('{name}', {i_free}, round({other}.sum().item(), 3))")
            else:
                helper = self.fresh("inner")
                with self.block(f"def {helper}(v):"):
                    with self.block(f"if v.sum() > {other}.sum():"):
                        self.emit(f"return v - {t_free} + {i_free}")
                    self.emit("return v + k")
                self.emit(f"u = {helper}(u) + {helper}({t_free})")
            if lst and self.on("containers") and r.random() < 0.3:
                with self.block(f"if {lst}:"):     # replaces an item: safe while a caller iterates it
                    self.emit(f"{lst}[-1] = k")
            if rebinds:
                self.emit(f"{rebinds} = ({rebinds} + k) % 50")
            self.emit(f"return u * k + {t_free} - {i_free}")
        self.define(name, "fn:nested")
        self.stmt_call_nested(name)

    def stmt_call_nested(self, name=None):
        r = self.r
        name = name or self.pick("fn:nested")
        if name is None:
            return self.stmt_define()
        t = self.fresh("t")
        arg = self.tensor_expr("full", 1)
        if r.random() < 0.3 and self.depth < self.MAX_DEPTH:
            self.emit(f"{t} = {arg}")
            i = self.fresh("i")
            with self.block(f"for {i} in range({r.randint(1, 3)}):"):
                self.emit(f"{t} = {name}({t}, k={i} + 1)")
        else:
            kw = f", k={self.int_leaf()} % 4" if r.random() < 0.3 else ""
            self.emit(f"{t} = {name}({arg}{kw})")
        self.define(t, "tensor:full")

    def effect_stmt(self):
        r = self.r
        options = [f"G_LIST.append({self.int_expr(1)})", f"G_DICT[{self.str_leaf()}] = {self.int_expr(1)}",
                   f"G_OBJ.a = G_OBJ.a + {self.int_leaf()}", f"G_OBJ.hist.append({self.int_leaf()})"]
        if self.on("inputs") and "items" not in self.frozen:
            options.append(f"items.append({self.int_leaf()})")
        t = self.pick_tensor("full")
        if self.on("inplace") and t in ("x0", "x1") and not self.on("grads"):
            options.append(f"{t}.add_(1)")
        if self.on("inplace") and self.on("tensors"):
            options.append(f"G_MOD.steps.add_({self.int_leaf()})")     # module state changed in place
        return r.choice(options)

    def stmt_raise_after_effects(self):
        """Side effects on state that exists before the call, then an exception eager raises too."""
        r = self.r
        for _ in range(r.randint(1, 3)):
            self.emit(self.effect_stmt())
        t = self.pick_tensor()
        raising = [f"{self.fresh('t')} = {t} + None", 'raise ValueError("gen after effects")',
                   f"{self.fresh('n')} = int('x' + str({self.int_leaf()}))",
                   f"{self.fresh('n')} = [1, 2][{self.int_leaf()} % 2 + 2]",
                   f"{self.fresh('n')} = {self.int_leaf()} // 0", f"G_OBJ.missing_method({self.int_leaf()})",
                   # an op in the graph that fails at run time, for some data only
                   f"{self.fresh('t')} = torch.index_select({t}.flatten(), 0, "
                   f"({t}.abs().sum() * {r.choice([1, 3])}).long().reshape(1)) * 2"]
        stmt = r.choice(raising)
        cond = r.choice([self.bool_expr(), f"{self.pick_tensor()}.sum() > {r.choice(['0', '1', '-1'])}",
                         "True"])
        if cond == "True" and self.depth == 0:
            cond = self.bool_expr()          # keep the rest of the program reachable
        with self.block(f"if {cond}:"):
            self.emit(stmt)

    def stmt_try_in_loop(self):
        """A loop whose body breaks inside ``try`` under a method call (``acc.append(h(...))``)
        and sometimes raises into the handler; the next iteration comes back to the same call."""
        r = self.r
        acc, i, e = self.fresh("acc"), self.fresh("i"), self.fresh("e")
        self.emit(f"{acc} = []")
        with self.block(f"for {i} in range({r.randint(2, 5)}):"):
            with self.block("try:"):
                call = f"h_check_loud({i} + {self.int_leaf()})"
                t = self.pick_tensor()
                self.emit(r.choice([f"{acc}.append({call})", f"{acc}.append({call} * {t}.shape[0])",
                                    f"{acc}.insert(0, ({call}, {i}))", f"G_OBJ.hist.append({call})"]))
            with self.block(f"except ValueError as {e}:"):
                self.emit(r.choice([f"{acc}.append(str({e}))", f"{acc}.append({i})", "continue",
                                    f"print('caught', {i})"]))
        self.emit(f"G_OBJ.hist.append(repr({acc}))")

    def stmt_tensor_try(self):
        """try/except where the raise depends on a tensor condition."""
        r = self.r
        t = self.pick_tensor()
        exc = r.choice(["ValueError", "KeyError", "RuntimeError"])
        with self.block("try:"):
            if r.random() < 0.4:
                self.emit(self.effect_stmt())
            if r.random() < 0.3:
                self.emit(f"assert {t}.sum() > {r.choice(['-2', '0'])}, 'gen assert'")
            with self.block(f"if {t}.min() < {r.choice(['-1.0', '0', '-0.5'])}:"):
                self.emit(f"raise {exc}('gen data')")
            self.emit(f"{self.fresh('t')} = torch.tanh({self.pick_tensor()})")
            if r.random() < 0.3:
                self.body(small=True)
        caught = r.choice([exc, "Exception", f"({exc}, AssertionError)", exc])
        e = self.fresh("e")
        with self.block(f"except {caught} as {e}:"):
            self.emit(r.choice([f"print('handler ran', type({e}).__name__)", f"G_LIST.append(len(str({e})))",
                                f"G_OBJ.hist.append(type({e}).__name__)"]))
            if r.random() < 0.3:
                self.body(small=True)
        if r.random() < 0.3:
            with self.block("else:"):
                self.emit("print('no error')")
        if r.random() < 0.3:
            with self.block("finally:"):
                self.emit(r.choice(["G_OBJ.a += 1", "print('finally')"]))

    def stmt_inplace(self):
        """In-place updates of tensor arguments (or of views of them), also in a loop."""
        r = self.r
        targets = [n for n in ("x0", "x1") if n in self.visible()] + self.visible("tensor:full")
        target = r.choice(targets)
        kind = self.kind_of(target)
        shape = kind.split(":")[1]
        smaller = {"full": ["full", "row", "scalar"], "row": ["row", "scalar"], "scalar": ["scalar"]}[shape]
        other = self.tensor_expr(r.choice(smaller), 1)
        v0 = self.fresh("s")
        options = [f"{target}.add_({other})", f"{target}.mul_(0.5)", f"{target}.clamp_(-2.0, 2.0)",
                   f"{target}.sub_({target}.mean())", f"{target}.copy_(({target} * 0.5 + {other}).tanh())",
                   f"{target}.data.mul_(0.5)", f"{target}.data -= {other} * 0.25",     # through .data
                   f"{target} += {other}", f"{target} *= 0.5",    # augmented assignment: in place
                   f"torch.nn.functional.relu({target}, inplace=True)",
                   [f"{v0} = f'{{{target}}}'", f"{target}.mul_(2)", f"G_LIST.append({v0})"]]   # text, then a write
        if shape == "full" and target in ("x0", "x1") and self.kind_of("x1") == "tensor:full":
            # written by an augmented assignment, then the other argument read: wrong when a
            # graph traced for two tensors runs on one passed twice (_SameTensorTwice)
            other_arg = "x1" if target == "x0" else "x0"
            options.append([f"{target} += {other_arg} * 0.5", f"{target} = {target} + {other_arg}"])
        if shape == "full":
            v = self.fresh("v")
            options += [f"{target}[{self.int_leaf()} % {self.dim(0, target)}] += 1",
                        [f"{v} = {target}[0]", f"{v}.add_(2)"],     # through a view
                        f"{target}[{target} > 1.0] = 0.0"]
        stmt = r.choice(options)
        lines = stmt if isinstance(stmt, list) else [stmt]
        if r.random() < 0.4 and self.depth < self.MAX_DEPTH:
            i = self.fresh("i")
            with self.block(f"for {i} in range({r.randint(1, 3)}):"):
                for line in lines:
                    self.emit(line)
                if r.random() < 0.4:
                    with self.block(f"if {target}.sum() > {i}:"):
                        self.emit(r.choice(["break", "continue", f"print('step', {i})"]))
        else:
            for line in lines:
                self.emit(line)

    def stmt_data_update(self):
        """An input that requires grad read or changed through ``.data`` (EMA and manual SGD
        updates, weight clipping), before or after the autograd graph used it: backward sees the
        changed values where eager's does. Not after, under AOTAutograd (``functional``): what a
        compiled backward keeps of an input (a mask of where ``clamp`` clipped, not the input as
        eager's) cannot see a later write that autograd does not track either (torch.compile
        fails to compile it)."""
        r = self.r
        target = r.choice([n for n in ("x0", "w") if n in self.visible()])
        other = self.tensor_expr("full", 1)
        t = self.fresh("t")
        stmt = r.choice([f"{target}.data.mul_(0.9).add_({other}.detach(), alpha=0.1)",
                         f"{target}.data -= 0.1 * {target}.data.sign()",
                         f"{target}.data.clamp_(-1.0, 1.0)",
                         [f"{t} = {target}.data * 2 + {other}", f"{t}.add_(1)"]])
        for line in (stmt if isinstance(stmt, list) else [stmt]):
            self.emit(line)
        if isinstance(stmt, list):
            self.define(t, "tensor:full")

    def kind_of(self, name):
        for scope in reversed(self.scopes):
            if name in scope.names:
                return scope.names[name]
        raise KeyError(name)

    def mask_expr(self):
        """A 0-dim tensor computed through an op whose output size depends on data."""
        t = self.pick_tensor("full") or self.pick_tensor()
        return "(" + self.r.choice([
            f"{t}[{t} > 0].sum()", f"torch.masked_select({t}, {t} > 0.2).sum() * 2",
            f"{t}.nonzero().shape[0] * 0.5 + {t}.sum()", f"torch.unique({t}.round()).sum()",
            f"{t}.flatten().repeat_interleave(({t}.flatten().abs() * 2).long()).sum()",
            f"{t}[{t}.abs() > {t}.abs().mean()].sum()"]) + ")"

    def stmt_mask_assign(self):
        r = self.r
        c = self.fresh("t")
        self.emit(f"{c} = {self.tensor_expr('full', 1)}.clone()")
        self.emit(r.choice([f"{c}[{c} > 0] = {self.tensor_expr('scalar', 1)}", f"{c}[{c} < 0] *= 2",
                            f"{c}[{c}.abs() > 0.5] = 0.0"]))
        self.define(c, "tensor:full")

    def stmt_mode_block(self):
        # Grad mode and autocast blocks, a break inside some: resumed inside the block, the
        # code after it starts by leaving the block (a graph of nothing but that, once).
        r = self.r
        t = self.fresh("t")
        with self.block(r.choice(["with torch.no_grad():", "with torch.set_grad_enabled(False):",
                                  "with torch.autocast('cpu', enabled=False):",
                                  "with torch.autocast('cpu', dtype=torch.bfloat16):"])):
            self.emit(f"{t} = {self.tensor_expr('full')}")
            if r.random() < 0.4:
                self.emit(f"print('in the block', {t}.requires_grad)")
                if r.random() < 0.5:
                    # Work after the break, still in the block: autocast casts the product,
                    # no_grad leaves it without history.
                    self.emit(f"{t} = {t} + ({t} @ {t}.transpose(-1, -2)).sum(-1, keepdim=True)")
        self.define(t, "tensor:full")
        if r.random() < 0.5:
            # What the block left (grad mode and autocast as before it), printed: compared.
            m = self.fresh("t")
            self.emit(f"{m} = {t} * 2")
            self.define(m, "tensor:full")
            self.emit("print('after the block', torch.is_grad_enabled(), torch.is_autocast_enabled('cpu'))")
        if r.random() < 0.3:
            d = self.fresh("t")
            self.emit(f"{d} = {self.tensor_expr('full', 1)}.detach() * 2")
            self.define(d, "tensor:full")

    # one code object, many functions: module-level decorators, decorated functions and
    # methods, closure factories (written once per program, before `generated`)
    def write_prelude(self):
        r = self.r
        S = self.shape
        out = self.prelude
        self.shared_fns, self.shared_mods, self.shared_blocks = [], [], False
        for d in range(r.randint(1, 2)):
            deco = f"deco{d}"
            kind = r.choice(["plain", "kwpop", "tryfinally", "break", "lambda", "eager", "item"])
            out.append(f"def {deco}(func):")
            if r.random() < 0.7:
                out.append("    @functools.wraps(func)")
            out.append("    def wrapper(*args, **kwargs):")
            body = []
            if kind == "kwpop":
                body.append("scale = kwargs.pop('scale', 1)")
            else:
                body.append(f"scale = {r.randint(1, 3)}")
            if kind == "break":
                body += ["if args[0].sum() > 0:", "    print('deco', func.__name__, scale)"]
            if kind == "item":
                body += ["scale = scale + int(args[0].abs().sum().item() > 2)"]
            if kind == "lambda":
                body += ["double = lambda u: u * scale", "args = (double(args[0]),) + args[1:]"]
            if kind == "eager":
                body += ["scale = scale + len(locals()) - 2"]     # a frame-reading builtin: runs eagerly
            if kind == "tryfinally":
                body += ["try:", "    out = func(*args, **kwargs)", "finally:",
                         "    G_LIST.append(len(func.__name__))"]
            else:
                body += ["out = func(*args, **kwargs)"]
            body += ["return out * scale"]
            out += ["        " + line for line in body]
            out += ["    return wrapper", ""]
            for k in range(r.randint(2, 3)):
                fn = f"p{d}_{k}"
                out.append(f"@{deco}")
                out.append(f"def {fn}(t, k={r.randint(0, 3)}):")
                out.append("    " + r.choice([f"return t * k + {k}", f"return torch.relu(t) - k * {k + 1}",
                                                f"return t.sin() * {k + 2} + k", f"return (t + k) * {k + 1}"]))
                out.append("")
                self.shared_fns.append((fn, kind == "kwpop"))
        # decorated forward methods of two module classes
        if r.random() < 0.6:
            wbody = (["if t.mean() > self.c * 0.1:", "    t = t + self.c"] if r.random() < 0.5
                     else ["t = t * 1"])
            out += ["def mdeco(fn):", "    @functools.wraps(fn)", "    def wrapper(self, t):"]
            out += ["        " + line for line in wbody]
            out += ["        return fn(self, t) * 2", "    return wrapper", ""]
            for m in range(2):
                out += [f"class Mod{m}(torch.nn.Module):", "    def __init__(self, c):",
                        "        super().__init__()", "        self.c = c",
                        "    @mdeco", "    def forward(self, t):",
                        "        " + ["return t + self.c", "return t * self.c - 1"][m], ""]
                out.append(f"MOD{m} = Mod{m}({r.randint(1, 3)})")
                self.shared_mods.append(f"MOD{m}")
            out.append("")
        # modules of one class built differently (how many submodules, an activation or not, a
        # constant): a block traced for one must not be copied for another it differs from
        # (trace/nn/blocks.py; torchvision's Conv2dNormActivation with and without an activation)
        if r.random() < 0.7:
            out += ["class Step(torch.nn.Module):", "    def __init__(self, k):", "        super().__init__()",
                    "        self.k = k", "    def forward(self, t):", "        return t * self.k + 1", "",
                    "class Blk(torch.nn.Sequential):", "    def __init__(self, n, act, k):",
                    "        super().__init__(*([Step(k + i) for i in range(n)] + "
                    "([torch.nn.ReLU()] if act else [])))", "",
                    "class Stack(torch.nn.Module):", "    def __init__(self, blocks):", "        super().__init__()",
                    "        self.blocks = torch.nn.ModuleList(blocks)", "    def forward(self, t):",
                    "        return self.blocks[-1](t) - self.blocks[0](t) * 0.5", ""]
            specs = [(r.randint(1, 3), r.random() < 0.5, r.choice([1, 1, 2])) for _ in range(r.randint(3, 5))]
            out.append("BLKS = torch.nn.ModuleList([" + ", ".join(f"Blk({n}, {a}, {k})" for n, a, k in specs) + "])")
            out.append("STACKS = [Stack([Blk(1, True, 1)]), Stack([Blk(1, True, 1), Blk(2, False, 1)])]")
            out.append("")
            self.shared_blocks = True
        # a closure factory: one inner code object, one function object per call
        out += ["def make_scaler(s, off=0):", "    def inner(t, k=s):"]
        if r.random() < 0.5:
            out += ["        if t.sum() > s:", "            print('scaler', s, off)"]
        out += ["        return t * k + off", "    return inner", ""]

    def stmt_shared(self):
        r = self.r
        t = self.fresh("t")
        arg = self.tensor_expr("full", 1)
        choice = r.randrange(7)
        if choice == 6 and self.shared_blocks:
            b = self.fresh("b")
            self.emit(f"{t} = {arg} * 0.5")
            kind = r.randrange(3)
            if kind == 0:
                with self.block(f"for {b} in BLKS:"):
                    self.emit(f"{t} = {b}({t}) * 0.25")
            elif kind == 1:
                self.emit(f"{t} = BLKS[-1]({t}) + BLKS[0]({t}) + BLKS[{r.randint(1, 2)}]({t} * 2)")
            else:
                with self.block(f"for {b} in STACKS:"):
                    self.emit(f"{t} = {b}({t}) * 0.5")
        elif choice <= 1 and self.shared_fns:
            fn, takes_scale = r.choice(self.shared_fns)
            extra = r.choice(["", f", k={self.int_leaf()} % 3", f", {r.randint(0, 2)}"])
            if takes_scale and r.random() < 0.5:
                extra += ", scale=2"
            self.emit(f"{t} = {fn}({arg}{extra})")
            if r.random() < 0.5:
                fn2, _ = r.choice(self.shared_fns)
                self.emit(f"{t} = {t} + {fn2}({t})")
        elif choice == 2 and self.shared_mods:
            self.emit(f"{t} = {r.choice(self.shared_mods)}({arg}) + {r.choice(self.shared_mods)}({arg})")
        elif choice == 3:
            a, b = self.fresh("sc"), self.fresh("sc")
            self.emit(f"{a}, {b} = make_scaler({self.int_leaf()} % 3), make_scaler(2, off={self.int_leaf()})")
            self.emit(f"{t} = {a}({arg}) + {b}({arg}) - {a}({arg}, k=1)")
        elif choice == 4:
            fs = self.fresh("fs")
            if r.random() < 0.5:
                self.emit(f"{fs} = [lambda u, j=j: u * j for j in range({r.randint(1, 3)})]")
            else:
                j = self.fresh("j")
                self.emit(f"{fs} = []")
                with self.block(f"for {j} in range({r.randint(1, 3)}):"):
                    self.emit(f"{fs}.append(lambda u: u + {j})")      # late binding: all see the last j
            self.emit(f"{t} = {arg}")
            f = self.fresh("f")
            with self.block(f"for {f} in {fs}:"):
                self.emit(f"{t} = {f}({t})")
        else:
            fns = [f for f, _ in self.shared_fns[:2]] or ["make_scaler(2)"]
            sc = self.fresh("fs")
            self.emit(f"{sc} = [{', '.join(fns)}, make_scaler(3)]")
            self.emit(f"{t} = {arg}")
            i = self.fresh("i")
            with self.block(f"for {i}, g in enumerate({sc}):"):
                self.emit(f"{t} = g({t}) * 0.5 + {i}")
        self.define(t, "tensor:full")

    def statements(self, top):
        """(weight, statement) of the enabled statement kinds."""
        out = [(3, self.stmt_update)]
        if top:
            out.append((5, self.stmt_define))
        if self.depth < self.MAX_DEPTH:
            if self.on("if"):
                out.append((2, self.stmt_if))
            if self.on("for"):
                out.append((2, self.stmt_for))
            if self.on("while"):
                out.append((1, self.stmt_while))
            if self.on("exceptions"):
                out.append((2, self.stmt_try))
        if self.on("unpack"):
            out.append((1, self.stmt_unpack))
        if self.on("print"):
            out.append((2, self.stmt_print))
        if self.on("globals"):
            out.append((2, self.stmt_global))
        if self.on("inputs"):
            out.append((1, self.stmt_input))
        if self.on("stale"):
            out.append((1, self.stmt_stale))
        if self.on("moving"):
            out.append((3, self.stmt_moving))
        if top and self.on("closures"):
            out.append((1, self.stmt_closure))
        if top and self.on("generators"):
            out.append((2, self.stmt_generator))
        if top and self.on("classes"):
            out.append((2, self.stmt_class))
        if top and self.on("tensors"):
            out.append((1, self.stmt_tensor_list))
            out.append((1, self.stmt_tensor_groups))
        if self.on("nested"):
            if top:
                out.append((2, self.stmt_nested))
            if self.visible("fn:nested"):
                out.append((2, self.stmt_call_nested))
        if self.on("raising"):
            out.append((1, self.stmt_raise_after_effects))
            if self.depth < self.MAX_DEPTH:
                out.append((2, self.stmt_tensor_try))
                out.append((1, self.stmt_try_in_loop))
        if self.on("inplace"):
            out.append((3, self.stmt_inplace))
        if self.on("masks"):
            out.append((1, self.stmt_mask_assign))
        if self.on("grads") and self.depth < self.MAX_DEPTH:
            out.append((1, self.stmt_mode_block))
        if self.on("grads") and not self.on("functional"):
            out.append((1, self.stmt_data_update))
        if self.on("shared"):
            out.append((3, self.stmt_shared))
        return out

    def one_statement(self):
        table = self.statements(self.depth == 0)
        fns = [fn for _, fn in table]
        weights = [w for w, _ in table]
        self.r.choices(fns, weights)[0]()

    def body(self, small=False):
        for _ in range(self.r.randint(1, 2 if small else 3)):
            self.one_statement()

    def program(self):
        r = self.r
        self.shape = (r.randint(1, 4), r.randint(1, 4))
        self.prelude = []
        self.shared_fns, self.shared_mods, self.shared_blocks = [], [], False
        if self.on("shared"):
            self.write_prelude()
        params = ["x0", "x1", "items", "n"]
        self.define("x0", "tensor:full")
        self.define("x1", "tensor:full" if r.random() < 0.7 else "tensor:row")
        self.define("items", "list")
        self.define("n", "int")
        self.define("label", "str")
        grads = self.on("grads")
        g = self.tensor_rng
        args = [torch.randn(self.shape, generator=g, requires_grad=grads),
                torch.randn(self.shape if self.scopes[0].names["x1"] == "tensor:full" else self.shape[1:],
                            generator=g, requires_grad=grads),
                [r.randint(-3, 6) for _ in range(r.randint(1, 4))], r.randint(-2, 5)]
        if grads:    # a parameter that may or may not reach the loss
            params.append("w")
            self.define("w", "tensor:full")
            args.append(torch.randn(self.shape, generator=g, requires_grad=True))
        kwargs = {"label": r.choice(WORDS)} if r.random() < 0.5 else {}
        if not self.on("inputs"):
            self.frozen.append("items")   # not mutated unless the feature is on (it is still read)
        if (self.on("containers") or self.on("comprehensions")) and r.random() < 0.5:
            self.emit(f"d0 = {self.dict_expr()}")
            self.define("d0", "dict")
        if self.on("grads") and self.on("functional") and r.random() < 0.3:
            self.stmt_data_update()     # before the autograd graph reads the input
        for _ in range(r.randint(4, 12)):
            self.one_statement()
        if self.on("exceptions") and r.random() < 0.15:
            self.stmt_escape()
        result = self.fresh("t")
        self.emit(f"{result} = {self.tensor_expr('full')}")
        self.define(result, "tensor:full")
        outs = [result]
        candidates = [n for n, k in self.visible_kinds().items() if n != "items" and not k.startswith("fn:")]
        outs += r.sample(candidates, min(len(candidates), r.randint(1, 4)))
        header = [f"def generated({', '.join(params)}, *, label='ab'):"]
        if self.uses_counter:
            header.append("    global COUNTER")
        src = "\n".join(self.prelude + header + self.lines + [f"    return ({', '.join(outs)},)"]) + "\n"
        return src, args, kwargs

    def visible_kinds(self):
        out = {}
        for scope in self.scopes:
            out.update(scope.names)
        return dict(sorted(out.items()))


# ---- building, validating and comparing programs

ACCEPTED_ESCAPES = (KeyError, ValueError, IndexError)
# Programs of the "raising" family escape with these too (eager raises them; so must compiled).
RAISING_ESCAPES = ACCEPTED_ESCAPES + (TypeError, ZeroDivisionError, AttributeError, AssertionError)


class _StatefulModule(torch.nn.Module):
    """G_MOD of the ``moving`` family: its forward reads what the calls change (MOVING)."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.tensor(1.5))
        self.shift = 0.25
        self.mode = "add"
        self.register_buffer("steps", torch.zeros(2))   # written in place by effect statements

    def forward(self, x):
        # State changed by forward itself and read back: a counter, and a buffer registered
        # anew every third call (a cache grown in forward).
        self.calls = self.__dict__.get("calls", 0) + 1
        if self.calls % 3 == 1:
            self.register_buffer("cache", x.detach().sum() + self.calls, persistent=False)
        cache = self.cache if hasattr(self, "cache") else 0.0
        y = x * self.w + cache * 0.01 + vars(self)["calls"] * 0.001
        y = y + self.shift if self.mode == "add" else y * self.shift
        if self.training:
            y = y - 1
        return self.adjust(y) + self.gain

    def adjust(self, y, k=0.5):      # replaced on the class, or its default changed, on some calls
        return y + k

    @property
    def gain(self):                  # another property on the program's subclass on some calls
        return 0.0


def _adjust_times(self, y):
    return y * 3


def _h_add_other(a, b=2, *rest, scale=1):
    return (a - b + sum(rest)) * scale


_H_ADD_CODE = h_add.__code__


# The state each input of a ``moving`` program sets before its call (index = the input's):
# (G_OBJ.a, .scale, .on, .tags, .extra or None for none, G_MOD.training, .mode, .shift,
#  a forward hook adding 1, G_MOD.w replaced by a new parameter of this value or None).
MOVING = [(0, 1.0, True, ["a"], None, True, "add", 0.25, False, None),
          (0, 1.0, True, ["a"], None, True, "add", 0.25, False, None),
          (3, 0.5, False, [], None, False, "add", 0.25, False, None),
          (0, 1.0, True, ["a"], None, True, "mul", 2.0, False, None),
          (0, 1.0, True, ["a", "b"], 7, True, "add", 0.25, True, None),
          (-2, 2.0, True, ["a"], None, True, "add", 0.25, False, 0.5)]
MOVING_CALL_ORDER = (0, 1, 0, 2, 3, 4, 0, 5, 4, 0)


def _set_moving(ns, variant):
    a, scale, on, tags, extra, training, mode, shift, hook, new_w = MOVING[variant]
    obj, mod = ns["G_OBJ"], ns["G_MOD"]
    obj.a, obj.scale, obj.on, obj.tags = a, scale, on, list(tags)
    if extra is not None:
        obj.extra = extra
    if variant % 2:
        obj.flag = variant   # a second attribute present on other calls than ``extra``
    if variant in (1, 4):
        type(mod).adjust = _adjust_times       # a method replaced on the class
    else:
        type(mod).__dict__.get("adjust") and delattr(type(mod), "adjust")   # the base's again
    # Functions changed in place: defaults (of a method and of a helper), a helper's code (as
    # IPython's autoreload does), a property on the class.
    _StatefulModule.adjust.__defaults__ = (1.5,) if variant in (2, 5) else (0.5,)
    h_mix.__defaults__ = (2.0,) if variant in (3, 5) else (1.0,)
    h_mix.__kwdefaults__ = {"shift": 1} if variant == 2 else {"shift": 0}
    h_add.__code__ = _h_add_other.__code__ if variant == 4 else _H_ADD_CODE
    if variant == 3:
        type(mod).gain = property(lambda self: 2.0)
    else:
        type(mod).__dict__.get("gain") and delattr(type(mod), "gain")
    mod.train(training)
    mod.mode, mod.shift = mode, shift
    if ns["G_HOOK"] is not None:
        ns["G_HOOK"].remove()
        ns["G_HOOK"] = None
    if hook:
        ns["G_HOOK"] = mod.register_forward_hook(lambda m, args, out: out + 1)
    mod.w = ns["G_W"] if new_w is None else torch.nn.Parameter(torch.tensor(new_w))
    # What forward changes itself: its counter starts from the input's number; its cache is
    # gone, or (input 2) one set here.
    mod.calls = variant
    mod._buffers.pop("cache", None)
    if variant == 2:
        mod.register_buffer("cache", torch.tensor(5.0), persistent=False)


def _fresh_state(ns, variant=0):
    ns["G_LIST"][:] = [1, 2]
    ns["G_DICT"].clear()
    ns["G_DICT"].update({"ab": 1})
    ns["COUNTER"] = 0
    ns["G_OBJ"].__dict__.clear()
    ns["G_OBJ"].a = 0
    ns["G_OBJ"].hist = []
    ns["G_IDS"].clear()
    ns["G_LOGGED"].clear()
    ns["G_MOD"].steps.zero_()
    _set_moving(ns, variant)


class _RecordList(logging.Handler):
    def __init__(self, records):
        super().__init__()
        self.records = records

    def emit(self, record):
        self.records.append((record.getMessage(), record.levelname, record.lineno, record.funcName))


def _namespace(name):
    ns = {"__name__": name, "torch": torch, "math": math, "dataclasses": dataclasses, "functools": functools,
          "G_LIST": [], "G_DICT": {}, "COUNTER": 0, "G_OBJ": types.SimpleNamespace(), "G_IDS": {},
          "logging": logging, "G_LOGGED": [], "G_HOOK": None,
          # a class of its own: _set_moving replaces a method on it
          "G_MOD": type("StatefulModule", (_StatefulModule,), {})()}
    ns["G_W"] = ns["G_MOD"].w
    # Outside logging's registry (each program its own), writing INFO and above into G_LOGGED.
    ns["G_LOG"] = logging.Logger(f"bytegraph_generated.{name}", logging.INFO)
    ns["G_LOG"].addHandler(_RecordList(ns["G_LOGGED"]))
    ns.update(HELPERS)
    _fresh_state(ns)
    return ns


def build(src, filename):
    linecache.cache[filename] = (len(src), None, src.splitlines(True), filename)
    ns = _namespace(filename)
    exec(compile(src, filename, "exec"), ns)
    return ns["generated"], ns


def _observe(ns, args):
    """What a run leaves behind: module state, and the .grad of every input tensor that
    requires grad (None where the loss did not reach it)."""
    # G_IDS by which object each key is the id of (the ids themselves differ between runs)
    owners = {id(ns[k]): k for k in ("G_OBJ", "G_LIST", "G_DICT")}
    ids = sorted((owners.get(k, repr(k)), v) for k, v in ns["G_IDS"].items())
    state = (list(ns["G_LIST"]), dict(ns["G_DICT"]), ns["COUNTER"], ns["G_OBJ"].a, list(ns["G_OBJ"].hist), ids,
             list(ns["G_LOGGED"]), ns["G_MOD"].__dict__.get("calls"), ns["G_MOD"].steps.tolist())
    grads = [a.grad for a in args if isinstance(a, torch.Tensor) and a.requires_grad]
    return state + (grads,)


class _SameTensorTwice(list):
    """Arguments whose second tensor is the first one."""


def _maker(ns, args, kwargs, variant=0):
    def make():
        _fresh_state(ns, variant)
        fresh_args = _clone(list(args))
        if isinstance(args, _SameTensorTwice):
            fresh_args[1] = fresh_args[0]
        return fresh_args, _clone(kwargs), lambda: _observe(ns, fresh_args)
    return make


def _clone(value):
    if isinstance(value, torch.Tensor):
        return value.detach().clone().requires_grad_(value.requires_grad)
    if type(value) is list:
        return [_clone(v) for v in value]
    if type(value) is dict:
        return {k: _clone(v) for k, v in value.items()}
    return value


def _vary(value, r, keep_ints):
    """Inputs of the same structure and shapes with other values (ints and list lengths too
    unless ``keep_ints``): a compiled function must not keep anything of an earlier call."""
    if isinstance(value, torch.Tensor):
        g = torch.Generator().manual_seed(r.randrange(2 ** 31))
        new = torch.randn(value.shape, generator=g) * r.choice([0.5, 1.0, 2.0])
        return new.requires_grad_(value.requires_grad)
    if type(value) is list:
        length = len(value) if keep_ints else r.randint(1, 4)
        return [r.randint(-3, 6) for _ in range(length)]
    if type(value) is dict:
        return {k: (r.choice(WORDS) if k == "label" and not keep_ints else v) for k, v in value.items()}
    if type(value) is int and not keep_ints:
        return r.randint(-2, 5)
    return value


def _new_tensor_values(value, r):
    """The same inputs with other tensor values (same shapes and ``requires_grad``), ints, lists
    and dicts as they were: a call that runs the graphs of the first call again (``_vary`` changes
    the lists' ints too, which are guarded, so its inputs compile other graphs)."""
    if isinstance(value, torch.Tensor):
        return _vary(value, r, True)
    return _clone(value)


def _reshaped(value, shape, r):
    """``value`` with its tensors remade in ``shape`` (the program's full shape; a tensor of one
    dimension gets its last size), values and other inputs as they were made."""
    if isinstance(value, torch.Tensor):
        g = torch.Generator().manual_seed(r.randrange(2 ** 31))
        new = torch.randn(shape[2 - value.dim():], generator=g)
        return new.requires_grad_(value.requires_grad)
    return value


def other_shapes(args, kwargs, r):
    """Inputs for the ``shapes`` family: the first call's structure with other sizes (one more
    row, sizes 1, both larger), each a (args, kwargs)."""
    full = args[0].shape
    return [([_reshaped(a, shape, r) for a in args], kwargs)
            for shape in ((full[0] + 1, full[1]), (1, 1), (full[0] + 3, full[1] + 2))]


# Compiled calls of a ``shapes`` program: the first inputs, other values, other ints, then
# three other shapes (a second size makes sizes dynamic), and the first shape again.
SHAPES_CALL_ORDER = (0, 1, 0, 2, 3, 4, 5, 3, 0)


def with_backward(fn):
    """``fn`` followed by ``backward()`` of the sum of its outputs that require grad."""
    def run(*args, **kwargs):
        result = fn(*args, **kwargs)
        parts = [v.sum() for v in result if isinstance(v, torch.Tensor) and v.requires_grad]
        if parts:
            sum(parts).backward()
        return result
    run.__wrapped_generated__ = fn
    return run


def functionalized(feature_set, seed):
    """Does this seed run through AOTAutograd (which functionalizes), not the graph as it is?
    Every other seed of the sets about gradients and in-place updates."""
    return feature_set in ("grads", "inplace") and seed % 2 == 0


def make_program(feature_set, seed):
    """(fn, namespace, source, inputs) of the first valid program for this seed, where
    ``inputs`` is a list of (args, kwargs): the first call's inputs, then the same shapes
    with other values, then other ints and list lengths as well (the same tensor twice for
    ``inplace``, other shapes for ``shapes``), and last, except for ``moving``, the first call's
    inputs with only the tensors' values new."""
    features = FEATURE_SETS[feature_set] | ({"functional"} if functionalized(feature_set, seed) else set())
    accepted = RAISING_ESCAPES if "raising" in features else ACCEPTED_ESCAPES
    for attempt in range(20):
        sub_seed = seed * 1000 + attempt
        src, args, kwargs = ProgramGen(sub_seed, features).program()
        filename = f"<generated {feature_set} {seed}.{attempt}>"
        try:
            fn, ns = build(src, filename)
        except SyntaxError as e:
            raise AssertionError(f"generator wrote invalid syntax:\n{src}") from e
        if "grads" in features:
            fn = with_backward(fn)
        _, exc, _, _, _ = run_observed(fn, _maker(ns, args, kwargs))
        if exc is None or issubclass(exc[0], accepted):
            r = random.Random(sub_seed + 7)
            same_ints = ([_vary(a, r, True) for a in args], _vary(kwargs, r, True))
            other_ints = ([_vary(a, r, False) for a in args], _vary(kwargs, r, False))
            inputs = [(args, kwargs), same_ints, other_ints]
            if "inplace" in features and args[0].shape == args[1].shape:
                # the same tensor as x0 and x1: a graph traced for two tensors must not run on it
                inputs.append((_SameTensorTwice(_vary(a, r, True) for a in args), _vary(kwargs, r, True)))
            if "shapes" in features:
                inputs += other_shapes(args, kwargs, r)
            if "moving" in features:   # the first inputs again, under other state (MOVING)
                inputs += [(args, kwargs)] * (len(MOVING) - len(inputs))
            else:
                # Last: only the tensors' values new (rerun_call_order calls it second).
                r = random.Random(sub_seed + 11)
                inputs.append(([_new_tensor_values(a, r) for a in args], _clone(kwargs)))
            return fn, ns, src, inputs
    raise AssertionError(f"no valid program for seed {seed} in 20 attempts; last:\n{src}\n{exc}")


CALL_ORDER = (0, 1, 0, 2)   # which inputs each compiled call gets


def rerun_call_order(inputs):
    """The compiled calls of a program whose last inputs differ from the first in tensor values
    only: those second (a graph answering its first call's outputs again fails there), then
    compare's usual order over the others."""
    others = len(inputs) - 1
    return [0, others] + ([1, 0, 2, 3][:others] if others >= 3 else [0])
# The reasons a frame of a generated program runs eagerly whole by design: one that reads its own
# locals (locals()/vars(), in the "shared" decorators) is not split, as a resume function would
# miss locals (test_fallback.py's test_function_reading_its_locals_after_a_break_runs_eagerly_whole).
WHOLE_FRAME_FALLBACKS = ("it reads the running frame's locals",)


def compare(fn, makers, rtol=1e-4, atol=1e-5, backend=None, call_order=None, may_compile_nothing=False):
    """check_program over several inputs (``makers[i]()`` makes the i-th; compiled calls take
    them in ``call_order``; fullgraph=False); True when the first call compiled the function
    as one graph with no break or fallback. A ``with_backward`` wrapper is compiled inside:
    its backward runs as a user's.

    The number of graphs depends on where a program breaks, which differs from torch.compile's
    breaks (bytegraph resumes after a break in a loop or ``try``, where torch.compile runs the
    frame eagerly); what is asserted is that the first call compiles at least one graph wherever
    torch.compile does (asked only when it made none), that no frame fell back after an
    internal error, and that no frame ran eagerly whole on any call: every frame is traced to a
    graph, a break (and its resume), or to nothing to compile (frames that read their own locals
    apart, ``WHOLE_FRAME_FALLBACKS``). ``may_compile_nothing``: a seed of ``KNOWN_NO_GRAPH``,
    whose frames may fall back."""
    call_order = call_order or ([0, 1, 0, 2, 3][:len(makers) + 1] if len(makers) >= 3 else [0] * 2)
    inner = getattr(fn, "__wrapped_generated__", None)
    expected = [run_observed(fn, make) for make in makers]
    counter = CompileCounter(backend)
    compiled = bytegraph.compile(inner or fn, backend=counter)
    if inner is not None:
        compiled = with_backward(compiled)
    one_graph = None
    for i, which in enumerate(call_order):
        records.clear()
        actual = run_observed(compiled, makers[which])
        assert_no_internal_errors()
        if not may_compile_nothing:
            whole = [f"  {r.name}: {r.fallback_reason}" for r in records.frames
                     if r.fallback_reason and not r.fallback_reason.endswith(WHOLE_FRAME_FALLBACKS)]
            assert not whole, f"call {i + 1}: frames ran eagerly whole:\n" + "\n".join(whole)
        if i == 0:
            frames = list(records.frames)
            one_graph = (len(frames) == 1 and frames[0].break_reason is None
                         and frames[0].fallback_reason is None)
            if counter.frame_count == 0 and not may_compile_nothing:
                made = _torch_compile_graphs(fn, makers[which])
                assert made == 0, (f"no graph compiled on the first call, where torch.compile makes {made}:\n"
                                   + "\n".join(f"  {r.name}: break={r.break_reason!r} fallback={r.fallback_reason!r}"
                                                for r in frames))
        assert_same_run(expected[which], actual, f"(call {i + 1}, inputs #{which})", rtol, atol)
    return one_graph


def _torch_compile_graphs(fn, make):
    """The graphs torch.compile makes of ``fn`` on a first call with ``make()``'s inputs."""
    import torch._dynamo
    count = [0]

    def backend(gm, example_inputs):
        count[0] += 1
        return gm.forward

    inner = getattr(fn, "__wrapped_generated__", None)
    torch._dynamo.reset()
    try:
        compiled = torch.compile(inner or fn, backend=backend)
        run_observed(with_backward(compiled) if inner is not None else compiled, make)
    finally:
        torch._dynamo.reset()
    return count[0]


def compare_warm_start(src, inputs, backward, rtol=1e-4, atol=1e-5):
    """The program, written to a file (the persistent cache keys on source files), compiled
    with a named backend (``aot_eager``) and the persistent cache on: saved by one compile, then
    loaded from disk by the next after a reset (what a new process does), each run compared
    with eager."""
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "generated_program.py")
        with open(path, "w") as f:
            f.write(src)
        ns = _namespace("generated_program")
        exec(compile(src, path, "exec"), ns)
        fn = ns["generated"]
        if backward:
            fn = with_backward(fn)
        makers = [_maker(ns, a, k) for a, k in inputs]
        _compare_saved_then_loaded(fn, makers, os.path.join(folder, "cache"), rtol, atol)


def _compare_saved_then_loaded(fn, makers, cache_dir, rtol, atol):
    call_order = [0, 1, 0, 2, 3][:len(makers) + 1] if len(makers) >= 3 else [0] * 2
    inner = getattr(fn, "__wrapped_generated__", None)
    expected = [run_observed(fn, make) for make in makers]
    with bytegraph.config.patch(persistent_cache=True, cache_dir=cache_dir):
        for attempt in ("saved", "loaded"):
            bytegraph.reset()
            compiled = bytegraph.compile(inner or fn, backend="aot_eager")
            if inner is not None:
                compiled = with_backward(compiled)
            for i, which in enumerate(call_order):
                actual = run_observed(compiled, makers[which])
                assert_same_run(expected[which], actual, f"({attempt}, call {i + 1}, inputs #{which})", rtol, atol)


ONE_GRAPH = {}   # feature set -> {seed: bool}


@pytest.fixture(scope="module", autouse=True)
def one_graph_summary(request):
    yield
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    if reporter is None or capture is None or not ONE_GRAPH:
        return
    with capture.global_and_fixture_disabled():
        reporter.write_line("")
        for name, seeds in ONE_GRAPH.items():
            reporter.write_line(f"generated python [{name}]: {sum(seeds.values())}/{len(seeds)} seeds "
                                f"compiled as one graph")


def _cases():
    for name in FEATURE_SETS:
        count = N_SEEDS if "BYTEGRAPH_GEN_SEEDS" in os.environ else FEWER_SEEDS.get(name, N_SEEDS)
        for seed in range(FIRST_SEED, FIRST_SEED + count):
            marks = []
            if (name, seed) in KNOWN_MISMATCHES:
                since, reason = KNOWN_MISMATCHES[(name, seed)]
                marks.append(pytest.mark.xfail(sys.version_info[:2] >= since, strict=True, reason=reason))
            if (name, seed) in KNOWN_UNSTABLE:
                since, reason = KNOWN_UNSTABLE[(name, seed)]
                marks.append(pytest.mark.skipif(sys.version_info[:2] >= since, reason=reason))
            yield pytest.param(name, seed, id=f"{name}-{seed}", marks=marks)


def run_seed(feature_set, seed):
    """Compare one generated program with eager; True when it compiled as one graph."""
    fn, ns, src, inputs = make_program(feature_set, seed)
    backend = lookup_backend("aot_eager") if functionalized(feature_set, seed) else None
    try:
        order = {"shapes": SHAPES_CALL_ORDER, "moving": MOVING_CALL_ORDER}.get(feature_set) or rerun_call_order(inputs)
        variants = feature_set == "moving"
        makers = [_maker(ns, a, k, i if variants else 0) for i, (a, k) in enumerate(inputs)]
        one_graph = compare(fn, makers, backend=backend, call_order=order,
                            may_compile_nothing=(feature_set, seed) in KNOWN_NO_GRAPH)
        if feature_set == "grads" and seed % 4 == 0:
            # Every fourth: also saved to and loaded from the persistent cache.
            compare_warm_start(src, inputs, backward=True)
        return one_graph
    except BaseException as e:
        raise AssertionError(f"generated program ({feature_set}, seed {seed}) differs:\n{src}\n"
                             f"inputs: {inputs!r}\n") from e


@pytest.mark.parametrize("feature_set, seed", list(_cases()))
def test_generated_python(feature_set, seed):
    ONE_GRAPH.setdefault(feature_set, {})[seed] = run_seed(feature_set, seed)


def test_generator_covers_its_features():
    # Every construct actually shows up in the generated programs (guards the generator).
    sources = "\n".join(make_program(name, seed)[2] for name in FEATURE_SETS for seed in range(40))
    for needle in ["elif ", "for ", "while ", "enumerate(", "zip(", ".items()", "try:", "except ", "raise ",
                   "yield", "lambda ", "class ", "@property", "dataclasses.dataclass", "print(", "G_LIST",
                   "G_DICT", "global COUNTER", "items.", "h_add(", "f\"", "% (", ".format(", " for v in ",
                   "torch.", ".append(", "next(",
                   # families of issues 9 and 19
                   "def inner", "nonlocal ", ".item()", "+ None", "G_OBJ.", ".add_(", "[0]\n", " > 0] = ",
                   "nonzero()", "torch.unique(", "repeat_interleave(", "torch.no_grad()", "@functools.wraps",
                   "kwargs.pop(", "finally:", "locals()", "@mdeco", "make_scaler(", "lambda u, j=j",
                   "lambda u: u +", ".shape[0]]", ".chunk(2)[0]", "G_MOD(", "G_OBJ.on"]:
        assert needle in sources, f"no generated program uses {needle!r}"


def test_generated_programs_are_deterministic():
    assert make_program("all", 7)[2] == make_program("all", 7)[2]


# ---- minimal reproducers of mismatches the generator found (fixed)

def test_arithmetic_on_an_id_breaking_in_a_generator_loop():
    # Seed all-3400: ``id([n]) + 1`` breaks with the id of a list made in the trace on the stack,
    # inside a loop over a generator. Two walks over the live values did not follow the id to
    # its object: the generator check iterated the id itself (TypeError), and the graph did not
    # output the list's items that rebuilding ``id([...])`` needs (KeyError).
    def fn(x, k):
        def gen(k):
            j = 0
            while j < k:
                yield j * x.shape[0]
                j += 1
        for n in gen(k):
            x = x + n
            x = x + int((id([n, x]) + 1) > 0)
        return x

    compare(fn, [lambda: ((torch.ones(2), 3), {}, lambda: None),
                 lambda: ((torch.tensor([-2.5, 4.0]), 2), {}, lambda: None)], call_order=[0, 1])


def test_keyword_call_breaking_inside_try():
    # A call with keywords that graph-breaks inside `try` runs natively in a step function;
    # it lost its KW_NAMES on 3.11/3.12 (print got sep='|' as a positional argument).
    def fn(x, n):
        try:
            print(n, 2, sep="|")
            print(n, end="")
        except ValueError:
            pass
        return x + 1

    compare(fn, [lambda: ((torch.ones(2), 3), {}, lambda: None),
                 lambda: ((torch.tensor([-2.5, 4.0]), 3), {}, lambda: None)], call_order=[0, 1])


def test_nested_function_with_constant_defaults_and_closure():
    # MAKE_FUNCTION with constant defaults (one LOAD_CONST tuple) and a closure
    # failed with an internal error (ConstantValue has no .items) and ran eagerly.
    def fn(x, n):
        def scaled(v, w=2):
            return v * w + n
        return x + scaled(n)

    assert compare(fn, [lambda: ((torch.ones(2), 3), {}, lambda: None),
                        lambda: ((torch.tensor([-2.5, 4.0]), 3), {}, lambda: None)], call_order=[0, 1]) is True


def test_membership_of_a_symbolic_int():
    # `sum(items) in items` with items[0] symbolic (after it changed between calls) compared
    # nothing and answered False; items that are neither constants nor the same value now
    # compare with == (a guard for symbolic ints), as CPython does.
    def fn(x, items):
        if sum(items) in items:
            x = x + 1
        return x * 2, items.count(items[0]), items.index(items[-1])

    # (the two [4] calls with other tensor values: the second runs the first's graph)
    compare(fn, [lambda items=items, k=k: ((torch.full((2,), k), items), {}, lambda: None)
                 for k, items in ((1.0, [0]), (1.0, [4]), (1.0, [1, 5]), (-3.0, [4]))], call_order=[0, 1, 2, 3, 1])


def test_inplace_operator_on_symbolic_int_inside_loops():
    # `n1 += n22` on symbolic ints became operator.iadd in the graph; FX's code rebound the
    # input name, so every later use of the argument saw the sum.
    def fn(x, n):
        m = n
        for _ in range(3):
            x = (x * 0.5 - x * n).tanh()
            m += 2
        return x * 4, m

    compare(fn, [lambda n=n: ((torch.ones(2, 3), n), {}, lambda: None) for n in (1, 3, 4)])


def test_missing_attribute_messages_name_the_type_as_cpython_does():
    # AttributeError messages quote the type's tp_name: 'types.SimpleNamespace' for a C type
    # (the generator's G_OBJ), __name__ for classes (not __qualname__).
    import types as _types

    class Outer:
        class Inner:
            pass

    ns = _types.SimpleNamespace(a=1)

    def fn(x):
        out = []
        for obj in (ns, Outer.Inner, Outer.Inner(), fn.__code__):
            try:
                obj.missing_attr
            except AttributeError as e:
                out.append(str(e))
        return x + 1, out

    compare(fn, [lambda: ((torch.ones(2),), {}, lambda: None),
                 lambda: ((torch.tensor([-2.5, 4.0]),), {}, lambda: None)], call_order=[0, 1])


def test_division_by_zero_of_a_symbolic_int_after_an_index_out_of_range():
    # (raising-17) The index is out of range on the last call only: fake tensors cannot see that,
    # so the trace went on to `n // 0` with n symbolic (it changed between calls) and failed
    # inside (ZeroDivisionError from the symbolic hint). A fold that fails on the current values
    # raises as Python does: the graph raises eager's IndexError at run time and the frame reruns
    # natively; on the other calls the traced ZeroDivisionError escapes, as in eager.
    def fn(x, n, items):
        items.append(n % 7)
        t = torch.index_select(x.flatten(), 0, x.abs().sum().long().reshape(1)) * 2
        return t, n // 0

    def make(scale, n):
        def fresh():
            items = [1]
            return (torch.full((2, 3), scale), n, items), {}, lambda: list(items)
        return fresh

    compare(fn, [make(0.1, 2), make(0.2, 3), make(5.0, 4), make(0.3, 5)], call_order=[0, 1, 3, 2])

"""Generated programs that break the graph inside callees at several depths (issue 40).

A seeded generator (``random.Random(seed)``) writes a chain of levels, each a function, a
module, a callable object, a ``functools.partial``, a module with a forward hook, an
``nn.Sequential``, a custom autograd Function or a loop over a ``ModuleList`` (with
``enumerate``), sometimes inside ``try``/``with`` blocks. Every level does tensor work before
and after calling the next; the deepest breaks the graph (``.item()``, a branch on a tensor,
``.tolist()``, ``nonzero``), sometimes twice, and some middle levels break too. The program runs
eagerly, then compiled by bytegraph and by torch.compile (the reference), each with a backend
that counts the ops of the graphs that run: bytegraph's results must equal eager's on two calls
(the second with other values), its graphs must run at least as many ops in the second call
as torch.compile's, and the second call may compile at most one graph more than torch.compile's
(a number a break hands over changes: one recompile, not one per layer). So the work after every
break, at every depth, is captured.

Used by tests/test_capture_after_break.py (``BYTEGRAPH_GEN_SEEDS`` seeds) and by
``python scripts/run_generated.py --sets breaks``.
"""
import functools
import random
import textwrap

import torch

import bytegraph
from bytegraph.debug import records
from bytegraph.testing import same

CALL_FORMS = ("call", "module", "partial", "callable", "hooked", "sequential", "apply", "loop")
BREAKS = ("item", "branch", "tolist", "nonzero")
WRAPS = (None, None, None, "try", "no_grad")
# unary ops that keep shapes and values finite on any input
_OPS = ("torch.tanh({})", "torch.sigmoid({})", "({}).sin()", "({}).cos()", "({}) * 0.5", "({}) + 1.0",
        "torch.relu({})", "({}).abs().sqrt()", "torch.nn.functional.softsign({})", "({}) - ({}).mean()")


class _Writer:
    def __init__(self, r):
        self.r = r
        self.lines = []

    def work(self, var, n=None):
        """``var = op(op(...var))``: tensor work the compiler should capture."""
        n = self.r.randint(1, 3) if n is None else n
        expr = var
        for _ in range(n):
            op = self.r.choice(_OPS)
            expr = op.format(expr, expr) if op.count("{}") == 2 else op.format(expr)
        return f"{var} = {expr}"

    def breaking(self, var):
        kind = self.r.choice(BREAKS)
        if kind == "item":
            return [f"if {var}.sum().item() > -1e9:", f"    {var} = {var} + 1.0"]
        if kind == "branch":
            return [f"if ({var}.abs().mean() > -1.0):", f"    {var} = {var} * 2.0", "else:",
                    f"    {var} = {var} - 2.0"]
        if kind == "tolist":
            return [f"{var} = {var} + float(len({var}.tolist()))"]
        return [f"_idx = ({var} > 0.0).nonzero()", f"{var} = {var} * 1.5 + float(_idx.shape[0] > -1)"]


def make_source(seed):
    """The program of ``seed``: module-level source whose ``main(x)`` is compiled."""
    r = random.Random(seed)
    depth = r.randint(2, 5)
    w = _Writer(r)
    out = []
    # Level ``depth`` (the deepest) breaks; the others call the next level in some form.
    deepest = [w.work("y")] + w.breaking("y") + [w.work("y")]
    if r.random() < 0.4:
        deepest += w.breaking("y") + [w.work("y")]
    out.append(f"def level{depth}(y):\n" + textwrap.indent("\n".join(deepest + ["return y"]), "    "))
    for lvl in range(depth - 1, 0, -1):
        form = r.choice(CALL_FORMS)
        nxt = f"level{lvl + 1}"
        setup, call = _call_form(r, form, lvl, nxt)
        out += setup
        body = [w.work("y")]
        if r.random() < 0.25:
            body += w.breaking("y")        # a break in a middle level too
        wrap = r.choice(WRAPS)
        if wrap == "try":
            body += ["try:", f"    y = {call}", "except ValueError:", "    y = y * 0.0"]
        elif wrap == "no_grad":
            body += ["with torch.no_grad():", f"    y = {call}"]
        else:
            body.append(f"y = {call}")
        body += [w.work("y"), "return y"]
        out.append(f"def level{lvl}(y):\n" + textwrap.indent("\n".join(body), "    "))
    out.append("def main(x):\n" + textwrap.indent("\n".join(
        [w.work("x"), "y = level1(x)", w.work("y"), "return y, x.sum()"]), "    "))
    return "\n\n\n".join(out) + "\n"


def _call_form(r, form, lvl, nxt):
    """(definitions, call expression) calling ``nxt`` from level ``lvl`` in the form ``form``."""
    name = f"_via{lvl}"
    if form == "call":
        return [], f"{nxt}(y)"
    if form == "module":
        return [f"class Mod{lvl}(torch.nn.Module):\n    def forward(self, y):\n        return {nxt}(y) * 1.0\n\n"
                f"{name} = Mod{lvl}()"], f"{name}(y)"
    if form == "partial":
        return [f"def _scaled{lvl}(y, k):\n    return {nxt}(y) * k\n\n"
                f"{name} = functools.partial(_scaled{lvl}, k={r.choice([0.5, 2.0])})"], f"{name}(y)"
    if form == "callable":
        return [f"class Call{lvl}:\n    def __init__(self, k):\n        self.k = k\n\n"
                f"    def __call__(self, y):\n        return {nxt}(y + self.k)\n\n"
                f"{name} = Call{lvl}({r.choice([0.0, 1.0])})"], f"{name}(y)"
    if form == "hooked":
        return [f"class Hooked{lvl}(torch.nn.Module):\n    def forward(self, y):\n        return {nxt}(y)\n\n"
                f"{name} = Hooked{lvl}()\n"
                f"{name}.register_forward_hook(lambda m, a, out: HOOK_CALLS.append({lvl}))"], f"{name}(y)"
    if form == "sequential":
        return [f"class Step{lvl}(torch.nn.Module):\n    def forward(self, y):\n        return {nxt}(y)\n\n"
                f"{name} = torch.nn.Sequential(torch.nn.Tanh(), Step{lvl}(), torch.nn.Sigmoid())"], f"{name}(y)"
    if form == "apply":
        return [f"class Fn{lvl}(torch.autograd.Function):\n"
                f"    @staticmethod\n    def forward(ctx, y, scale, seen):\n"
                f"        seen.append(scale)\n        return {nxt}(y * scale)\n\n"
                f"    @staticmethod\n    def backward(ctx, g):\n        return g, None, None"], \
            f"Fn{lvl}.apply(y, {r.choice([0.5, 1.5])}, [])"
    # loop over layers, each calling the next level; some layers count first (a break handing
    # the resumed layer a number that changes per layer and per call, used with the layer's own k)
    n = r.randint(2, 3)
    body = f"return {nxt}(y) * self.k" if r.random() < 0.5 else \
        f"c = (y > 0.0).sum().tolist()\n        return {nxt}(y) * self.k + c * 0.001"
    return [f"class Layer{lvl}(torch.nn.Module):\n    def __init__(self, k):\n        super().__init__()\n"
            f"        self.k = k\n\n    def forward(self, y):\n        {body}\n\n"
            f"class Loop{lvl}(torch.nn.Module):\n    def __init__(self):\n        super().__init__()\n"
            f"        self.layers = torch.nn.ModuleList([Layer{lvl}(0.5 + i) for i in range({n})])\n\n"
            f"    def forward(self, y):\n        for i, layer in enumerate(self.layers):\n"
            f"            y = layer(y) + i\n            y = torch.tanh(y)\n        return y\n\n"
            f"{name} = Loop{lvl}()"], f"{name}(y)"


def tensor_ops(gm):
    """Call nodes of ``gm`` that make tensors (not the symbolic-size arithmetic torch.compile adds
    for sizes it made dynamic, which bytegraph computes outside the graph or specialises)."""
    n = 0
    for node in gm.graph.nodes:
        if node.op in ("call_function", "call_method", "call_module"):
            value = node.meta.get("example_value")
            values = value if isinstance(value, (tuple, list)) else [value]
            if value is None or any(isinstance(v, torch.Tensor) for v in values):
                n += 1
    return n


class RunCounter:
    """A backend counting its graphs and the ops of the graphs that run (``ran``), as ``count``
    counts them (default: tensor ops)."""

    def __init__(self, count=None):
        self.graphs = 0
        self.ran = 0
        self.count = count or tensor_ops

    def __call__(self, gm, example_inputs):
        self.graphs += 1
        ops = self.count(gm)

        def run(*args):
            self.ran += ops
            return gm.forward(*args)
        return run


def build(seed):
    src = make_source(seed)
    ns = {"torch": torch, "functools": functools, "HOOK_CALLS": [], "__name__": f"generated_breaks_{seed}"}
    code = compile(src, f"<generated_breaks {seed}>", "exec")
    exec(code, ns)
    return src, ns


def _inputs(seed, call):
    g = torch.Generator().manual_seed(seed * 7 + call)
    return torch.randn(3, 4, generator=g)


def _run(compile_fn, reset, main, seed):
    reset()
    counter = RunCounter()
    compiled = compile_fn(main, counter)
    results = []
    with torch.no_grad():
        for call in range(2):
            if call == 1:
                counter.ran = 0
                counter.first_graphs = counter.graphs
            results.append(compiled(_inputs(seed, call)))
    reset()
    return results, counter


def run_seed(seed):
    """Compare seed's program compiled with eager and its captured ops with torch.compile's."""
    import torch._dynamo
    src, ns = build(seed)
    main = ns["main"]
    with torch.no_grad():
        expected = [main(_inputs(seed, call)) for call in range(2)]
    hooks_eager = len(ns["HOOK_CALLS"])
    del ns["HOOK_CALLS"][:]
    start = len(records.frames)
    actual, bg = _run(lambda f, b: bytegraph.compile(f, backend=b), bytegraph.reset, main, seed)
    eager_frames = [r.name for r in records.frames[start:] if r.fallback_reason]
    hooks_bg = len(ns["HOOK_CALLS"])
    del ns["HOOK_CALLS"][:]
    _, tc = _run(lambda f, b: torch.compile(f, backend=b), torch._dynamo.reset, main, seed)
    where = f"seed {seed}:\n{src}"
    for e, a in zip(expected, actual):
        assert same(e, a, rtol=1e-4, atol=1e-5), f"result differs from eager; {where}"
    assert hooks_bg == hooks_eager, f"hooks ran {hooks_bg} times, eager {hooks_eager}; {where}"
    assert not eager_frames, f"frames ran eagerly: {eager_frames}; {where}"
    assert bg.ran >= tc.ran, f"ops run in graphs in a call: bytegraph {bg.ran}, torch.compile {tc.ran}; {where}"
    # Numbers a break hands over change in the second call: recompiled once per resumed code,
    # not once per layer that runs it (at most one more than torch.compile's).
    again_bg, again_tc = bg.graphs - bg.first_graphs, tc.graphs - tc.first_graphs
    assert again_bg <= again_tc + 1, (f"graphs compiled again in the second call: bytegraph {again_bg}, "
                                      f"torch.compile {again_tc}; {where}")
    return bg, tc

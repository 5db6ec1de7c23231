"""Standalone graphs, their inputs, the checks the minifier runs, and ``repro.py`` files.

A *standalone graph* has only placeholders, calls and an output: the parameters and buffers a
captured graph reads with ``get_attr`` become placeholders too, so a graph plus a list of
input values is all a check needs, and all a ``repro.py`` has to rebuild.

A check compiles the graph with the compiler under test (a backend after ``frontend``, an
AOTAutograd inner compiler after ``aot``) and, by kind, runs it and compares it with eager.
Its result is a *failure signature*: ``("compile", "RuntimeError")``, ``("run", ...)``,
``("accuracy",)`` or None. The minifier keeps a candidate when its signature equals the
original failure's; a written ``repro.py`` calls :func:`run_repro`, which runs the same check
and exits 1 while it still fails that way (2: it fails differently, 0: it passes).

This module is what generated ``repro.py`` files import: keep its names stable.
"""
import importlib
import importlib.util
import math
import os
import sys
import traceback

import torch
from torch import fx
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.passes.fake_tensor_prop import FakeTensorProp

KINDS = ("compile", "run", "accuracy")


class ReproError(Exception):
    """A graph or input that cannot be written into a repro (named in the message)."""


# --- inputs ------------------------------------------------------------------------------
class Input:
    """How a repro rebuilds one graph input: random with recorded metadata, a Python value,
    or a saved tensor. ``repro.py`` lists one per placeholder."""

    __slots__ = ("kind", "shape", "stride", "dtype", "device", "requires_grad", "low", "high", "value", "key")

    def __init__(self, kind, shape=(), stride=(), dtype=None, device="cpu", requires_grad=False, low=None,
                 high=None, value=None, key=None):
        self.kind, self.shape, self.stride, self.dtype, self.device = kind, tuple(shape), tuple(stride), dtype, device
        self.requires_grad, self.low, self.high, self.value, self.key = requires_grad, low, high, value, key

    @classmethod
    def tensor(cls, shape, stride, dtype, device="cpu", requires_grad=False, low=None, high=None):
        return cls("tensor", shape, stride, _dtype(dtype), device, requires_grad, low, high)

    @classmethod
    def scalar(cls, value):
        return cls("scalar", value=value)

    @classmethod
    def saved(cls, key, requires_grad=False):
        return cls("saved", key=key, requires_grad=requires_grad)

    @classmethod
    def of(cls, x):
        """The spec of a real or fake tensor, a SymInt, or a Python number."""
        if isinstance(x, torch.Tensor):
            shape = tuple(_hint(s) for s in x.shape)
            stride = tuple(_hint(s) for s in x.stride())
            low = high = None
            if not x.is_floating_point() and not x.is_complex() and x.dtype != torch.bool and not _is_fake(x):
                if x.numel():
                    low, high = int(x.min()), int(x.max())
            return cls.tensor(shape, stride, x.dtype, str(x.device), x.requires_grad, low, high)
        if isinstance(x, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            return cls.scalar(_hint(x))
        if isinstance(x, (int, float, bool)) or x is None:
            return cls.scalar(x)
        raise ReproError(f"cannot rebuild a graph input of type {type(x).__name__}")

    def make(self, saved=None):
        """The value (random parts drawn from torch's current generator)."""
        if self.kind == "scalar":
            return self.value
        if self.kind == "saved":
            if saved is None or self.key not in saved:
                raise ReproError(f"saved input {self.key!r} is missing")
            t = saved[self.key].clone()
            return t.requires_grad_(self.requires_grad) if t.is_floating_point() else t
        size = 1 + sum((s - 1) * st for s, st in zip(self.shape, self.stride)) if all(self.shape) else 0
        dtype = self.dtype
        if dtype.is_floating_point or dtype.is_complex:
            flat = torch.randn(size, dtype=dtype, device=self.device)
        elif dtype == torch.bool:
            flat = torch.randint(0, 2, (size,), device=self.device).bool()
        else:
            low = 0 if self.low is None else self.low
            high = 2 if self.high is None else self.high
            flat = torch.randint(low, high + 1, (size,), dtype=dtype, device=self.device)
        t = flat.as_strided(self.shape, self.stride).detach() if size else torch.empty(
            self.shape, dtype=dtype, device=self.device)
        if self.requires_grad and (dtype.is_floating_point or dtype.is_complex):
            t.requires_grad_(True)
        return t

    def code(self):
        if self.kind == "scalar":
            return f"Input.scalar({_literal(self.value)})"
        if self.kind == "saved":
            return f"Input.saved({self.key!r}{', requires_grad=True' if self.requires_grad else ''})"
        extra = ""
        if self.requires_grad:
            extra += ", requires_grad=True"
        if self.low is not None:
            extra += f", low={self.low}, high={self.high}"
        return (f"Input.tensor({self.shape!r}, {self.stride!r}, {str(self.dtype).replace('torch.', '')!r}, "
                f"{self.device!r}{extra})")


def build_inputs(specs, saved=None, seed=0):
    """Every input, in order, with random ones drawn from ``seed`` (as ``repro.py`` does)."""
    torch.manual_seed(seed)
    return [s.make(saved) for s in specs]


def _dtype(d):
    return getattr(torch, d) if isinstance(d, str) else d


def _hint(s):
    if isinstance(s, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        hint = s.node.hint
        if hint is None:
            raise ReproError(f"the size {s} has no example value")
        return hint
    return s


def _is_fake(t):
    return type(t).__name__ == "FakeTensor" or t.device.type == "meta"


# --- standalone graphs --------------------------------------------------------------------
def standalone(gm):
    """(graph, values of the parameters and buffers it reads): a copy of ``gm``'s graph where
    each ``get_attr`` is a placeholder after the graph's own, to be given those values."""
    g = fx.Graph()
    env = {}
    lifted = []
    nodes = list(gm.graph.nodes)
    for n in nodes:
        if n.op == "placeholder":
            env[n] = g.placeholder(n.name)
    for n in nodes:
        if n.op == "get_attr":
            env[n] = g.placeholder(n.name)
            lifted.append(_fetch_attr(gm, n.target))
    for n in nodes:
        if n.op in ("call_function", "call_method"):
            env[n] = g.create_node(n.op, n.target, fx.map_arg(n.args, env.__getitem__),
                                   fx.map_arg(n.kwargs, env.__getitem__), name=n.name)
        elif n.op == "call_module":
            raise ReproError("graphs calling submodules (call_module) cannot be written as a repro yet")
        elif n.op == "output":
            g.output(fx.map_arg(n.args[0], env.__getitem__))
    return g, lifted


def _fetch_attr(gm, target):
    obj = gm
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


def graph_module(graph):
    """A fresh GraphModule over a copy of ``graph`` (backends may change what they are given)."""
    g = fx.Graph()
    out = g.graph_copy(graph, {})
    g.output(out)
    return fx.GraphModule(torch.nn.Module(), g)


def output_nodes(graph):
    return [a for a in _flatten(graph.output_node().args[0]) if isinstance(a, fx.Node)]


def _flatten(x):
    if isinstance(x, (list, tuple)):
        for i in x:
            yield from _flatten(i)
    elif isinstance(x, dict):
        for i in x.values():
            yield from _flatten(i)
    else:
        yield x


def op_count(graph):
    return sum(1 for n in graph.nodes if n.op in ("call_function", "call_method"))


# --- checks ------------------------------------------------------------------------------
def call_compiled(compiled, args):
    """Call what a compiler returned: boxed (one list, AOTAutograd's convention) or positional."""
    if getattr(compiled, "_boxed_call", False):
        return compiled(list(args))
    return compiled(*args)


def check(graph, inputs, compiler, after, kind, tolerance=None):
    """The failure signature of compiling (and by ``kind`` running, comparing) ``graph``:
    None when it compiles, runs and matches eager; else (signature tuple, detail text)."""
    eager_gm = graph_module(graph)
    gm = graph_module(graph)
    if after == "aot":
        _propagate_fake(gm, inputs)
    try:
        compiled = compiler(gm, _clones(inputs))
    except Exception as e:
        return ("compile", type(e).__name__), _one_line(e)
    if kind == "compile":
        return None
    try:
        args = _clones(inputs)
        out = call_compiled(compiled, args)
    except Exception as e:
        return ("run", type(e).__name__), _one_line(e)
    if kind == "run":
        return None
    problem = compare_with_eager(eager_gm, inputs, out, tolerance)
    return (("accuracy",), problem) if problem else None


def compare_with_eager(eager_gm, inputs, out, tolerance=None):
    """Why ``out`` (the compiled graph's outputs on ``inputs``) is not eager's, or None.

    Outputs that are close to eager's (rtol=atol=``tolerance``) pass. Others are judged
    against a float64 run of the graph where one can be made: the compiled result fails when
    its error against float64 is more than twice eager's (plus the tolerance), so a graph
    that eager itself computes imprecisely is not blamed on the backend.
    """
    with torch.no_grad():
        ref = _as_list(eager_gm(*_clones(inputs)))
        try:
            ref64 = _as_list(eager_gm(*[_to64(x) for x in inputs]))
        except Exception:
            ref64 = None
    res = _as_list(out)
    if len(res) != len(ref):
        return f"{len(res)} outputs, eager gives {len(ref)}"
    for i, (r, e) in enumerate(zip(res, ref)):
        e64 = ref64[i] if ref64 is not None and i < len(ref64) else None
        problem = _differs(r, e, e64, tolerance)
        if problem:
            return f"output {i}: {problem}"
    return None


def _differs(r, e, e64, tolerance):
    if not isinstance(e, torch.Tensor):
        if isinstance(e, float) and isinstance(r, (int, float)) and math.isclose(r, e, rel_tol=1e-6):
            return None
        return None if r == e else f"{r!r} where eager gives {e!r}"
    if not isinstance(r, torch.Tensor):
        return f"{type(r).__name__} where eager gives a tensor"
    r, e = r.detach(), e.detach()
    if r.shape != e.shape:
        return f"shape {tuple(r.shape)} where eager gives {tuple(e.shape)}"
    if r.dtype != e.dtype:
        return f"dtype {r.dtype} where eager gives {e.dtype}"
    if not (e.is_floating_point() or e.is_complex()):
        return None if torch.equal(r, e) else "different values"
    tol = tolerance if tolerance is not None else (1e-2 if e.dtype in (torch.float16, torch.bfloat16) else 1e-4)
    if torch.allclose(r, e, rtol=tol, atol=tol, equal_nan=True):
        return None
    max_diff = (r.double() - e.double()).abs().nan_to_num(float("inf")).max().item() if r.numel() else 0.0
    if isinstance(e64, torch.Tensor) and e64.shape == e.shape:
        err_r = _rmse(r, e64)
        err_e = _rmse(e, e64)
        if err_r <= 2 * err_e + tol:
            return None
        return (f"max abs difference {max_diff:.3g} from eager; RMS error against float64 {err_r:.3g} "
                f"(eager's: {err_e:.3g})")
    return f"max abs difference {max_diff:.3g} from eager"


def _rmse(a, b):
    d = (a.double() - b.double())
    if d.numel() == 0:
        return 0.0
    return d.pow(2).mean().sqrt().nan_to_num(float("inf")).item()


def _to64(x):
    if isinstance(x, torch.Tensor) and x.is_floating_point():
        return x.detach().to(torch.float64)
    return _clone(x)


def _clone(x):
    if isinstance(x, torch.Tensor):
        c = x.detach().clone(memory_format=torch.preserve_format)
        if c.stride() != x.stride():
            c = torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device=x.device).copy_(x.detach())
        return c.requires_grad_(x.requires_grad) if x.is_leaf and x.requires_grad else c
    return x


def _clones(inputs):
    return [_clone(x) for x in inputs]


def _as_list(out):
    if isinstance(out, (list, tuple)):
        return list(out)
    return [out]


def _propagate_fake(gm, inputs):
    """Fill ``meta['val']`` as AOTAutograd's graphs have it (inner compilers such as Inductor's
    read it). Best effort: a graph fake propagation cannot run is handed over as it is."""
    try:
        mode = FakeTensorMode(allow_non_fake_inputs=True)
        FakeTensorProp(gm, mode).propagate(*[mode.from_tensor(x) if isinstance(x, torch.Tensor) else x
                                             for x in inputs])
    except Exception:
        pass


def _one_line(e):
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"


# --- naming things in a file -------------------------------------------------------------
def target(name):
    """The object a dotted name (``torch.relu``, ``operator.mul``, ``torch._C._nn.linear``,
    ``torch.ops.aten.relu.default``) refers to: the longest importable module prefix, then
    attributes."""
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        try:
            for attr in parts[i:]:
                obj = getattr(obj, attr)
        except AttributeError:
            continue
        return obj
    raise ReproError(f"cannot find {name!r}")


def target_name(obj):
    """A dotted name that :func:`target` turns back into ``obj``."""
    candidates = []
    try:
        candidates.append(fx.node._get_qualified_name(obj))
    except Exception:
        pass
    module = getattr(obj, "__module__", None)
    qualname = getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None)
    if module and qualname:
        candidates.append(f"{module}.{qualname}")
        if module.startswith("_"):
            candidates.append(f"{module[1:]}.{qualname}")
    if isinstance(obj, torch._ops.OpOverload):
        candidates.insert(0, f"torch.ops.{obj.namespace}.{obj._schema.name.split('::')[-1]}.{obj._overloadname}")
    if isinstance(obj, torch._ops.OpOverloadPacket):
        candidates.insert(0, f"torch.ops.{obj._qualified_op_name.replace('::', '.')}")
    for name in candidates:
        try:
            if target(name) is obj:
                return name
        except Exception:
            continue
    raise ReproError(f"cannot name {obj!r} so that a repro can import it")


def importable(obj):
    """(sys.path entry or None, module name, attribute path) importing ``obj``, or None."""
    module_name = getattr(obj, "__module__", None)
    if not module_name:
        return None
    module = sys.modules.get(module_name)
    if module is None:
        return None
    path = None
    qualname = getattr(obj, "__qualname__", "")
    attr = None
    if qualname and "<" not in qualname:
        try:
            found = module
            for part in qualname.split("."):
                found = getattr(found, part)
            if found is obj:
                attr = qualname
        except AttributeError:
            pass
    if attr is None:   # e.g. a backend made by a factory and stored under a module-level name
        attr = next((k for k, v in vars(module).items() if v is obj), None)
    if attr is None:
        return None
    file = getattr(module, "__file__", None)
    if module_name == "__main__" and not file:
        return None
    if file and module_name != "__main__" and not module_name.startswith(("torch", "bytegraph")):
        root = os.path.dirname(os.path.abspath(file))
        if os.path.basename(file) == "__init__.py":
            root = os.path.dirname(root)
        for _ in range(module_name.count(".")):
            root = os.path.dirname(root)
        path = root
    return path, module_name, attr


def load_script(path, attr):
    """What ``repro.py`` calls for a compiler defined in a script run as ``__main__``: the script
    is loaded as a module (its ``if __name__ == "__main__":`` block does not run)."""
    spec = importlib.util.spec_from_file_location("_bytegraph_repro_script", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    obj = module
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def load(path, module_name, attr):
    """What ``repro.py`` calls to import the compiler under test."""
    if path and path not in sys.path:
        sys.path.insert(0, path)
    obj = importlib.import_module(module_name)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def _literal(x):
    if isinstance(x, float):
        if math.isnan(x):
            return 'float("nan")'
        if math.isinf(x):
            return 'float("inf")' if x > 0 else 'float("-inf")'
        return repr(x)
    if isinstance(x, (bool, int, str, type(None))) or x is Ellipsis:
        return repr(x)
    if isinstance(x, torch.dtype):
        return str(x)
    if isinstance(x, (torch.memory_format, torch.layout)):
        return str(x)
    if isinstance(x, torch.device):
        return f"torch.device({str(x)!r})"
    if isinstance(x, torch.Size):
        return f"torch.Size({_literal(tuple(x))})"
    if isinstance(x, slice):
        return f"slice({_literal(x.start)}, {_literal(x.stop)}, {_literal(x.step)})"
    if isinstance(x, tuple):
        return "(" + "".join(_literal(i) + ", " for i in x).rstrip(" ") + ")" if x else "()"
    if isinstance(x, list):
        return "[" + ", ".join(_literal(i) for i in x) + "]"
    if isinstance(x, dict):
        return "{" + ", ".join(f"{_literal(k)}: {_literal(v)}" for k, v in x.items()) + "}"
    raise ReproError(f"cannot write the constant {x!r} ({type(x).__name__}) into a repro")


_RESERVED = {"g", "torch", "fx", "Input", "target", "make_graph", "INPUTS", "run_repro", "load", "load_script",
             "compiler", "lookup_backend", "os", "sys", "AFTER", "KIND", "EXPECTED", "SAVED"}


def graph_code(graph):
    """Python lines (a ``make_graph()`` function) rebuilding ``graph`` node by node."""
    names = {}
    used = set(_RESERVED)

    def var(node):
        if node not in names:
            base = node.name if node.name.isidentifier() else "v"
            name = base
            while name in used:
                name += "_"
            used.add(name)
            names[node] = name
        return names[node]

    def arg(a):
        if isinstance(a, fx.Node):
            return var(a)
        if isinstance(a, tuple):
            return "(" + "".join(arg(i) + ", " for i in a).rstrip(" ") + ")" if a else "()"
        if isinstance(a, list):
            return "[" + ", ".join(arg(i) for i in a) + "]"
        if isinstance(a, dict):
            return "{" + ", ".join(f"{_literal(k)}: {arg(v)}" for k, v in a.items()) + "}"
        return _literal(a)

    lines = ["def make_graph():", "    g = fx.Graph()"]
    for n in graph.nodes:
        if n.op == "placeholder":
            lines.append(f"    {var(n)} = g.placeholder({n.name!r})")
        elif n.op == "call_function":
            lines.append(f"    {var(n)} = g.create_node('call_function', target({target_name(n.target)!r}), "
                         f"{arg(tuple(n.args))}, {arg(dict(n.kwargs))}, name={n.name!r})")
        elif n.op == "call_method":
            lines.append(f"    {var(n)} = g.create_node('call_method', {n.target!r}, {arg(tuple(n.args))}, "
                         f"{arg(dict(n.kwargs))}, name={n.name!r})")
        elif n.op == "output":
            lines.append(f"    g.output({arg(n.args[0])})")
    lines.append("    return g")
    return lines


def write_repro(path, graph, specs, saved, compiler_lines, after, kind, expected, description):
    """Write ``repro.py`` at ``path`` (and its saved inputs beside it, when any)."""
    saved_file = None
    if saved:
        saved_file = os.path.splitext(os.path.basename(path))[0] + "_inputs.pt"
        torch.save({k: v.detach().cpu() if v.device.type == "meta" else v.detach() for k, v in saved.items()},
                   os.path.join(os.path.dirname(path), saved_file))
    readable = fx.GraphModule(torch.nn.Module(), graph).code.strip("\n").splitlines()
    lines = [
        '"""bytegraph repro: ' + description.replace('"""', "'''").splitlines()[0],
        "",
        *description.replace('"""', "'''").splitlines()[1:],
        "",
        f"Made by BYTEGRAPH_REPRO_AFTER={after}. Run it: python {os.path.basename(path)}",
        "It exits 1 while the failure reproduces, 2 if the graph fails in another way, 0 once it passes.",
        "",
        f"The graph ({op_count(graph)} ops):",
        "",
        *["    " + line for line in readable if line.strip()],
        '"""',
        "import os",
        "import sys",
        "",
        "import torch",
        "from torch import fx",
        "",
        "from bytegraph.debug.repro import Input, load, load_script, run_repro, target",
        "",
        *graph_code(graph),
        "",
        "",
        "INPUTS = [",
        *[f"    {s.code()}," for s in specs],
        "]",
        "",
        *compiler_lines,
        "",
        f"AFTER = {after!r}",
        f"KIND = {kind!r}   # what the check does: compile; run; compare with eager",
        f"EXPECTED = {tuple(expected)!r}   # how it fails",
        f"SAVED = {repr(saved_file)}   # saved input values, beside this file",
        "",
        'if __name__ == "__main__":',
        "    saved = SAVED and os.path.join(os.path.dirname(os.path.abspath(__file__)), SAVED)",
        "    sys.exit(run_repro(make_graph(), INPUTS, compiler, AFTER, KIND, EXPECTED, saved))",
        "",
    ]
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(lines))
    return path


def compiler_code(compiler, backend_name):
    """Lines defining ``compiler`` in a repro: imported from where it lives, else looked up by
    its registered backend name."""
    where = importable(compiler)
    if where is not None:
        path, module, attr = where
        if module == "__main__":
            file = os.path.abspath(sys.modules["__main__"].__file__)
            return ["# (loads the script that defined it; keep its work under `if __name__ == \"__main__\":`)",
                    f"compiler = load_script({file!r}, {attr!r})"]
        return [f"compiler = load({path!r}, {module!r}, {attr!r})"]
    if isinstance(backend_name, str):
        return ["from bytegraph.backends.registry import lookup_backend", "",
                f"compiler = lookup_backend({backend_name!r})"]
    return [f"compiler = None   # the compiler under test ({compiler!r}) could not be named: set it here"]


def run_repro(graph, specs, compiler, after, kind, expected, saved=None):
    """Run a repro: 1 if ``graph`` still fails as ``expected``, 2 if it fails otherwise, 0 if not."""
    saved_values = torch.load(saved, weights_only=True) if saved else None
    inputs = build_inputs(specs, saved_values)
    try:
        outcome = check(graph, inputs, compiler, after, kind)
    except Exception:
        traceback.print_exc()
        return 2
    if outcome is None:
        print(f"bytegraph repro: passes ({kind} check after {after}); the failure is gone")
        return 0
    signature, detail = outcome
    if tuple(signature) == tuple(expected):
        print(f"bytegraph repro: reproduces: {detail}")
        return 1
    print(f"bytegraph repro: fails differently ({' '.join(signature)}, expected {' '.join(expected)}): {detail}")
    return 2

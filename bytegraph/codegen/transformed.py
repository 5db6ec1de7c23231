"""The transformed function: call the compiled graph, rebuild what the frame returned.

It is generated Python source with a ``linecache`` entry, so tracebacks,
``inspect.getsource`` and ``pdb`` show real lines.
"""
import linecache
import math

import torch

from ..errors import Unsupported
from ..guards.sources import ObjectSource
from ..values.base import (ConstantValue, DictValue, ListValue, ObjectValue, SymValue, TensorValue,
                           TupleValue)


class Namespace:
    """Names the generated code refers to, with their objects."""

    def __init__(self, fn_globals):
        self.ns = {"G": fn_globals, "torch": torch}
        self._ids = {}

    def ref(self, obj, hint="c"):
        key = id(obj)
        if key not in self._ids:
            name = f"__{hint}{len(self._ids)}"
            self._ids[key] = name
            self.ns[name] = obj
        return self._ids[key]

    def source(self, source):
        def render(s):
            if isinstance(s, ObjectSource):
                self.ns[s.expr()] = s.obj
            return s.expr_over(render)
        return render(source)


def collect_outputs(value, out):
    """Tensor leaves of a returned value, in order (appended to ``out``)."""
    if isinstance(value, (TensorValue, SymValue)):
        out.append(value)
    elif isinstance(value, (TupleValue, ListValue)):
        for v in value.items:
            collect_outputs(v, out)
    elif isinstance(value, DictValue):
        for v in value.items.values():
            collect_outputs(v, out)
    return out


def rebuild_expr(value, ns, tensor_exprs):
    """Python expression that rebuilds ``value``; tensors come from ``tensor_exprs``."""
    if isinstance(value, (TensorValue, SymValue)):
        return tensor_exprs[id(value)]
    if isinstance(value, ConstantValue):
        v = value.value
        if v is None or isinstance(v, (bool, str)) or (type(v) is int):
            return repr(v)
        if type(v) is float and math.isfinite(v):
            return repr(v)
        return ns.ref(v)
    if isinstance(value, TupleValue):
        parts = [rebuild_expr(v, ns, tensor_exprs) for v in value.items]
        if value.cls is tuple:
            return f"({', '.join(parts)}{',' if len(parts) == 1 else ''})"
        if value.cls is torch.Size:
            return f"torch.Size([{', '.join(parts)}])"
        if hasattr(value.cls, "n_fields"):   # a C struct sequence (torch.return_types.*)
            return f"{ns.ref(value.cls, 'cls')}(({', '.join(parts)},))"
        return f"{ns.ref(value.cls, 'cls')}({', '.join(parts)})"
    if isinstance(value, ListValue):
        return f"[{', '.join(rebuild_expr(v, ns, tensor_exprs) for v in value.items)}]"
    if isinstance(value, DictValue):
        body = ", ".join(f"{_key_expr(k, ns)}: {rebuild_expr(v, ns, tensor_exprs)}" for k, v in value.items.items())
        if value.cls is dict:
            return f"{{{body}}}"
        return f"{ns.ref(value.cls, 'cls')}({{{body}}})"
    if isinstance(value, ObjectValue):
        if value.source is not None:
            return ns.source(value.source)
        return ns.ref(value.obj, "obj")
    raise Unsupported(f"returning {type(value).__name__} from a compiled function is not supported yet")


def _key_expr(k, ns):
    if isinstance(k, (str, int, bool)) or k is None:
        return repr(k)
    return ns.ref(k)


def generate(name, params, graph_inputs, compiled_fn, returned, outputs, fn_globals, uses_graph):
    """Source and function object of the transformed function.

    ``outputs`` are the graph's output values in order; ``uses_graph`` is False
    when the graph holds no operations and is not called at all.
    """
    ns = Namespace(fn_globals)
    lines = []
    tensor_exprs = {}
    if uses_graph:
        ns.ns["__compiled_fn"] = compiled_fn
        args = ", ".join(ns.source(inp.source) for inp in graph_inputs)
        lines.append(f"__out = __compiled_fn({args})")
        for i, v in enumerate(outputs):
            tensor_exprs.setdefault(id(v), f"__out[{i}]")
    else:
        by_node = {inp.node: inp for inp in graph_inputs}
        for v in outputs:
            inp = by_node.get(v.node)
            if inp is not None:
                tensor_exprs[id(v)] = ns.source(inp.source)
            else:   # a parameter or buffer, read through get_attr
                tensor_exprs[id(v)] = ns.ref(_state_tensor(v, compiled_fn), "state")
    lines.append(f"return {rebuild_expr(returned, ns, tensor_exprs)}")
    src = f"def {name}({', '.join(params)}):\n" + "".join(f"    {l}\n" for l in lines)
    filename = f"<bytegraph {name}>"
    linecache.cache[filename] = (len(src), None, src.splitlines(True), filename)
    exec(compile(src, filename, "exec"), ns.ns)
    return ns.ns[name], src


def _state_tensor(v, gm):
    return getattr(gm, v.node.target)

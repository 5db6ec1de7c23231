"""Building the FX graph, with every node's output computed on fake tensors.

The tracer asks for graph inputs (tensors read from sources), module state
(parameters and buffers, reached through ``get_attr``) and calls; each call
runs once on fake tensors so shapes, dtypes and devices are known without
running anything real.
"""
import operator
import re
import time

import warnings

import torch
import torch.fx as fx
from torch._subclasses.fake_tensor import (
    DataDependentOutputException, DynamicOutputShapeException, FakeTensorMode,
)

from ..errors import Unsupported
from ..values.base import (ConstantValue, DictValue, ListValue, ObjectValue, SliceValue,
                           SymValue, TensorValue, TupleValue)
from .shapes import Shapes


class GraphInput:
    """One placeholder: the source it is read from and the value seen at trace time."""
    __slots__ = ("source", "example", "node")

    def __init__(self, source, example, node):
        self.source = source
        self.example = example
        self.node = node


class GraphBuilder:
    def __init__(self):
        self.graph = fx.Graph()
        self.fake_seconds = 0.0       # time spent running calls on fake tensors
        self.shapes = Shapes()
        self.fake_mode = FakeTensorMode(allow_non_fake_inputs=False, shape_env=self.shapes.env)
        self.inputs = []              # GraphInput, in placeholder order
        self.state_root = torch.nn.Module()   # holds parameters and buffers for get_attr
        self._state_names = {}        # id(tensor) -> attribute name on state_root
        self._last_placeholder = None
        self._names = set()

    # --- inputs -----------------------------------------------------------

    def fake(self, tensor):
        return self.fake_mode.from_tensor(tensor, static_shapes=True)

    def _placeholder(self, source):
        name = self._unique(_identifier(source.name()))
        if self._last_placeholder is None:
            first = next(iter(self.graph.nodes), None)
            ctx = self.graph.inserting_before(first)
        else:
            ctx = self.graph.inserting_after(self._last_placeholder)
        with ctx:
            node = self.graph.placeholder(name)
        self._last_placeholder = node
        return node

    def add_input(self, tensor, source, dynamic_dims=None):
        """A tensor argument; ``dynamic_dims`` maps dims to (min, max) for symbolic sizes."""
        node = self._placeholder(source)
        # Describing a tensor reads its .grad, which warns for non-leaf tensors: our read,
        # not the user's (and fatal under -W error).
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            if dynamic_dims:
                fake = self.shapes.fake_dynamic(self.fake_mode, tensor, source, dynamic_dims)
            else:
                fake = self.fake(tensor)
        node.meta["example_value"] = fake
        self.inputs.append(GraphInput(source, tensor, node))
        return TensorValue(node, fake, source, cls=type(tensor))

    def add_sym_input(self, value, source):
        """An int argument that is symbolic in the graph."""
        node = self._placeholder(source)
        sym = self.shapes.symint(value, source)
        node.meta["example_value"] = sym
        self.inputs.append(GraphInput(source, value, node))
        return SymValue(node, sym, source)

    def example_inputs(self):
        """What the backend is handed: real values, or fake ones when sizes are symbolic."""
        if self.shapes.has_symbols:
            return [inp.node.meta["example_value"] for inp in self.inputs]
        return [inp.example for inp in self.inputs]

    def size_value(self, tensor_value, dim):
        """``tensor.size(dim)`` as a value: a constant, or a SymValue read in the graph."""
        size = tensor_value.fake.shape[dim]
        if not isinstance(size, torch.SymInt):
            return ConstantValue(size)
        node = self.graph.create_node("call_method", "size", (tensor_value.node, dim), {})
        node.meta["example_value"] = size
        return SymValue(node, size)

    def sym_call(self, target, args):
        """Arithmetic on symbolic ints: a graph node, or a constant if the result is known."""
        node_args, example_args = _unwrap(args)
        result = target(*example_args)
        if isinstance(result, torch.SymInt):
            node = self.graph.create_node("call_function", target, tuple(node_args), {})
            node.meta["example_value"] = result
            return SymValue(node, result)
        if isinstance(result, torch.SymBool):
            return ConstantValue(bool(result))    # decides here; ShapeEnv records the guard
        if isinstance(result, torch.SymFloat):
            raise Unsupported("symbolic float arithmetic is not supported yet")
        return ConstantValue(result)

    def add_module_state(self, tensor, source, is_parameter):
        """A parameter or buffer of an nn.Module, read in the graph through get_attr."""
        name = self._state_names.get(id(tensor))
        if name is None:
            name = self._unique(_identifier(source.name()))
            self._state_names[id(tensor)] = name
            if is_parameter:
                self.state_root.register_parameter(name, tensor)
            else:
                self.state_root.register_buffer(name, tensor)
        node = self.graph.get_attr(name)
        fake = self.fake(tensor)
        node.meta["example_value"] = fake
        return TensorValue(node, fake, source, cls=type(tensor))

    def _unique(self, base):
        name, i = base, 1
        while name in self._names:
            name = f"{base}_{i}"
            i += 1
        self._names.add(name)
        return name

    # --- calls ------------------------------------------------------------

    def call(self, kind, target, args, kwargs, describe=None):
        """Add a call node and return its result as values.

        ``kind`` is "call_function" or "call_method"; args/kwargs are values.
        """
        node_args, fake_args = _unwrap(args)
        node_kwargs, fake_kwargs = _unwrap(kwargs)
        t0 = time.perf_counter()
        try:
            with self.fake_mode:
                if kind == "call_method":
                    self_fake, *rest = fake_args
                    result = getattr(self_fake, target)(*rest, **fake_kwargs)
                else:
                    result = target(*fake_args, **fake_kwargs)
        except (DataDependentOutputException, DynamicOutputShapeException) as e:
            raise Unsupported(f"{describe or _target_name(target)} has a data-dependent output ({type(e).__name__})",
                              hint="move the data-dependent part out of the compiled function") from e
        except Unsupported:
            raise
        except Exception as e:
            raise Unsupported(
                f"{describe or _target_name(target)} raised {type(e).__name__} while tracing: {e}") from e
        finally:
            self.fake_seconds += time.perf_counter() - t0
        node = self.graph.create_node(kind, target, tuple(node_args), dict(node_kwargs))
        return self.wrap_result(node, result, fake_args, fake_kwargs, args, kwargs)

    def wrap_result(self, node, result, fake_args, fake_kwargs, args, kwargs):
        if isinstance(result, torch.Tensor):
            same = _find_alias(result, args, kwargs)
            if same is not None:
                # In-place op: the result is the argument itself; keep one value.
                return same
            node.meta["example_value"] = result
            return TensorValue(node, result)
        if isinstance(result, (tuple, list)) and any(isinstance(r, (torch.Tensor, torch.SymInt)) for r in result):
            node.meta["example_value"] = result
            items = []
            for i, r in enumerate(result):
                if isinstance(r, (torch.Tensor, torch.SymInt)):
                    g = self.graph.create_node("call_function", operator.getitem, (node, i), {})
                    g.meta["example_value"] = r
                    items.append(TensorValue(g, r) if isinstance(r, torch.Tensor) else SymValue(g, r))
                else:
                    items.append(_constant_result(r))
            if isinstance(result, list):
                return ListValue(items)
            cls = type(result)
            keep = hasattr(cls, "_fields") or _structseq(cls) or cls is torch.Size
            return TupleValue(items, cls=cls if keep else tuple)
        if isinstance(result, torch.SymInt):
            node.meta["example_value"] = result
            return SymValue(node, result)
        # No tensor came out (a size, a flag...): nothing to compute at run time,
        # unless the call mutates its arguments.
        if not node.users and not _mutates(node.target):
            self.graph.erase_node(node)
        return _constant_result(result)

    def output(self, values):
        """Finish the graph returning ``values`` (TensorValues, SymValues); return the GraphModule."""
        self.graph.output(tuple(v.node for v in values))
        # Inputs read but never used (an unused argument, an untouched list item) are dropped.
        for inp in list(self.inputs):
            if not inp.node.users:
                self.graph.erase_node(inp.node)
                self.inputs.remove(inp)
        gm = fx.GraphModule(self.state_root, self.graph)
        gm.graph.lint()
        return gm


def _mutates(target):
    if target is operator.setitem or target is operator.delitem:
        return True
    name = target if isinstance(target, str) else getattr(target, "__name__", "")
    return name.endswith("_") and not name.endswith("__") or name.startswith("_foreach")


def _structseq(cls):
    return cls is not tuple and issubclass(cls, tuple) and hasattr(cls, "n_fields")


def _constant_result(r):
    if isinstance(r, torch.Tensor):
        raise Unsupported("tensor in an unexpected position of a result")
    if isinstance(r, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        raise Unsupported("symbolic size in an unexpected position of a result")
    if isinstance(r, (tuple, list)):
        items = [_constant_result(x) for x in r]
        return ListValue(items) if isinstance(r, list) else TupleValue(items, cls=type(r) if type(r) is torch.Size else tuple)
    return ConstantValue(r)


def _find_alias(result, args, kwargs):
    for v in list(args) + list(kwargs.values()):
        if isinstance(v, TensorValue) and v.fake is result:
            return v
    return None


def _unwrap(obj):
    """Values -> (what goes in the FX node, what the fake run receives)."""
    if isinstance(obj, dict):
        pairs = {k: _unwrap(v) for k, v in obj.items()}
        return {k: p[0] for k, p in pairs.items()}, {k: p[1] for k, p in pairs.items()}
    if isinstance(obj, (list, tuple)):
        pairs = [_unwrap(v) for v in obj]
        return [p[0] for p in pairs], [p[1] for p in pairs]
    if isinstance(obj, TensorValue):
        return obj.node, obj.fake
    if isinstance(obj, SymValue):
        return obj.node, obj.sym
    if isinstance(obj, ConstantValue):
        return obj.value, obj.value
    if isinstance(obj, TupleValue):
        nodes, fakes = _unwrap(obj.items)
        if obj.cls is torch.Size:
            # A size holding symbolic dims is a plain tuple in the graph (torch.Size takes only ints).
            graph_side = tuple(nodes) if any(isinstance(n, fx.Node) for n in nodes) else torch.Size(nodes)
            return graph_side, torch.Size(fakes)
        return tuple(nodes), tuple(fakes)
    if isinstance(obj, ListValue):
        return _unwrap(obj.items)
    if isinstance(obj, DictValue):
        return _unwrap(obj.items)
    if isinstance(obj, SliceValue):
        (a, b, c), (fa, fb, fc) = _unwrap([obj.start, obj.stop, obj.step])
        return slice(a, b, c), slice(fa, fb, fc)
    if isinstance(obj, ObjectValue) and _is_plain_constant(obj.obj):
        return obj.obj, obj.obj
    raise Unsupported(f"cannot pass {obj!r} to a graph operation")


def _is_plain_constant(o):
    return isinstance(o, (torch.dtype, torch.device, torch.layout, torch.memory_format, type(None),
                          int, float, bool, str)) or o is Ellipsis


def _target_name(target):
    if isinstance(target, str):
        return f"Tensor.{target}"
    mod = getattr(target, "__module__", None) or ""
    name = getattr(target, "__qualname__", None) or getattr(target, "__name__", repr(target))
    return f"{mod}.{name}" if mod else name


def _identifier(text):
    name = re.sub(r"\W+", "_", text).strip("_") or "x"
    if name[0].isdigit():
        name = "_" + name
    return name.lower() if name.startswith("global_") else name

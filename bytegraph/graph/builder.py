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
from torch.utils import _pytree as pytree
from torch._subclasses.fake_tensor import (
    DataDependentOutputException, DynamicOutputShapeException, FakeTensorMode,
)

from ..errors import Unsupported
from ..values.base import (ConstantValue, DictValue, FloatTensorValue, ListValue, ObjectValue, SliceValue,
                           SubgraphValue, SymValue, TensorValue, TupleValue)
from . import scalars
from .shapes import Shapes


class GraphInput:
    """One placeholder: the source it is read from and the value seen at trace time.

    ``scalar``: the source holds a Python float, handed to the graph as a 0-d float64 tensor."""
    __slots__ = ("source", "example", "node", "scalar")

    def __init__(self, source, example, node, scalar=False):
        self.source = source
        self.example = example
        self.node = node
        self.scalar = scalar


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
        if fake.grad_fn is not None:
            # The input's own autograd edge: an in-place op later in the trace moves grad_fn
            # (backends.grad_presence needs where the input's gradient leaves the graph).
            node.meta["input_grad_edge"] = (fake.grad_fn, fake.output_nr)
        self.inputs.append(GraphInput(source, tensor, node))
        return TensorValue(node, fake, source, cls=type(tensor))

    def add_sym_input(self, value, source):
        """An int argument that is symbolic in the graph."""
        node = self._placeholder(source)
        sym = self.shapes.symint(value, source)
        node.meta["example_value"] = sym
        self.inputs.append(GraphInput(source, value, node))
        return SymValue(node, sym, source)

    def add_float_input(self, value, source, guard):
        """A float argument that changes between calls: a 0-d float64 tensor input of the graph
        (``guard`` installs the guard fixing it, if it must be specialised after all)."""
        node = self._placeholder(source)
        example = torch.tensor(value, dtype=torch.float64)
        fake = self.fake(example)
        node.meta["example_value"] = fake
        self.inputs.append(GraphInput(source, example, node, scalar=True))
        return FloatTensorValue(node, fake, value, (guard,))

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
        node = self.graph.create_node("call_method", "size", (self.node_of(tensor_value), dim), {})
        node.meta["example_value"] = size
        return SymValue(node, size)

    def sym_call(self, target, args):
        """Arithmetic on symbolic ints: a graph node, or a constant if the result is known."""
        node_args, example_args = _unwrap(args, self.node_of)
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
        node.meta["real_tensor"] = tensor    # a dict key by identity (optimizer state per parameter)
        return TensorValue(node, fake, source, cls=type(tensor))

    def real_tensor(self, value):
        """The real tensor a graph input or module-state value stands for (None for computed ones)."""
        node = value.node
        if node.op == "get_attr":
            return node.meta.get("real_tensor")
        if node.op == "placeholder":
            for inp in self.inputs:
                if inp.node is node:
                    return inp.example
        return None

    def node_of(self, value):
        """The node standing for a tensor/symbolic-int value (or a subgraph) in this graph."""
        if isinstance(value, SubgraphValue):
            return self.add_subgraph(value)
        return value.node

    def add_subgraph(self, value):
        """A traced function body (SubgraphValue) as a submodule, read through get_attr."""
        name = self._unique(value.name)
        self.state_root.add_module(name, value.gm)
        node = self.graph.get_attr(name)
        return node

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

        ``kind`` is "call_function" or "call_method"; args/kwargs are values. Floats that
        change between calls (FloatTensorValue) are passed as tensors where the op takes them
        (``scalars.tensorize``); where it does not, they are specialised.
        """
        if _has_scalar_tensors(args, kwargs):
            last = self.graph._root.prev    # nodes added from here on are the rewrite's
            try:
                rewritten = scalars.tensorize(self, kind, target, list(args), dict(kwargs))
                if rewritten is not None:
                    return self._call(*rewritten, describe=describe)
            except Unsupported:
                # The op does not take a tensor there: drop what the rewrite added, specialise.
                while self.graph._root.prev is not last:
                    self.graph.erase_node(self.graph._root.prev)
        return self._call(kind, target, args, kwargs, describe)

    def _call(self, kind, target, args, kwargs, describe=None):
        node_args, fake_args = _unwrap(args, self.node_of)
        node_kwargs, fake_kwargs = _unwrap(kwargs, self.node_of)
        t0 = time.perf_counter()
        try:
            grad_check = _BackwardCheck.needed(kind, target, fake_args, fake_kwargs)
            with self.fake_mode:
                if kind == "call_method":
                    self_fake, *rest = fake_args
                    result = getattr(self_fake, target)(*rest, **fake_kwargs)
                else:
                    result = target(*fake_args, **fake_kwargs)
                if grad_check is not None:
                    grad_check.run(fake_args, fake_kwargs)
        except (DataDependentOutputException, DynamicOutputShapeException) as e:
            raise _data_dependent(describe or _target_name(target), e, backward=False) from e
        except _BackwardDataDependent as e:
            raise _data_dependent(describe or _target_name(target), e.__cause__, backward=True) from e
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


def _data_dependent(what, exc, backward):
    """The graph break for an op whose result (or gradient) has a size or value only the data decides."""
    op = getattr(exc, "func", None)
    op = f" ({op})" if op is not None else ""
    if isinstance(exc, DataDependentOutputException):
        kind = "needs a tensor's value as a Python number"
    else:
        kind = "has an output whose shape depends on tensor data"
    if backward:
        reason = f"the gradient of {what} {kind}{op}"
    else:
        reason = f"{what} {kind}{op}"
    return Unsupported(reason, hint="without fullgraph=True the graph breaks here: the op runs natively and "
                                    "tracing resumes after it with its result as a graph input")


class _BackwardDataDependent(Exception):
    """Internal: an op's backward raised a data-dependent exception on fake tensors (the cause)."""


class _BackwardCheck:
    """Runs one op's backward on fake tensors, to find gradients whose shapes depend on data.

    AOTAutograd traces the backward of every graph that needs gradients; an op whose forward has
    static shapes can still have a backward that does not (``y[mask] = v`` or ``index_put`` with
    a boolean mask and a ``v`` that needs grad; ``index_fill`` with a tensor value). Such a backward
    would make the backend fail, so the op breaks the graph like a data-dependent forward does.
    The data-dependent backwards known come from index or mask arguments, so the check runs for
    ops that take a bool or integer tensor and an input that needs grad (any other that a backend
    meets makes it run that graph uncompiled: backends._common.run_uncompiled); the op runs once more on
    fresh fake arguments (so the traced tensors' autograd history is untouched) and is
    differentiated back to them. The answer is kept per op and argument signature (``_CLEAN``).
    """
    __slots__ = ("key", "kind", "target")

    def __init__(self, key, kind, target):
        self.key = key
        self.kind = kind
        self.target = target

    @classmethod
    def needed(cls, kind, target, fake_args, fake_kwargs):
        if not torch.is_grad_enabled():
            return None
        tensors = [t for t in pytree.tree_leaves((fake_args, fake_kwargs)) if isinstance(t, torch.Tensor)]
        if not any(t.requires_grad for t in tensors):
            return None
        if all(t.is_floating_point() or t.is_complex() for t in tensors):
            return None
        key = _signature(kind, target, fake_args, fake_kwargs)
        if key is not None and key in _CLEAN:
            return None
        return cls(key, kind, target)

    def run(self, fake_args, fake_kwargs):
        """Raises _BackwardDataDependent if the op's backward has a data-dependent size."""
        fresh = {}
        leaves = []

        def copy(t):
            if id(t) not in fresh:
                c = torch.empty_strided(t.size(), t.stride(), dtype=t.dtype, device=t.device)
                if t.requires_grad:
                    leaves.append(c.requires_grad_())
                    c = c.clone()       # not a leaf, so in-place ops on it are allowed
                fresh[id(t)] = c
            return fresh[id(t)]

        try:
            args, kwargs = pytree.tree_map_only(torch.Tensor, copy, (list(fake_args), dict(fake_kwargs)))
            copies = list(fresh.values())
            versions = [c._version for c in copies]
            if self.kind == "call_method":
                result = getattr(args[0], self.target)(*args[1:], **kwargs)
            else:
                result = self.target(*args, **kwargs)
            # Outputs needing grad: what the op returned, and the arguments it changed in place.
            outputs = [t for t in pytree.tree_leaves(result) if isinstance(t, torch.Tensor) and t.requires_grad]
            outputs += [c for c, v in zip(copies, versions) if c._version != v and c.requires_grad]
            if outputs:
                torch.autograd.grad(outputs, leaves, [torch.zeros_like(o) for o in outputs], allow_unused=True)
        except (DataDependentOutputException, DynamicOutputShapeException) as e:
            raise _BackwardDataDependent() from e
        except Exception:
            return      # a fake backward that cannot run here: no verdict (the backend will tell)
        if self.key is not None:
            _CLEAN.add(self.key)


_CLEAN = set()     # signatures of ops whose backward was seen to have static shapes


def _signature(kind, target, fake_args, fake_kwargs):
    """A hashable description of a call up to tensor data, or None."""
    def describe(x):
        if isinstance(x, torch.Tensor):
            return ("T", x.dtype, tuple(str(s) for s in x.shape), x.requires_grad, x.device.type)
        if isinstance(x, (int, float, bool, str, type(None), torch.dtype, torch.device)) or x is Ellipsis:
            return (type(x).__name__, x)
        if isinstance(x, slice):
            return ("slice", describe(x.start), describe(x.stop), describe(x.step))
        if isinstance(x, (list, tuple)):
            return (type(x).__name__,) + tuple(describe(i) for i in x)
        if isinstance(x, dict):
            return ("dict",) + tuple((k, describe(v)) for k, v in sorted(x.items()))
        raise TypeError
    try:
        key = (kind, target, describe(list(fake_args)), describe(dict(fake_kwargs)))
        hash(key)
        return key
    except TypeError:
        return None


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


def _unwrap(obj, node_of=None):
    """Values -> (what goes in the FX node, what the fake run receives).

    ``node_of(value)`` gives a tensor's or symbolic int's node in the graph being built (a
    subgraph lifts values of the graph around it as its inputs)."""
    if node_of is None:
        node_of = _own_node
    if isinstance(obj, dict):
        pairs = {k: _unwrap(v, node_of) for k, v in obj.items()}
        return {k: p[0] for k, p in pairs.items()}, {k: p[1] for k, p in pairs.items()}
    if isinstance(obj, (list, tuple)):
        pairs = [_unwrap(v, node_of) for v in obj]
        return [p[0] for p in pairs], [p[1] for p in pairs]
    if isinstance(obj, TensorValue):
        return node_of(obj), obj.fake
    if isinstance(obj, SymValue):
        return node_of(obj), obj.sym
    if isinstance(obj, ConstantValue):
        return obj.value, obj.value
    if isinstance(obj, TupleValue):
        nodes, fakes = _unwrap(obj.items, node_of)
        if obj.cls is torch.Size:
            # A size holding symbolic dims is a plain tuple in the graph (torch.Size takes only ints).
            graph_side = tuple(nodes) if any(isinstance(n, fx.Node) for n in nodes) else torch.Size(nodes)
            return graph_side, torch.Size(fakes)
        return tuple(nodes), tuple(fakes)
    if isinstance(obj, ListValue):
        return _unwrap(obj.items, node_of)
    if isinstance(obj, DictValue):
        return _unwrap(obj.items, node_of)
    if isinstance(obj, SliceValue):
        (a, b, c), (fa, fb, fc) = _unwrap([obj.start, obj.stop, obj.step], node_of)
        return slice(a, b, c), slice(fa, fb, fc)
    if isinstance(obj, ObjectValue) and _is_plain_constant(obj.obj):
        return obj.obj, obj.obj
    if isinstance(obj, SubgraphValue):
        return node_of(obj), obj.gm
    if isinstance(obj, FloatTensorValue):
        value = obj.specialize()      # an argument only a Python number fits
        return value, value
    raise Unsupported(f"cannot pass {obj!r} to a graph operation")


def _has_scalar_tensors(args, kwargs):
    for v in list(args) + list(kwargs.values()):
        if isinstance(v, FloatTensorValue):
            return True
        if isinstance(v, (ListValue, TupleValue)) and any(isinstance(i, FloatTensorValue) for i in v.items):
            return True
        if isinstance(v, TensorValue) and v.fake.dim() == 0 and v is kwargs.get("alpha", kwargs.get("value")):
            return True
    return False


def _own_node(value):
    return value.node


def _is_plain_constant(o):
    return isinstance(o, (torch.dtype, torch.device, torch.layout, torch.memory_format, type(None),
                          int, float, bool, str)) or o is Ellipsis


def _target_name(target):
    if isinstance(target, str):
        return f"Tensor.{target}"
    mod = getattr(target, "__module__", None) or ""
    if mod == "_operator":
        mod = "operator"
    name = getattr(target, "__qualname__", None) or getattr(target, "__name__", repr(target))
    return f"{mod}.{name}" if mod else name


def _identifier(text):
    name = re.sub(r"\W+", "_", text).strip("_") or "x"
    if name[0].isdigit():
        name = "_" + name
    return name.lower() if name.startswith("global_") else name


class SubgraphBuilder(GraphBuilder):
    """The graph of a function body traced inside another graph (handed to a higher-order
    operation: torch.cond, checkpoint, a torch.func transform, a custom autograd Function).

    It shares the enclosing graph's fake mode and shapes. Graph inputs and module state the
    body reads are added to the enclosing graph (where sources are guarded); any tensor of an
    enclosing graph the body uses becomes an input of this one (``lifted``, in first-use order,
    after the explicit inputs the operation passes), so the body is a closed function."""

    def __init__(self, parent):
        self.parent = parent
        self.graph = fx.Graph()
        self.fake_seconds = 0.0
        self.shapes = parent.shapes
        self.fake_mode = parent.fake_mode
        self.inputs = []              # never a source: those are the root graph's
        self.state_root = torch.nn.Module()   # submodules (nested bodies) only
        self._state_names = {}
        self._last_placeholder = None
        self._names = set()
        self.explicit = []            # placeholders the operation passes first
        self.lifted = {}              # node of an enclosing graph -> placeholder here
        self.lifted_values = []       # the enclosing values, in placeholder order
        self._versions = []           # (fake, its version when it became an input)

    def placeholder(self, fake, name):
        """An explicit input of the body (an operand, a transformed argument)."""
        node = self._placeholder_named(name)
        node.meta["example_value"] = fake
        self.explicit.append(node)
        self._versions.append((fake, fake._version))
        return TensorValue(node, fake)

    def _placeholder_named(self, name):
        name = self._unique(_identifier(name))
        if self._last_placeholder is None:
            first = next(iter(self.graph.nodes), None)
            ctx = self.graph.inserting_before(first)
        else:
            ctx = self.graph.inserting_after(self._last_placeholder)
        with ctx:
            node = self.graph.placeholder(name)
        self._last_placeholder = node
        return node

    def node_of(self, value):
        if isinstance(value, SubgraphValue):
            return self.add_subgraph(value)
        node = value.node
        if node.graph is self.graph:
            return node
        placeholder = self.lifted.get(node)
        if placeholder is None:
            placeholder = self._placeholder_named(node.name)
            example = value.fake if isinstance(value, (TensorValue, FloatTensorValue)) else value.sym
            placeholder.meta["example_value"] = example
            self.lifted[node] = placeholder
            self.lifted_values.append(value)
            if isinstance(example, torch.Tensor):
                self._versions.append((example, example._version))
        return placeholder

    def add_input(self, tensor, source, dynamic_dims=None):
        return self.parent.add_input(tensor, source, dynamic_dims)

    def add_sym_input(self, value, source):
        return self.parent.add_sym_input(value, source)

    def add_module_state(self, tensor, source, is_parameter):
        return self.parent.add_module_state(tensor, source, is_parameter)

    def add_float_input(self, value, source, guard):
        return self.parent.add_float_input(value, source, guard)

    def real_tensor(self, value):
        return self.parent.real_tensor(value) if value.node.graph is not self.graph else None

    def example_inputs(self):
        raise AssertionError("a subgraph has no example inputs of its own")

    def mutated_inputs(self):
        """True if the body changed one of its inputs in place."""
        return any(fake._version != version for fake, version in self._versions)

    def finish(self, values, clone_inputs=False):
        """The body's GraphModule returning ``values`` (a flat list of tensor values).

        ``clone_inputs``: an input returned as it is (or a view of one) is cloned, for operations
        whose outputs must not alias their inputs (torch.cond)."""
        outputs = []
        inputs = set(self.explicit) | set(self.lifted.values())
        for v in values:
            node = self.node_of(v)
            if clone_inputs and isinstance(v, TensorValue) and (node in inputs or _is_view_of_input(v, inputs)):
                node = self.graph.call_function(torch.clone, (node,))
                node.meta["example_value"] = v.fake
            outputs.append(node)
        self.graph.output(tuple(outputs))
        gm = fx.GraphModule(self.state_root, self.graph)
        gm.graph.lint()
        return gm


def _is_view_of_input(value, inputs):
    storage = value.fake.untyped_storage()._cdata
    for node in inputs:
        fake = node.meta.get("example_value")
        if isinstance(fake, torch.Tensor) and fake.untyped_storage()._cdata == storage:
            return True
    return False

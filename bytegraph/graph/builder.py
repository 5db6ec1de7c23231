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
from torch._dispatch.python import enable_python_dispatcher
from torch._subclasses.fake_tensor import (
    DataDependentOutputException, DynamicOutputShapeException, FakeTensor, FakeTensorMode,
)

from ..errors import Unsupported
from ..guards.sources import TensorItemSource
from ..values import arrays
from ..values.arrays import NdarrayValue
from ..values.base import (ConstantValue, DictValue, FloatTensorValue, ListValue, ObjectValue, SubgraphValue,
                           SymValue, TensorValue, TupleValue)
from . import scalars, unbacked
from .call_values import (  # noqa: F401 (_example, _mutates, _identifier: read from here by other modules)
    _INT_ARITHMETIC, _constant_result, _example, _find_alias, _has_scalar_tensors, _holds_traced, _identifier,
    _input_storages, _is_data_input, _is_data_source, _meta_like, _mutates, _quiet_meta_failures, _storage_key,
    _structseq, _swap_values, _target_name, _tensor_values, _tensors_of, _unwrap, _writes_call,
    new_fake)
from .data_dependent import BackwardCheck, BackwardDataDependent, data_dependent
from .fake_memo import FakeMemo
from .printing import printable
from .shapes import Shapes
from .state_root import graph_module, register_state


def _run_fake(kind, target, fake_args, fake_kwargs):
    """``target`` on fakes. Some ops' C++ kernels take only concrete sizes (``constant_pad_nd``,
    what ``F.pad`` runs, with a symbolic pad: ``create_block_mask`` under ``dynamic=True``); their
    Python decompositions take symbolic ones and are reached through the Python dispatcher, so
    such a call is run again with it on (not always: it slows every other fake call down)."""
    def run():
        if kind == "call_method":
            self_fake, *rest = fake_args
            return getattr(self_fake, target)(*rest, **fake_kwargs)
        return target(*fake_args, **fake_kwargs)
    try:
        return run()
    except RuntimeError as e:
        if "expected to contain only concrete integers" not in str(e):
            raise
    with enable_python_dispatcher():
        return run()


class GraphInput:
    """One placeholder: the source it is read from and the value seen at trace time.

    For an np.ndarray read through ``source``, ``example`` is the tensor it is traced as and
    ``array_mode`` says how the transformed function makes that tensor (values/arrays.py:
    SHARE its memory, or COPY it; ``writeable``: the array's flag). ``scalar``: the source holds
    a Python float, handed to the graph as a 0-d float64 tensor.
    """
    __slots__ = ("source", "example", "node", "array_mode", "writeable", "version", "array", "scalar")

    def __init__(self, source, example, node, array_mode=None, writeable=True, array=None, scalar=False):
        self.source = source
        self.example = example
        self.node = node
        self.array_mode = array_mode
        self.writeable = writeable
        self.version = None
        self.array = array          # the np.ndarray itself (its memory, for overlap checks)
        self.scalar = scalar

    def mutated(self):
        """Whether the graph changed this input in place (its fake tensor's version moved)."""
        fake = self.node.meta.get("example_value")
        return self.version is not None and isinstance(fake, torch.Tensor) and fake._version != self.version


class GraphBuilder:
    # (class defaults too: SubgraphBuilder does not run this __init__)
    function_subclass_off = 0
    function_subclass_inputs = False
    function_modes = ()
    modes_around_call = 0
    modes_at_entry = ()
    function_modes_off = 0
    _fake_memo = None     # FakeMemo: fake results of repeated calls (graph/fake_memo.py)

    def __init__(self):
        self.graph = fx.Graph()
        self.fake_seconds = 0.0       # time spent running calls on fake tensors
        self.shapes = Shapes()
        self.fake_mode = FakeTensorMode(allow_non_fake_inputs=False, shape_env=self.shapes.env)
        self.inputs = []              # GraphInput, in placeholder order
        self.state_root = torch.nn.Module()   # holds parameters and buffers for get_attr
        self._state_names = {}        # id(tensor) -> attribute name on state_root
        self._state_fakes = {}        # id(tensor) -> its fake (the tensor is kept alive by state_root)
        self.state_sources = {}       # attribute name on state_root -> (source, is a parameter)
        self._last_placeholder = None
        self._names = set()
        # node -> why it may not be used by another node: a tensor whose requires_grad the trace
        # changed (the change is done after the graph, so later uses belong to a new graph).
        self.frozen = {}
        # node -> a function of the reason giving the break for a use of that frozen node (where
        # the frame splits: the trace knows where the change was made); absent: a plain break.
        self.frozen_breaks = {}
        # Storages (of fake tensors) no op may mutate from here on: a tensor formatted into text
        # that is made after the graph. storage id -> why.
        self.no_mutation = {}
        self.data_written = {}        # storage of t -> reason: t.data changed in place in this graph
        self.data_inputs = {}         # source of t -> the value of t.data (one input however often read)
        # > 0 while a __torch_function__ override runs its func (subclass dispatch off, as in
        # torch.Tensor.__torch_function__); else a value of such a class may not reach a node.
        self.function_subclass_off = 0
        self.function_subclass_inputs = False   # the graph takes one: it runs with subclass dispatch off
        # The TorchFunctionModes a torch call meets now, outermost first (values; trace/torch_api/
        # function_modes.py): a mode is off this list while its __torch_function__ runs. While it
        # is not empty no node is added but through them.
        self.function_modes = []
        self.modes_around_call = 0    # how many were around the call: the graph runs with them off
        # The values of those modes: the real stack the generated code finds (codegen sets it
        # to function_modes before a native step and before returning).
        self.modes_at_entry = ()
        self.function_modes_off = 0   # > 0 inside `with torch._C.DisableTorchFunction()`

    def share_fake_results(self, results):
        """Remember fake results in ``results`` (a table shared with other traces of one compiler)."""
        self._fake_memo = FakeMemo(self.fake_mode, results)

    # --- inputs -----------------------------------------------------------

    def fake(self, tensor):
        return self.fake_mode.from_tensor(tensor, static_shapes=True)

    def _placeholder(self, source):
        return self._placeholder_named(source.name())

    def _placeholder_named(self, name):
        """A new placeholder after the last one (inputs stay first and in order)."""
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

    def add_input(self, tensor, source, dynamic_dims=None, inner_dynamic_dims=None):
        """A tensor argument; ``dynamic_dims`` maps dims to (min, max) for symbolic sizes
        (``inner_dynamic_dims``: those of a wrapper subclass's inner tensors, by name)."""
        node = self._placeholder(source)
        # Describing a tensor reads its .grad, which warns for non-leaf tensors: our read,
        # not the user's (and fatal under -W error).
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            if inner_dynamic_dims:
                fake = self.shapes.fake_dynamic_subclass(self.fake_mode, tensor, source, dynamic_dims or {},
                                                         inner_dynamic_dims or {})
            elif dynamic_dims:
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

    def add_ndarray_input(self, array, source, device, dynamic_dims=None):
        """An np.ndarray argument, traced as a tensor over its data (values/arrays.py);
        ``dynamic_dims`` as for ``add_input``."""
        mode = arrays.input_mode(array, device)
        tensor = arrays.array_to_tensor(array) if mode == arrays.SHARE else arrays.array_to_tensor_copy(array)
        node = self._placeholder(source)
        if dynamic_dims:
            fake = self.shapes.fake_dynamic(self.fake_mode, tensor, source, dynamic_dims, array=True)
        else:
            fake = self.fake(tensor)
        node.meta["example_value"] = fake
        inp = GraphInput(source, tensor, node, array_mode=mode, writeable=bool(array.flags.writeable), array=array)
        inp.version = fake._version
        self.inputs.append(inp)
        return NdarrayValue(node, fake, source)

    def add_sym_input(self, value, source):
        """An int argument that is symbolic in the graph."""
        node = self._placeholder(source)
        sym = self.shapes.symint(value, source)
        node.meta["example_value"] = sym
        self.inputs.append(GraphInput(source, value, node))
        return SymValue(node, sym, source)

    def add_float_input(self, value, source, guard, decide=None):
        """A float argument that changes between calls: a 0-d float64 tensor input of the graph
        (``guard`` installs the guard fixing it, if it must be specialised after all; ``decide``
        the one fixing a comparison's outcome, see ``FloatTensorValue``)."""
        node = self._placeholder(source)
        example = torch.tensor(value, dtype=torch.float64)
        fake = self.fake(example)
        node.meta["example_value"] = fake
        self.inputs.append(GraphInput(source, example, node, scalar=True))
        return FloatTensorValue(node, fake, value, (guard,), decide)

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
        if unbacked.involves_unbacked(result):
            # Computed from a number only the graph knows: a node, decided by no guard.
            known = unbacked.decided(result) if isinstance(result, torch.SymBool) else None
            if known is not None:
                return ConstantValue(known)
            node = self.graph.create_node("call_function", printable(target, node_args), tuple(node_args), {})
            node.meta["example_value"] = result
            return SymValue(node, result)
        if isinstance(result, torch.SymInt):
            node = self.graph.create_node("call_function", printable(target, node_args), tuple(node_args), {})
            node.meta["example_value"] = result
            return SymValue(node, result)
        if isinstance(result, torch.SymBool):
            return ConstantValue(bool(result))    # decides here; ShapeEnv records the guard
        if isinstance(result, torch.SymFloat):
            raise Unsupported("symbolic float arithmetic is not supported yet")
        return ConstantValue(result)

    def add_module_state(self, tensor, source, is_parameter, source_name=None):
        """A parameter or buffer of an nn.Module, read in the graph through get_attr
        (``source_name``: ``source.name()``, when the caller has it already)."""
        name = self._state_names.get(id(tensor))
        if name is None:
            name = self._unique(_identifier(source_name or source.name()))
            self._state_names[id(tensor)] = name
            self.state_sources[name] = (source, is_parameter)
            register_state(self.state_root, name, tensor, is_parameter)
        node = self.get_attr_node(name)
        fake = self._state_fakes.get(id(tensor))
        if fake is None:
            fake = self._state_fakes[id(tensor)] = self._state_fake(tensor)
        node.meta["example_value"] = fake
        node.meta["real_tensor"] = tensor    # a dict key by identity (optimizer state per parameter)
        value = TensorValue(node, fake, source, cls=type(tensor))
        if _function_subclass_of(value) is not None:
            self.function_subclass_inputs = True   # run with subclass dispatch off, as its inputs
        return value

    def add_layer_state(self, entries):
        """``add_module_state`` for each ``(tensor, source, is_parameter, name text)`` of a stamped
        layer (trace/nn/region_stamps.py): the values, in order. A plain tensor no trace read yet
        takes the short way (the same name, node, fake and registration, without the checks and
        calls a read of any state makes: a deep model stamps hundreds); anything else is
        ``add_module_state``'s."""
        names, fakes, sources, root = self._state_names, self._state_fakes, self.state_sources, self.state_root
        values = []
        for tensor, source, is_parameter, text in entries:
            cls = type(tensor)
            if (cls is not torch.Tensor and cls is not torch.nn.Parameter) or id(tensor) in names:
                values.append(self.add_module_state(tensor, source, is_parameter, text))
                continue
            name = self._unique(_identifier(text if text is not None else source.name()))
            names[id(tensor)] = name
            sources[name] = (source, is_parameter)
            register_state(root, name, tensor, is_parameter)
            node = self.get_attr_node(name)
            fake = fakes[id(tensor)] = self._state_fake(tensor)
            meta = node.meta
            meta["example_value"] = fake
            meta["real_tensor"] = tensor
            values.append(TensorValue(node, fake, source, cls))
        return values

    def get_attr_node(self, name):
        """``graph.get_attr(name)`` for a name this builder registered on ``state_root``: the node
        named as fx names it (``_snake_case`` of the target, the name itself when it is lower
        case), without fx's naming work (a deep model reads hundreds of parameters)."""
        if name.islower() and not name.startswith("__"):
            return self.graph.create_node("get_attr", name, name=name)
        return self.graph.get_attr(name)

    def _state_fake(self, tensor):
        """The fake of a parameter or buffer: made straight from a meta tensor when it is a plain
        dense tensor (from_tensor costs ~30x more; deep models have hundreds)."""
        if type(tensor) in _PLAIN_STATE and tensor.layout == torch.strided:
            device = tensor.device
            if device.type != "meta" and not tensor.is_quantized:
                nbytes = tensor.untyped_storage().nbytes()
                if tensor.storage_offset() == 0 and tensor.is_contiguous() \
                        and nbytes == tensor.numel() * tensor.element_size():
                    # (what _meta_like makes of a tensor spanning its whole storage, without
                    # its checks: a real tensor's sizes are ints)
                    meta = torch.empty_strided(tensor.shape, tensor.stride(), dtype=tensor.dtype, device="meta")
                else:
                    meta = _meta_like(tuple(tensor.shape), tensor.stride(), tensor.storage_offset(), tensor.dtype,
                                      tensor.element_size(), nbytes)
                if meta is not None:
                    # Each its own storage: state tensors sharing one are rare, and what fakes
                    # tell the trace (shapes, dtypes) does not depend on it.
                    return new_fake(self.fake_mode, meta, device, tensor.requires_grad)
        return self.fake(tensor)

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
        """The node standing for a tensor/symbolic-int value (or a subgraph, or an opaque
        reference such as a DeviceMesh) in this graph."""
        if isinstance(value, SubgraphValue):
            return self.add_subgraph(value)
        if isinstance(value, ObjectValue):
            return self.add_opaque_reference(value)
        return value.node

    def add_opaque_reference(self, value):
        """An object the graph passes by reference (a DeviceMesh: ``DTensor.from_local(t, mesh,
        ...)``), held by the graph module and read through get_attr. The trace relies on which
        object it is: its identity is guarded where it was read from."""
        value.pin_identity()
        obj = value.obj
        name = self._state_names.get(id(obj))
        if name is None:
            name = self._unique(_identifier(value.source.name() if value.source is not None
                                            else type(obj).__name__.lower()))
            self._state_names[id(obj)] = name
            setattr(self.state_root, name, obj)
        node = self.graph.get_attr(name)
        node.meta["example_value"] = obj
        return node

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
                # Placeholders stay: a body's lifted inputs are remembered (SubgraphBuilder.lifted)
                # and used again by the call that follows.
                node = self.graph._root.prev
                while node is not last:
                    before = node.prev
                    if node.op != "placeholder":
                        self.graph.erase_node(node)
                    node = before
        return self._call(kind, target, args, kwargs, describe)

    def frozen_error(self, node):
        """The graph break for a use of the frozen ``node``."""
        make = self.frozen_breaks.get(node)
        return make(self.frozen[node]) if make is not None else Unsupported(self.frozen[node])

    def _call(self, kind, target, args, kwargs, describe=None):
        if self.function_modes and not self.function_modes_off:
            raise Unsupported(f"{describe or _target_name(target)} under a TorchFunctionMode "
                              f"({_mode_class(self.function_modes[-1]).__qualname__}): "
                              "its __torch_function__ is not traced for this operation",
                              hint="without fullgraph=True it runs eagerly")
        if not self.function_subclass_off:
            overriding = _function_subclass_of((args, kwargs))
            if overriding is not None:
                raise Unsupported(f"{describe or _target_name(target)} on a {overriding.__qualname__}: its "
                                  "__torch_function__ is not traced for this operation",
                                  hint="without fullgraph=True it runs eagerly; x.as_subclass(torch.Tensor) "
                                       "before it if the override does not matter there")
        node_args, fake_args = _unwrap(args, self.node_of)
        node_kwargs, fake_kwargs = _unwrap(kwargs, self.node_of)
        if self.frozen:
            used = []
            fx.node.map_arg((node_args, node_kwargs), used.append)
            for n in used:
                if n in self.frozen:
                    raise self.frozen_error(n)
        writes = _writes_call(target, kwargs)
        if self.data_written or writes:
            self._check_data_aliases(writes, args, kwargs)
        if self.no_mutation and writes:
            for fake in _tensors_of((fake_args, fake_kwargs)):
                reason = self.no_mutation.get(fake.untyped_storage()._cdata)
                if reason is not None:
                    raise Unsupported(reason)
        t0 = time.perf_counter()
        memo = self._fake_memo
        if memo is None or memo.fake_mode is not self.fake_mode:
            memo = self._fake_memo = FakeMemo(self.fake_mode)
        memo_key, memo_tensors = memo.key(kind, target, fake_args, fake_kwargs)
        result = memo.result(memo_key) if memo_key is not None else None
        if result is not None:
            self.fake_seconds += time.perf_counter() - t0
            return self._add_call_node(kind, target, node_args, node_kwargs, result, None, fake_args, fake_kwargs,
                                       args, kwargs)
        versions = [t._version for t in memo_tensors] if memo_key is not None else None
        _quiet_meta_failures[0] += 1
        try:
            grad_check = BackwardCheck.needed(kind, target, fake_args, fake_kwargs)
            with self.fake_mode:
                result = _run_fake(kind, target, fake_args, fake_kwargs)
                bindings = unbacked.bind(self.shapes, result)
                if grad_check is not None:
                    grad_check.run(fake_args, fake_kwargs)
                    unbacked.forget_pending(self.shapes)
        except unbacked.GuardOnDataDependentSymNode as e:
            raise unbacked.guard_break(e) from e
        except (DataDependentOutputException, DynamicOutputShapeException) as e:
            numbered = self._inputs_as_numbers(args, kwargs) if isinstance(e, DataDependentOutputException) else None
            if numbered is not None:
                try:
                    return self._call(kind, target, *numbered, describe=describe)
                except Unsupported:
                    pass
            raise data_dependent(describe or _target_name(target), e, backward=False) from e
        except BackwardDataDependent as e:
            raise data_dependent(describe or _target_name(target), e.__cause__, backward=True) from e
        except Unsupported:
            raise
        except Exception as e:
            # (torch's C++ errors carry a backtrace after their message, some the C++ file they
            # come from before it: of no use to the user)
            message = re.sub(r"^\S+\.(cpp|h|cu):\d+: ", "", str(e).split("\nException raised from ")[0].strip())
            symbolic = "symbolic sizes" in message or "concrete integers" in message
            raise Unsupported(
                f"{describe or _target_name(target)} raised {type(e).__name__} while tracing: {message}",
                hint="this operation has no implementation for symbolic sizes: a shape that changed between "
                     "calls made them symbolic; dynamic=False compiles a graph per shape instead" if symbolic
                else None) from e
        finally:
            _quiet_meta_failures[0] -= 1
            self.fake_seconds += time.perf_counter() - t0
        if memo_key is not None and not bindings:
            memo.remember(memo_key, result, memo_tensors, versions)
        return self._add_call_node(kind, target, node_args, node_kwargs, result, bindings, fake_args, fake_kwargs,
                                   args, kwargs)

    def _add_call_node(self, kind, target, node_args, node_kwargs, result, bindings, fake_args, fake_kwargs,
                       args, kwargs):
        if kind == "call_function":
            target = printable(target, node_args)
        node = self.graph.create_node(kind, target, tuple(node_args), dict(node_kwargs))
        if bindings:
            node.meta["unbacked_bindings"] = bindings
        return self.wrap_result(node, result, fake_args, fake_kwargs, args, kwargs)

    def _inputs_as_numbers(self, args, kwargs):
        """(args, kwargs) with each 0-d int64 tensor among them that is a graph input (or integer
        arithmetic on such inputs and Python ints) replaced by its value as a symbolic int, read
        where the graph is called (``t.item()``, an input of its own); None when there is none.
        An op that takes a Python number there (a size, ``narrow``'s start, an ``arange`` end) then
        computes what eager computes, which reads the number at that point, and the graph goes on
        instead of breaking (torch.compile goes on too, through an unbacked size). Only for inputs
        the graph has not written so far: the number read before the graph must be the one the op
        would read."""
        numbers = {}
        for v in _tensor_values(args, kwargs).values():
            if v.fake.dim() == 0 and v.fake.dtype == torch.int64 and v.fake._version == 0:
                number = self._number_of(v.node, 0)
                if number is not None:
                    numbers[id(v)] = number
        if not numbers:
            return None
        return _swap_values(args, numbers), _swap_values(kwargs, numbers)

    def _number_of(self, node, depth):
        """The SymValue equal to the 0-d int64 tensor ``node`` computes, or None."""
        if not isinstance(node, fx.Node) or depth > 8:
            return None
        fake = node.meta.get("example_value")
        if not isinstance(fake, torch.Tensor) or fake.dim() != 0 or fake.dtype != torch.int64 \
                or fake._version != 0 or fake.requires_grad:
            return None
        if node.op == "placeholder":
            inp = next((i for i in self.inputs if i.node is node), None)
            if inp is None or inp.source is None or type(inp.example) is not torch.Tensor \
                    or inp.example.device.type == "meta" or self._input_storage_written(inp.example):
                return None
            memo = self.__dict__.setdefault("_numbers", {})
            if inp.source not in memo:
                memo[inp.source] = self.add_sym_input(int(inp.example.item()), TensorItemSource(inp.source))
            return memo[inp.source]
        if node.op == "call_function" and node.target in _INT_ARITHMETIC and not node.kwargs:
            operands = []
            for a in node.args:
                if type(a) is int:
                    operands.append(ConstantValue(a))
                else:
                    number = self._number_of(a, depth + 1)
                    if number is None:
                        return None
                    operands.append(number)
            result = self.sym_call(node.target, operands)
            return result if isinstance(result, (SymValue, ConstantValue)) else None
        return None

    def _input_storage_written(self, real):
        """Has the graph so far written an input over ``real``'s storage (``real`` itself, a view)?"""
        key = real.untyped_storage()._cdata
        for inp in self.inputs:
            fake = inp.node.meta.get("example_value")
            if isinstance(fake, torch.Tensor) and fake._version != 0 and isinstance(inp.example, torch.Tensor) \
                    and inp.example.untyped_storage()._cdata == key:
                return True
        return False

    def _check_data_aliases(self, writes, args, kwargs):
        """``t.data`` changed in place (``trace.python.tensor_attrs._tensor_data``): the graph may not also read
        ``t`` or a view of it. AOTAutograd refuses an input mutated through another input that
        shares its storage without being a view of it, and a write it makes back would move
        ``t``'s version (eager's does not: backward then raises where eager's runs)."""
        if self.data_written:
            for v in _tensor_values(args, kwargs).values():
                if _is_data_input(v):
                    continue
                real = self.real_tensor(v) if v.node is not None else None
                reason = self.data_written.get(_storage_key(real)) if real is not None else None
                if reason is not None:
                    raise Unsupported(reason)
        if not writes:
            return
        written = kwargs.get("out", args[0] if args else None)
        for v in _tensor_values([written], {}).values():
            if not _is_data_input(v):
                continue
            base = v.source.base.name()
            reason = (f"{base} is read in a graph that changes {base}.data in place; the graph breaks between "
                      "them (autograd must not see the change)")
            key = _storage_key(self.real_tensor(v))
            if self._reads_storage(key):
                raise Unsupported(reason)
            self.data_written[key] = reason

    def _reads_storage(self, key):
        """Does a node of the graph so far read an input or module state (other than a ``.data``
        alias) over the storage ``key``?"""
        for inp in self.inputs:
            if inp.node.users and isinstance(inp.example, torch.Tensor) and not _is_data_source(inp.source) \
                    and _storage_key(inp.example) == key:
                return True
        return any(n.op == "get_attr" and n.users and _storage_key(n.meta.get("real_tensor")) == key
                   for n in self.graph.nodes)

    def keep_unchanged(self, value, reason):
        """No op of this graph may change ``value``'s storage any more (an in-place op breaks)."""
        self.no_mutation[value.fake.untyped_storage()._cdata] = reason
    def replay_node(self, template, nmap):
        """A copy of ``template`` (a call node made earlier in this graph) over the nodes
        ``nmap`` maps its inputs to, its fake result computed again (trace.nn.blocks)."""
        args = fx.node.map_arg(template.args, nmap.__getitem__)
        kwargs = fx.node.map_arg(template.kwargs, nmap.__getitem__)
        fake_args = fx.node.map_arg(args, _example)
        fake_kwargs = fx.node.map_arg(kwargs, _example)
        target = template.target
        t0 = time.perf_counter()
        try:
            fresh = self._fresh_result(template, kwargs, nmap)
            if fresh is not None:
                result = fresh
            elif target is operator.getitem and isinstance(fake_args[0], (tuple, list)):
                result = fake_args[0][fake_args[1]]
            else:
                with self.fake_mode:
                    if template.op == "call_method":
                        result = getattr(fake_args[0], target)(*fake_args[1:], **fake_kwargs)
                    else:
                        result = target(*fake_args, **fake_kwargs)
            bindings = unbacked.bind(self.shapes, result)
        finally:
            self.fake_seconds += time.perf_counter() - t0
        node = self.graph.create_node(template.op, target, args, kwargs)
        if bindings:
            node.meta["unbacked_bindings"] = bindings
        if "example_value" in template.meta:
            node.meta["example_value"] = result
        return node

    def _fresh_result(self, template, kwargs, nmap):
        """For a copied node whose template produced tensors that need no autograd history
        (nothing required grad): new fake tensors of the same metadata, made straight from meta
        tensors (running the op on fakes costs ~10-50x more); an output that was a view of an
        input is made over the storage of that input's copy. None when the op must run
        (in-place ops, gradients, symbolic sizes, outputs sharing a new buffer...)."""
        example = template.meta.get("example_value")
        if example is None or _mutates(template.target) or "out" in kwargs or kwargs.get("inplace") is True:
            return None
        if isinstance(example, torch.Tensor):
            outputs = [example]
        elif type(example) in (tuple, list) and example and all(isinstance(t, torch.Tensor) for t in example):
            outputs = list(example)
        else:
            return None
        inputs = {}   # storage of a template input -> the fake of that input's copy
        for n in template.all_input_nodes:
            _input_storages(n.meta.get("example_value"), nmap[n].meta.get("example_value"), inputs)
        seen = set()
        items = []
        for t in outputs:
            key = t.untyped_storage()._cdata
            if key in inputs:
                item = self._alias_tensor(t, inputs[key])
            elif key in seen:
                return None
            else:
                seen.add(key)
                item = self._fresh_tensor(t)
            if item is None:
                return None
            items.append(item)
        return items[0] if isinstance(example, torch.Tensor) else type(example)(items)

    def _plain_enough(self, t):
        return type(t) is FakeTensor and not t.requires_grad and t.grad_fn is None \
            and t.layout == torch.strided and getattr(t, "constant", None) is None

    def _fresh_tensor(self, t):
        if not self._plain_enough(t):
            return None
        meta = _meta_like(t.shape, t.stride(), t.storage_offset(), t.dtype, t.element_size(),
                          t.untyped_storage().nbytes())
        return None if meta is None else new_fake(self.fake_mode, meta, t.device)

    def _alias_tensor(self, t, base):
        """A fake with ``t``'s layout over the storage of ``base`` (the copy of the input ``t``
        viewed in the template)."""
        if not self._plain_enough(t) or not self._plain_enough(base) or base.dtype != t.dtype:
            return None
        shape, stride, offset = t.shape, t.stride(), t.storage_offset()
        if not all(type(n) is int for n in shape) or not all(type(n) is int for n in stride) \
                or type(offset) is not int:
            return None
        try:
            with torch._C._DisableTorchDispatch():
                meta = torch.Tensor.as_strided(base, shape, stride, offset)
        except Exception:
            return None
        return FakeTensor(self.fake_mode, meta, t.device)

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
            # An in-place list op (torch._foreach_add_) hands its arguments back: keep their
            # values (a getitem node per item, which nothing reads, made optimizer graphs 2x larger).
            inputs = _tensor_values(args, kwargs) if _mutates(node.target) else {}
            items = []
            for i, r in enumerate(result):
                if id(r) in inputs:
                    items.append(inputs[id(r)])
                elif isinstance(r, (torch.Tensor, torch.SymInt)):
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
        if isinstance(result, torch.SymInt) or unbacked.involves_unbacked(result):
            # (a SymFloat or SymBool: Tensor.item() under capture_scalar_outputs)
            node.meta["example_value"] = result
            return SymValue(node, result)
        # No new tensor came out (a size, a flag, a grouping of the arguments' own tensors...):
        # nothing to compute at run time, unless the call mutates its arguments.
        value = _constant_result(result, _tensor_values(args, kwargs) if _holds_traced(result) else None)
        if not node.users and not _mutates(node.target):
            self.graph.erase_node(node)
        return value

    def output(self, values):
        """Finish the graph returning ``values`` (TensorValues, SymValues); return the GraphModule."""
        self.graph.output(tuple(v.node for v in values))
        # Inputs read but never used (an unused argument, an untouched list item) are dropped.
        for inp in list(self.inputs):
            if not inp.node.users:
                self.graph.erase_node(inp.node)
                self.inputs.remove(inp)
        # fx's lint (nodes in order, each of this graph, names unique), before the module is made:
        # with a module, lint also looks up each get_attr/call_module target on it (half its time
        # in a deep model), which making the module does already (graph_module copies each target
        # from state_root: a missing one raises), and checks targets' types, as each Node does
        # when made. Asserts added to the module's graph are linted there.
        self.graph.lint()
        gm = graph_module(self.state_root, self.graph)
        if self.shapes.unbacked:
            unbacked.insert_asserts(gm, self.shapes, "bytegraph graph")
            gm.graph.lint()
        return gm


_PLAIN_STATE = (torch.Tensor, torch.nn.Parameter)


def _function_subclass_of(obj):
    """The class of a tensor value in ``obj`` (values, nested in lists, tuples, dicts) whose torch
    calls go through a ``__torch_function__`` override, else None."""
    if isinstance(obj, TensorValue):
        cls = obj.cls
        if cls is torch.Tensor or cls is torch.nn.Parameter or not isinstance(cls, type) \
                or not issubclass(cls, torch.Tensor) or hasattr(cls, "__tensor_flatten__") \
                or issubclass(cls, torch.nn.Parameter) \
                or getattr(cls, "__torch_dispatch__", None) is not torch.Tensor.__torch_dispatch__:
            return None
        return cls
    if isinstance(obj, (TupleValue, ListValue)):
        obj = obj.items
    elif isinstance(obj, DictValue):
        obj = list(obj.items.values())
    if isinstance(obj, dict):
        obj = list(obj.values())
    if isinstance(obj, (list, tuple)):
        for item in obj:
            found = _function_subclass_of(item)
            if found is not None:
                return found
    return None


def _mode_class(value):
    """The class of a mode on ``GraphBuilder.function_modes`` (a value of the trace)."""
    cls = getattr(value, "cls", None)
    return cls if isinstance(cls, type) else type(getattr(value, "obj", value))

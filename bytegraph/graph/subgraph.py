"""The graph of a function body traced inside another graph, for a higher-order operation."""
import torch
import torch.fx as fx

from ..errors import Unsupported
from ..values.base import ConstantValue, FloatTensorValue, SubgraphValue, SymValue, TensorValue
from .builder import GraphBuilder


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
        # The enclosing graph's limits hold inside the body too (frozen nodes: checked when
        # lifted; storages no op may mutate: fakes are shared).
        self.frozen = {}
        self.frozen_breaks = {}
        self.no_mutation = parent.no_mutation
        self.data_written = parent.data_written
        self.data_inputs = parent.data_inputs

    def _reads_storage(self, key):
        return self.parent._reads_storage(key)

    def placeholder(self, fake, name):
        """An explicit input of the body (an operand, a transformed argument)."""
        node = self._placeholder_named(name)
        node.meta["example_value"] = fake
        self.explicit.append(node)
        self._versions.append((fake, fake._version))
        return TensorValue(node, fake)

    def sym_placeholder(self, sym, name):
        """An explicit input of the body that is a symbolic int (a loop's carried int)."""
        node = self._placeholder_named(name)
        node.meta["example_value"] = sym
        self.explicit.append(node)
        return SymValue(node, sym)

    def node_of(self, value):
        if isinstance(value, SubgraphValue):
            return self.add_subgraph(value)
        if not hasattr(value, "node"):
            raise Unsupported(f"passing {value!r} (held by reference, as a DeviceMesh) into a traced body "
                              "(a higher-order operation's function) is not supported yet")
        node = value.node
        if node.graph is self.graph:
            return node
        placeholder = self.lifted.get(node)
        if placeholder is None:
            if node in self.parent.frozen:
                raise self.parent.frozen_error(node)
            placeholder = self._placeholder_named(node.name)
            example = value.fake if isinstance(value, (TensorValue, FloatTensorValue)) else value.sym
            placeholder.meta["example_value"] = example
            self.lifted[node] = placeholder
            self.lifted_values.append(value)
            if isinstance(example, torch.Tensor):
                self._versions.append((example, example._version))
        return placeholder

    @property
    def function_subclass_inputs(self):
        return self.parent.function_subclass_inputs

    @function_subclass_inputs.setter
    def function_subclass_inputs(self, value):
        # An input of a __torch_function__ class is the root graph's: the root runs with dispatch off.
        self.parent.function_subclass_inputs = value

    def add_input(self, tensor, source, dynamic_dims=None, inner_dynamic_dims=None):
        return self.parent.add_input(tensor, source, dynamic_dims, inner_dynamic_dims)

    def add_sym_input(self, value, source):
        return self.parent.add_sym_input(value, source)

    def add_module_state(self, tensor, source, is_parameter, source_name=None):
        return self.parent.add_module_state(tensor, source, is_parameter, source_name)

    def add_layer_state(self, entries):
        return self.parent.add_layer_state(entries)

    def add_float_input(self, value, source, guard, decide=None):
        return self.parent.add_float_input(value, source, guard, decide)

    def real_tensor(self, value):
        return self.parent.real_tensor(value) if value.node.graph is not self.graph else None

    def example_inputs(self):
        raise AssertionError("a subgraph has no example inputs of its own")

    def mutated_inputs(self):
        """True if the body changed one of its inputs in place."""
        return any(fake._version != version for fake, version in self._versions)

    def finish(self, values, clone_inputs=False, single=False):
        """The body's GraphModule returning ``values`` (a flat list of tensor values).

        ``clone_inputs``: an input returned as it is (or a view of one) is cloned, for operations
        whose outputs must not alias their inputs (torch.cond). ``single``: the graph returns the
        one value itself, not a tuple (FlexAttention's score and mask functions)."""
        outputs = []
        inputs = set(self.explicit) | set(self.lifted.values())
        for v in values:
            if isinstance(v, ConstantValue):
                outputs.append(v.value)      # (a loop body's int result known while tracing)
                continue
            node = self.node_of(v)
            if clone_inputs and isinstance(v, TensorValue) and (node in inputs or _is_view_of_input(v, inputs)):
                node = self.graph.call_function(torch.clone, (node,))
                node.meta["example_value"] = v.fake
            outputs.append(node)
        self.graph.output(outputs[0] if single else tuple(outputs))
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

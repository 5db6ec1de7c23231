"""What graph nodes of higher-order operations call: a traced body (an ``fx.GraphModule``) run
under torch.func transforms, activation checkpointing, or as a custom autograd Function.

The tracer (``trace/torch_api/higher_order.py``) traces the body into a graph of its own; the node in
the enclosing graph calls one of the callables here with the body (a get_attr of a submodule)
and its inputs. They run the same way on fake tensors (while tracing), on real tensors (the
``eager`` backend) and under AOTAutograd, which traces through them into ATen ops (the
transforms, the custom Function's forward and backward, checkpointing's recomputation).

A body takes its explicit inputs first and the tensors it reads from around it (lifted) after
them; it returns a flat tuple of tensors, which ``Structure`` regroups into what the traced
function returned (tuples, lists, dicts, constants).
"""
import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch.overrides import TorchFunctionMode
from torch.utils import _pytree as pytree


class Structure:
    """How a flat list of tensors regroups into a Python value (and back)."""
    __slots__ = ("kind", "data", "parts")

    def __init__(self, kind, data=None, parts=()):
        self.kind = kind        # "leaf", "const", "tuple", "list", "dict"
        self.data = data        # the constant; the tuple/dict class; dict keys
        self.parts = list(parts)

    def build(self, leaves):
        return self._build(iter(leaves))

    def _build(self, it):
        if self.kind == "leaf":
            return next(it)
        if self.kind == "const":
            return self.data
        items = [p._build(it) for p in self.parts]
        if self.kind == "list":
            return items
        if self.kind == "dict":
            cls, keys = self.data
            return cls(zip(keys, items))
        cls = self.data
        if cls is tuple:
            return tuple(items)
        return cls(*items) if hasattr(cls, "_fields") else cls(items)

    def leaf_count(self):
        if self.kind == "leaf":
            return 1
        return sum(p.leaf_count() for p in self.parts)


class FunctorchCall:
    """``transform(body, **options)(*args)`` for a torch.func transform (grad, vmap, jacrev...).

    ``in_structure`` regroups the flat explicit inputs into the transform's arguments;
    ``out_structure`` regroups the body's flat outputs into what the traced function returned.
    The node's result is the flat list of the transform's output tensors; ``result_spec`` (a
    pytree spec, found on the first call) says how they group.
    """

    def __init__(self, transform, options, in_structure, out_structure, n_explicit):
        self.transform = transform
        self.options = dict(options)
        self.in_structure = in_structure
        self.out_structure = out_structure
        self.n_explicit = n_explicit
        self.result_spec = None
        name = getattr(transform, "__name__", "transform")
        self.__name__ = f"functorch_{name}"
        self.__qualname__ = self.__name__
        self.__module__ = __name__

    def __call__(self, body, *inputs):
        explicit, lifted = inputs[:self.n_explicit], inputs[self.n_explicit:]
        args = self.in_structure.build(explicit)
        out_structure = self.out_structure

        def fn(*args):
            leaves = pytree.tree_leaves(args)
            return out_structure.build(body(*leaves, *lifted))

        result = self.transform(fn, **self.options)(*args)
        leaves, spec = pytree.tree_flatten(result)
        self.result_spec = spec
        return tuple(leaves)

    def __repr__(self):
        return f"<{self.__name__} {self.options}>"


class _TracedFunction(torch.autograd.Function):
    """The custom autograd Function a traced ``torch.autograd.Function`` runs as (``plan``: a
    ``FunctionPlan``). Its inputs are the user's tensor arguments, then the tensors the traced
    forward and backward read from around them; the forward graph returns the outputs, then the
    tensors the backward needs; the backward graph takes the output gradients, then those, then
    the tensors it reads from around it."""

    @staticmethod
    def forward(ctx, plan, *inputs):
        n_forward = plan.n_explicit + plan.n_forward_lifted
        out = plan.forward_graph(*inputs[:n_forward])
        outputs, saved = out[:plan.n_outputs], out[plan.n_outputs:]
        ctx.plan = plan
        ctx.save_for_backward(*saved, *inputs[n_forward:])
        if plan.non_differentiable:
            ctx.mark_non_differentiable(*[outputs[i] for i in plan.non_differentiable])
        return tuple(outputs)

    @staticmethod
    def backward(ctx, *grads):
        plan = ctx.plan
        grads_in = plan.backward(*grads, *ctx.saved_tensors)
        return (None,) + tuple(grads_in) + (None,) * (plan.n_forward_lifted + plan.n_backward_lifted)


class FunctionPlan:
    """One traced ``torch.autograd.Function``: its forward graph, its backward (a callable giving
    one gradient or None per tensor argument) and what autograd needs to know."""

    def __init__(self, forward_graph, backward, n_outputs, non_differentiable, n_explicit, n_forward_lifted,
                 n_backward_lifted, name):
        self.forward_graph = forward_graph
        self.backward = backward
        self.n_outputs = n_outputs
        self.non_differentiable = tuple(non_differentiable)
        self.n_explicit = n_explicit
        self.n_forward_lifted = n_forward_lifted
        self.n_backward_lifted = n_backward_lifted
        self.name = name


class AutogradFunctionCall:
    """Graph node target: run a traced ``torch.autograd.Function`` (see ``_TracedFunction``).
    Pickled by value for another process (``backends/tiers.py``): the plan's graphs go as
    graphs written down."""
    carried_by_value = True

    def __init__(self, plan):
        self.plan = plan
        self.__name__ = f"autograd_function_{plan.name}"
        self.__qualname__ = self.__name__
        self.__module__ = __name__

    def __call__(self, *inputs):
        return _TracedFunction.apply(self.plan, *inputs)

    def __repr__(self):
        return f"<{self.__name__}>"


def checkpointed(body, *inputs):
    """Activation checkpointing of a traced body: nothing it computes is kept for backward;
    backward runs it again.

    Under a compiler that traces the graph (AOTAutograd on fake/functional tensors), this is
    torch's ``tag_activation_checkpoint`` higher-order op, whose nodes the partitioner
    recomputes. Run for real (the ``eager`` backend), it is ``torch.utils.checkpoint`` itself,
    non-reentrant and restoring the RNG state for the recomputation, as the user's call did.
    """
    if any(_traced(t) for t in inputs):
        # Heavy (higher-order op machinery): imported on first use.
        from torch._higher_order_ops.wrap import tag_activation_checkpoint
        return tag_activation_checkpoint(body, *inputs, use_reentrant=False)
    return torch.utils.checkpoint.checkpoint(body, *inputs, use_reentrant=False, preserve_rng_state=True)


def invoke_region(subgraph, identifier, *operands):
    """A compile region (``torch.compiler.nested_compile_region``): one call of the region's graph.

    Under a compiler that traces the graph (AOTAutograd on fake or functional tensors) this is
    torch's ``invoke_subgraph`` operator, which AOTAutograd traces and partitions once per
    identifier and Inductor compiles once. Run for real (the ``eager`` backend) it is the
    graph's own call: the operator's autograd works only while a compiler traces it (torch.compile
    with ``backend="eager"`` fails in backward there)."""
    for t in operands:      # (a loop: run once per layer per call)
        if _traced(t):
            return torch.ops.higher_order.invoke_subgraph(subgraph, identifier, *operands)
    return tuple(subgraph(*operands))


def _traced(t):
    cls = type(t)
    if cls is torch.Tensor or cls is torch.nn.Parameter:
        return torch._is_functional_tensor(t)
    if not isinstance(t, torch.Tensor):
        return False
    return isinstance(t, FakeTensor) or torch._is_functional_tensor(t) or type(t) is not torch.Tensor \
        and type(t) is not torch.nn.Parameter


class IndexByTensors(TorchFunctionMode):
    """``t[i]`` with 0-d integer tensors (and ints) for indices as a gather (``aten.index``), not a
    view at the index's value. FlexAttention runs its score and mask functions this way (torch's
    ``TransformGetItemToIndex``), so ``bias[h, q_idx]`` in them is a lookup per position; while
    they are traced (and where torch's own code enters that mode, in ``create_mask``) the fake
    results come from this mode, and the graph keeps the subscript, which runs under torch's."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is torch.Tensor.__getitem__:
            tensor, index = args
            leaves = pytree.tree_leaves(index)
            if all(isinstance(i, (torch.Tensor, int)) for i in leaves):
                indices = [i if isinstance(i, torch.Tensor) else torch.tensor(i, dtype=torch.int64, device=tensor.device)
                           for i in leaves]
                return torch.ops.aten.index(tensor, indices)
        return func(*args, **(kwargs or {}))


__all__ = ["Structure", "IndexByTensors", "invoke_region", "FunctorchCall", "FunctionPlan", "AutogradFunctionCall", "checkpointed"]

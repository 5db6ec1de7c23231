"""Ops whose result, or whose gradient, has a size or value only the tensor data decides.

``GraphBuilder`` runs every op on fake tensors; one that raises a data-dependent exception there
becomes a graph break (``data_dependent``). An op whose forward has static shapes can still
have a data-dependent backward, which AOTAutograd would meet only later: ``BackwardCheck`` runs
such an op's backward on fake tensors while tracing.
"""
import torch
from torch._subclasses.fake_tensor import DataDependentOutputException, DynamicOutputShapeException
from torch.utils import _pytree as pytree

from ..errors import Unsupported


def data_dependent(what, exc, backward):
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


class BackwardDataDependent(Exception):
    """Internal: an op's backward raised a data-dependent exception on fake tensors (the cause)."""


class BackwardCheck:
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
        if isinstance(target, torch._ops.HigherOrderOperator):
            # A loop operator's backward counts its iterations (a value fakes do not have), and
            # AOTAutograd differentiates these through the operator's own autograd; a body with a
            # data-dependent backward reaches the backend, which runs the graph uncompiled.
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
        """Raises BackwardDataDependent if the op's backward has a data-dependent size."""
        fresh = {}
        leaves = []

        def copy(t):
            if id(t) not in fresh:
                if getattr(t, "constant", None) is not None and not t.requires_grad:
                    # A fake that knows its value (made from Python numbers, ``torch.div(n, 2)``):
                    # an op may read it as a number (a size), so the copy keeps the value.
                    fresh[id(t)] = t.clone()
                    return fresh[id(t)]
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
            raise BackwardDataDependent() from e
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

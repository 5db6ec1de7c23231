"""Floats that change between calls, handed to graph ops as tensors.

A learning rate that a scheduler moves every step is a ``FloatTensorValue``: a 0-d float64
tensor in the graph. Where an op takes a number, torch ops mostly take a tensor as well (the
``Tensor`` overloads of ``mul``, ``lerp``, ``_foreach_mul_``...); where they take only a number
(``alpha=`` of ``add_``, ``value=`` of ``addcdiv_``, the scalar of ``_foreach_sub_``), the same
computation is written with a tensor (``add_(y * alpha)``, ``addcdiv_(t1 * value, t2)``, a list
of the scalar). The float is cast first to the dtype a Python number would compute in there,
so the op's result dtype is what eager gives.

The same rewrites serve a 0-d tensor given as ``alpha=``/``value=`` (eager reads it as a
number with ``.item()``; an optimizer's step size computed from a tensor step count).

Anything else is left alone: ``GraphBuilder`` then specialises the float (guards its value).
"""
import operator

import torch

from ..values.base import ConstantValue, FloatTensorValue, ListValue, TensorValue, TupleValue

_ALPHA = {"add", "add_", "sub", "sub_"}
_VALUE = {"addcmul", "addcmul_", "addcdiv", "addcdiv_"}
_FOREACH_ALPHA = {"_foreach_add", "_foreach_add_", "_foreach_sub", "_foreach_sub_"}
_FOREACH_VALUE = {"_foreach_addcmul", "_foreach_addcmul_", "_foreach_addcdiv", "_foreach_addcdiv_"}
# foreach ops with an overload taking one tensor where the scalar goes (others take a list)
_FOREACH_ONE_TENSOR = {"add", "mul", "div"}


def tensorize(builder, kind, target, args, kwargs):
    """(kind, target, args, kwargs) with scalar floats as tensors, or None when no rewrite applies."""
    name = target if isinstance(target, str) else getattr(target, "__name__", "") or ""
    ref = _reference(args)
    if ref is None:
        return None
    changed = False
    for key, ops, foreach in (("alpha", _ALPHA, False), ("value", _VALUE, False),
                              ("alpha", _FOREACH_ALPHA, True), ("value", _FOREACH_VALUE, True)):
        scalar = kwargs.get(key)
        if name not in ops or not _scalar_like(scalar) or len(args) < 2:
            continue
        if not (ref.is_floating_point() or ref.is_complex()):
            continue     # integer ops check their alpha/value's type: eager's errors must stay
        factor = _as_tensor(builder, scalar, ref)
        operand = args[1]
        if foreach and isinstance(operand, (ListValue, TupleValue)) and operand.items \
                and all(isinstance(t, TensorValue) for t in operand.items):
            args[1] = builder._call("call_function", torch._foreach_mul, [operand, factor], {})
        elif not foreach and isinstance(operand, TensorValue):
            args[1] = builder._call("call_function", operator.mul, [operand, factor], {})
        else:
            continue
        del kwargs[key]
        changed = True
    foreach_name = name.startswith("_foreach_")
    stem = name[len("_foreach_"):].rstrip("_") if foreach_name else name
    n = _list_length(args)
    for i, a in enumerate(args):
        if isinstance(a, FloatTensorValue):
            t = _as_tensor(builder, a, ref)
            if foreach_name and (i == 0 or stem not in _FOREACH_ONE_TENSOR):
                args[i] = ListValue([t] * n)
            else:
                args[i] = t
            changed = True
    for key, a in list(kwargs.items()):
        if isinstance(a, FloatTensorValue):
            kwargs[key] = _as_tensor(builder, a, ref)
            changed = True
    return (kind, target, args, kwargs) if changed else None


def _scalar_like(v):
    return isinstance(v, FloatTensorValue) or (isinstance(v, TensorValue) and v.fake.dim() == 0)


def _reference(args):
    """The tensor the op works on (its first tensor argument), whose dtype the scalar follows."""
    for a in args:
        if isinstance(a, TensorValue):
            return a.fake
        if isinstance(a, (ListValue, TupleValue)):
            for t in a.items:
                if isinstance(t, TensorValue):
                    return t.fake
    return None


def _list_length(args):
    for a in args:
        if isinstance(a, (ListValue, TupleValue)) and any(isinstance(t, TensorValue) for t in a.items):
            return len(a.items)
    return 1


def scalar_dtype(ref):
    """The dtype a Python float computes in next to ``ref``: its own for float64/complex128, float32
    for the other floating and complex dtypes of more than 0 dims (torch computes reduced
    precision in float32), ``ref``'s for a 0-d reduced-precision tensor; the default dtype next
    to integers and bools."""
    if ref.dtype in (torch.float64, torch.complex128):
        return torch.float64
    if ref.is_floating_point() or ref.is_complex():
        return torch.float32 if ref.dim() > 0 or ref.dtype is torch.float32 else ref.dtype
    return torch.get_default_dtype()


def _as_tensor(builder, v, ref):
    t = TensorValue(v.node, v.fake) if isinstance(v, FloatTensorValue) else v
    dtype = scalar_dtype(ref)
    if t.fake.dtype is dtype and (t.fake.device == ref.device or ref.device.type == "cpu"):
        return t
    # On the op's device: a CPU scalar next to CUDA tensors is fine for eager, but not for every
    # op a compiler generates (foreach kernels). Without waiting: a blocking copy from host memory
    # waits for the device's queue to drain, so every step (an LR scheduler's) would stall the host
    # until the GPU caught up; from pageable memory the copy is staged at once, so the CPU tensor
    # may go right after.
    return builder._call("call_method", "to", [t], {"device": ConstantValue(ref.device),
                                                    "dtype": ConstantValue(dtype),
                                                    "non_blocking": ConstantValue(True)})


__all__ = ["tensorize", "scalar_dtype"]

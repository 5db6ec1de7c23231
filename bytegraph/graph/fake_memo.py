"""Fake results of repeated calls, made again without running the call on fakes.

A trace runs every call on fake tensors for its output's metadata. A model repeats the same
calls on the same metadata (each layer of a stack, the query and key of a rotary embedding):
the fake run costs 0.1-0.2 ms through the fake mode's own cache, and up to 1 ms for an op the
fake mode decomposes each time (``F.linear`` and ``matmul`` on 3-d inputs,
``scaled_dot_product_attention``: tens of inner calls), where making the output is ~10 us.
So a call whose result is a new plain tensor is remembered by what its fake result depends on
(the op, the metadata of its tensor arguments, its other arguments, the global state that
chooses dtypes) and the next call with the same key gets a new fake tensor of the remembered
metadata.

Only where that key decides everything: static sizes, plain fake tensors (no subclass, no
constant value tracked, no conjugate/negative bit, strided, not an inference tensor), no
autocast, no ``__torch_function__`` mode (a default device) nor functorch transform (a vmap
body) active, and with grad enabled no argument requiring grad (its result would need a
``grad_fn``); and only results that are one new tensor (not over an argument's storage, not
requiring grad) from a call that changed no argument (its version counter: ``batch_norm``
updates its running statistics in place).
"""
from __future__ import annotations

import torch
from torch._subclasses.fake_tensor import FakeTensor

from .call_values import _meta_like, new_fake

_SCALARS = frozenset({int, float, bool, str, type(None), torch.dtype, torch.device, torch.layout,
                      torch.memory_format})
_SEQUENCES = frozenset({tuple, list, torch.Size})


class _NoKey(Exception):
    pass


def _tensor_key(t, tensors, grad):
    if t._has_symbolic_sizes_strides or (grad and t.requires_grad) or t.layout is not torch.strided \
            or getattr(t, "constant", None) is not None or t.is_neg() or t.is_conj() or t.is_quantized \
            or t.is_inference():     # (no version counter to tell whether the call wrote it)
        raise _NoKey
    tensors.append(t)
    return (t.dtype, t.device, tuple(t.shape), t.stride(), t.storage_offset(), t.requires_grad)


def _arg_key(a, tensors, grad):
    cls = type(a)
    if cls is FakeTensor:
        return _tensor_key(a, tensors, grad)
    if cls in _SCALARS:
        return (cls, a)
    if cls in _SEQUENCES:
        return (cls, tuple(_arg_key(x, tensors, grad) for x in a))
    raise _NoKey


class FakeMemo:
    """Fake results of calls, by key (``key``), made for ``fake_mode``. ``results`` may be shared
    by the builders of one compiler (runtime.compile_frame): the key holds no fake tensor, and
    the frames a model breaks into repeat each other's calls (one per layer)."""

    def __init__(self, fake_mode, results=None):
        self.fake_mode = fake_mode
        # key -> (shape, stride, storage offset, dtype, device, storage bytes), or None: not to be
        # remembered
        self.results = {} if results is None else results

    def key(self, kind, target, fake_args, fake_kwargs):
        """(key, the argument fakes) for a call, or (None, None) when its result may not be reused."""
        if torch._C._is_any_autocast_enabled() or torch._C._len_torch_function_stack() or "out" in fake_kwargs \
                or torch._C._functorch.peek_interpreter_stack() is not None \
                or isinstance(getattr(target, "__self__", None), torch.Tensor):   # (kept: no fake in a key)
            return None, None
        tensors = []
        grad = torch.is_grad_enabled()
        try:
            key = (kind, target, tuple(_arg_key(a, tensors, grad) for a in fake_args),
                   tuple((k, _arg_key(v, tensors, grad)) for k, v in fake_kwargs.items()),
                   grad, torch.is_inference_mode_enabled(), torch.get_default_dtype())
            hash(key)
        except (_NoKey, TypeError):
            return None, None
        return key, tensors

    def result(self, key):
        """A new fake result for ``key``, or None when none is remembered."""
        meta = self.results.get(key)
        if meta is None:
            return None
        shape, stride, offset, dtype, device, nbytes = meta
        empty = _meta_like(shape, stride, offset, dtype, dtype.itemsize, nbytes)
        return None if empty is None else new_fake(self.fake_mode, empty, device)

    def remember(self, key, result, tensors, versions):
        """Keep ``result``'s metadata for ``key`` if it is one new plain tensor and the call
        (over the argument fakes ``tensors``, at ``versions`` before it) changed none of them."""
        if key in self.results:
            return
        if type(result) is not FakeTensor or result.requires_grad \
                or result._has_symbolic_sizes_strides or result.layout is not torch.strided \
                or getattr(result, "constant", None) is not None \
                or result.is_neg() or result.is_conj() or result.is_quantized \
                or result.is_inference() != torch.is_inference_mode_enabled() \
                or any(t._version != v for t, v in zip(tensors, versions)):
            self.results[key] = None
            return
        storage = result.untyped_storage()._cdata
        if any(t.untyped_storage()._cdata == storage for t in tensors):
            self.results[key] = None
            return
        # (a new result may be a view of a buffer of its own, larger than it: linear's over its
        # matmul; made again with that layout)
        self.results[key] = (tuple(result.shape), result.stride(), result.storage_offset(), result.dtype,
                             result.fake_device, result.untyped_storage().nbytes())

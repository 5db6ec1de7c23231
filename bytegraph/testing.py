"""Helpers for tests: backends that count what they are given."""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

import torch

from .debug.counting import count_ops


class CompileCounter:
    """A backend that records every graph it receives and runs it as is."""

    def __init__(self, inner: Callable | None = None) -> None:
        self.frame_count: int = 0            # graphs received
        self.op_count: int = 0               # call nodes in them
        self.graphs: list[torch.fx.GraphModule] = []
        self.example_inputs: list[list] = []
        self._inner = inner

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list) -> Callable:
        self.frame_count += 1
        self.op_count += count_ops(gm)
        self.graphs.append(gm)
        self.example_inputs.append(list(example_inputs))
        if self._inner is not None:
            return self._inner(gm, example_inputs)
        return gm.forward

    def clear(self) -> None:
        self.__init__(self._inner)


def same(a: Any, b: Any, rtol: float = 1e-5, atol: float = 1e-6, *, inputs: tuple | None = None) -> bool:
    """Structural equality of eager (``a``) and compiled (``b``) results.

    Tensors must agree in shape, dtype, device, values (allclose, NaNs equal) and strides (of the
    dims longer than one: a size-1 dim's stride means nothing). With ``inputs=(eager_inputs,
    compiled_inputs)`` (the arguments each run got, any nesting of lists, tuples and dicts), an
    output tensor must share storage with the compiled input at the place where eager's output
    shares storage with eager's input, and with no input where eager's shares none: a result
    that is (a view of) an argument in eager is one in compiled code too, and a fresh one stays
    fresh (writing to it must not change an argument)."""
    if not _same(a, b, rtol, atol):
        return False
    if inputs is not None:
        eager_in, compiled_in = inputs
        return aliasing(a, eager_in) == aliasing(b, compiled_in)
    return True


def _same(a, b, rtol, atol):
    if isinstance(a, torch.Tensor):
        if not isinstance(b, torch.Tensor) or a.shape != b.shape or a.dtype != b.dtype or a.device != b.device:
            return False
        if not _same_strides(a, b):
            return False
        return torch.allclose(a, b, rtol=rtol, atol=atol, equal_nan=True)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y, rtol, atol) for x, y in zip(a, b))
    if isinstance(a, dict):
        return type(a) is type(b) and a.keys() == b.keys() and all(_same(a[k], b[k], rtol, atol) for k in a)
    if type(a) is not type(b):
        return False
    if dataclasses.is_dataclass(a) and not isinstance(a, type):
        return all(_same(getattr(a, f.name), getattr(b, f.name), rtol, atol) for f in dataclasses.fields(a))
    if type(a).__eq__ is object.__eq__ and hasattr(a, "__dict__") and not callable(a):
        # Plain user objects compare by their attributes (their == is identity).
        return _same(vars(a), vars(b), rtol, atol)
    return a == b


def _same_strides(a, b):
    if a.layout != torch.strided or b.layout != torch.strided or a.numel() == 0:
        return a.layout == b.layout
    return all(sa == sb for n, sa, sb in zip(a.shape, a.stride(), b.stride()) if n > 1)


def tensors_in(value, path=()):
    """(path, tensor) of every tensor in nested lists, tuples, dicts and dataclasses."""
    if isinstance(value, torch.Tensor):
        yield path, value
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            yield from tensors_in(v, path + (i,))
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from tensors_in(v, path + (k,))
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        for f in dataclasses.fields(value):
            yield from tensors_in(getattr(value, f.name), path + (f.name,))


def _storage(t):
    if t.layout != torch.strided:
        return None
    storage = t.untyped_storage()
    return (storage.device, storage.data_ptr()) if storage.nbytes() else None


def aliasing(outputs, inputs):
    """For each output tensor (by place), the places of the input tensors sharing its storage."""
    where = {}
    for path, t in tensors_in(inputs):
        key = _storage(t)
        if key is not None:
            where.setdefault(key, []).append(path)
    return {path: tuple(where.get(_storage(t), ())) for path, t in tensors_in(outputs)}

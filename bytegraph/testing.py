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


def same(a: Any, b: Any, rtol: float = 1e-5, atol: float = 1e-6) -> bool:
    """Structural equality of eager and compiled results (tensors by allclose)."""
    if isinstance(a, torch.Tensor):
        if not isinstance(b, torch.Tensor) or a.shape != b.shape or a.dtype != b.dtype:
            return False
        return torch.allclose(a, b, rtol=rtol, atol=atol, equal_nan=True)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y, rtol, atol) for x, y in zip(a, b))
    if isinstance(a, dict):
        return type(a) is type(b) and a.keys() == b.keys() and all(same(a[k], b[k], rtol, atol) for k in a)
    if type(a) is not type(b):
        return False
    if dataclasses.is_dataclass(a) and not isinstance(a, type):
        return all(same(getattr(a, f.name), getattr(b, f.name), rtol, atol) for f in dataclasses.fields(a))
    if type(a).__eq__ is object.__eq__ and hasattr(a, "__dict__") and not callable(a):
        # Plain user objects compare by their attributes (their == is identity).
        return same(vars(a), vars(b), rtol, atol)
    return a == b

"""What guard checks read besides their sources: global state, storages, memory spans.

Generated guard functions call these by name (``kinds``, each kind's ``namespace``); the
tracer reads the same state through them when it records a guard, so both see one value.
"""
from __future__ import annotations

import numpy as np
import torch
import torch.distributed as dist
from torch.utils._device import DeviceContext

from ..residual import warning_is_error

_CPU = torch.device("cpu")
_untyped_storage = torch.Tensor.untyped_storage
_storage_data_ptr = torch.UntypedStorage.data_ptr
_storage_offset = torch.Tensor.storage_offset
_tensor_data_ptr = torch.Tensor.data_ptr
_PLAIN_TENSORS = frozenset((torch.Tensor, torch.nn.Parameter))


def _byte_span(x):
    """[first byte, past the last byte) an array or CPU tensor reads, or None (empty, not in host memory)."""
    if isinstance(x, np.ndarray):
        if x.size == 0:
            return None
        start, steps, item = x.__array_interface__["data"][0], zip(x.shape, x.strides), x.itemsize
    elif isinstance(x, torch.Tensor):
        if x.device.type != "cpu" or x.numel() == 0:
            return None
        item = x.element_size()
        start, steps = x.data_ptr(), [(n, s * item) for n, s in zip(x.shape, x.stride())]
    else:
        return None
    lo = hi = start
    for n, step in steps:
        if step < 0:
            lo += (n - 1) * step
        else:
            hi += (n - 1) * step
    return lo, hi + item


def memory_apart(x, y) -> bool:
    """Whether two arrays/tensors certainly use different bytes (conservative: ranges, not elements)."""
    a, b = _byte_span(x), _byte_span(y)
    return a is None or b is None or a[1] <= b[0] or b[1] <= a[0]


def storage_groups(tensors) -> tuple:
    """For each tensor, the index of the first one sharing its storage's address (which inputs
    alias); for one that shares it, with its storage offset too: AOTAutograd rebuilds inputs
    that alias from one base with the offsets of the call it compiled for (the rows of a tensor
    a loop iterates, each passed with the tensor to a graph that changes it)."""
    # Per call, over every tensor an optimizer's step changes: the addresses read by C-level
    # map (no bytecode a tensor), and when they are all distinct (the usual case) the
    # answer without a dict pass.
    classes = set(map(type, tensors))
    if classes <= _PLAIN_TENSORS:
        # At storage offset 0 a tensor's data pointer is its storage's, unless it has no
        # elements (then it is 0 and says nothing): read without making a storage object a
        # tensor (in a step, a fifth less time over an optimizer's tensors).
        try:
            if not any(map(_storage_offset, tensors)):
                distinct = set(map(_tensor_data_ptr, tensors))
                if len(distinct) == len(tensors) and 0 not in distinct:
                    return tuple(range(len(tensors)))
        except RuntimeError:
            pass    # (a tensor without storage: asked below as before, which says so)
    if all(c.untyped_storage is _untyped_storage for c in classes):
        addresses = list(map(_storage_data_ptr, map(_untyped_storage, tensors)))
    else:    # a class of its own untyped_storage: called as the program would
        addresses = [t.untyped_storage().data_ptr() for t in tensors]
    if len(set(addresses)) == len(addresses):
        return tuple(range(len(addresses)))
    first = {}
    groups = [first.setdefault(a, i) for i, a in enumerate(addresses)]
    shared = {g for i, g in enumerate(groups) if g != i}
    return tuple((g, t.storage_offset()) if g in shared else g for g, t in zip(groups, tensors))


# The TorchFunctionModes around the call of a frame being compiled: taken off the stack while it
# compiles (their __torch_function__ is traced, and the backend must not run under them), put
# back after (runtime.compile_frame.modes_set_aside).
_set_aside = []


def modes_around_call() -> list:
    """The TorchFunctionModes around the call (outermost first), whether set aside or not."""
    if _set_aside:
        return list(_set_aside[-1])
    return [torch._C._get_function_stack_at(i) for i in range(torch._C._len_torch_function_stack())]


def function_modes() -> tuple:
    """The TorchFunctionModes entered around a call, as what a graph traced under them depends
    on: the types of the modes other than a device context (``with torch.device(...)``,
    ``set_default_device``), then the default device unless it is the CPU (so a device context
    naming the CPU is the same as none)."""
    if not _set_aside and not torch._C._len_torch_function_stack():
        return ()
    modes = modes_around_call()
    if not modes:
        return ()
    kinds = tuple(type(m) for m in modes if not isinstance(m, DeviceContext))
    if len(kinds) == len(modes):
        return kinds    # no device context: the CPU (asking torch would hand a user mode torch.device())
    device = torch.get_default_device()
    return kinds if device == _CPU else kinds + (str(device),)


def default_device() -> torch.device:
    """``torch.get_default_device()``, cheaply when no torch function mode is active."""
    if not torch._C._len_torch_function_stack():
        return _CPU
    return torch.get_default_device()


def process_group_state():
    """(rank, world size, group name) in the default process group; None before
    ``init_process_group`` (what traced ``dist.get_rank()`` and friends were read from)."""
    if not dist.is_available() or not dist.is_initialized():
        return None
    world = dist.group.WORLD
    return dist.get_rank(), dist.get_world_size(), world.group_name


def global_state_snapshot() -> list:
    """(detail, expression, current value) for every piece of global state a graph depends on.
    An autocast's dtype only while that autocast is on (the guard that it is on fails first)."""
    state = [
        ("grad mode", "_is_grad_enabled()", torch.is_grad_enabled()),
        ("default dtype", "_get_default_dtype()", torch.get_default_dtype()),
        ("autocast (cpu)", "_autocast_enabled('cpu')", torch.is_autocast_enabled("cpu")),
        ("autocast (cuda)", "_autocast_enabled('cuda')", torch.is_autocast_enabled("cuda")),
        ("inference mode", "_inference_mode()", torch.is_inference_mode_enabled()),
        # A TorchFunctionMode entered around the call: what a backend like AOTAutograd traced
        # under it, or without it, is not what runs now; factories follow the default device.
        ("torch function modes", "(_function_modes() if _mode_count() else ())", function_modes()),
    ]
    for device in ("cpu", "cuda"):
        if torch.is_autocast_enabled(device):
            state.append((f"autocast dtype ({device})", f"_autocast_dtype('{device}')",
                          torch.get_autocast_dtype(device)))
    return state


# The names the expressions of ``global_state_snapshot`` (and ``process_group_state``) call.
GLOBAL_STATE_NAMES = {
    "_is_grad_enabled": torch.is_grad_enabled,
    "_get_default_dtype": torch.get_default_dtype,
    "_autocast_enabled": torch.is_autocast_enabled, "_autocast_dtype": torch.get_autocast_dtype,
    "_inference_mode": torch.is_inference_mode_enabled,
    "_function_modes": function_modes, "_mode_count": torch._C._len_torch_function_stack,
    "_default_device": default_device, "_process_group_state": process_group_state,
    "_warning_is_error": warning_is_error,
}

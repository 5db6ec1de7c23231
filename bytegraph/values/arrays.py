"""NumPy arrays as values: an ``np.ndarray`` traced as the tensor that holds its data.

An array argument, global or attribute becomes a graph input: the transformed function
hands the graph ``torch.from_numpy(array)`` (the same memory, so in-place updates reach
the caller's array), or a copy where sharing is impossible (another default device under
``with torch.device(...)``, negative strides, a read-only array), written back after the
graph if the graph changed it. Arrays made in the frame are graph nodes. What NumPy
operations do to them is ``trace/numpy_api/numpy_calls.py``; the graph's vocabulary for them is
``graph/numpy_ops.py`` (``torch._numpy`` on tensors).

This module also holds the run-time conversions the generated code calls.
"""
import numpy as np
import torch

from .base import Value

# NumPy dtypes traced, with their torch counterparts. Others (strings, datetimes, objects,
# structured dtypes, float128/complex256, uint16/32/64) run natively (FAQ: fall-backs).
NUMPY_TO_TORCH = {
    np.dtype(np.bool_): torch.bool,
    np.dtype(np.int8): torch.int8, np.dtype(np.int16): torch.int16,
    np.dtype(np.int32): torch.int32, np.dtype(np.int64): torch.int64,
    np.dtype(np.uint8): torch.uint8,
    np.dtype(np.float16): torch.float16, np.dtype(np.float32): torch.float32,
    np.dtype(np.float64): torch.float64,
    np.dtype(np.complex64): torch.complex64, np.dtype(np.complex128): torch.complex128,
}
TORCH_TO_NUMPY = {t: n for n, t in NUMPY_TO_TORCH.items()}


class NdarrayValue(Value):
    """An ``np.ndarray`` in the trace: an FX node and the fake tensor holding its data.

    ``scalar``: the value is 0-d and eager NumPy gives a NumPy scalar there (``np.sum(x)``,
    ``x[0, 1]``), so it is rebuilt as one; the trace treats it as a 0-d array (NEP 50 gives
    the two the same promotion).

    ``view_of``: eager NumPy has a view with negative strides here (``x[::-1]``, ``np.flip``),
    which torch cannot express, so the trace holds a copy; writing to it, or to the array it
    copies, is refused (trace/numpy_api/numpy_calls.py). Where it outlives the graph it is made again as
    eager makes it, from its base: ``view_of`` is ``(function, argument values, keyword
    values)`` to call at run time (``operator.getitem``, ``np.flip``...), or
    ``UNREBUILDABLE`` when that cannot be done (then it cannot leave the graph).

    ``strides``: the array's strides in bytes where they are eager's for sure (an argument array,
    guarded; ``t.numpy()``, torch's layout in eager too), else None: an array a NumPy operation
    computes is laid out by torch in the graph, maybe otherwise than NumPy lays it out.
    """

    __slots__ = ("node", "fake", "scalar", "view_of", "strides")

    def __init__(self, node, fake, source=None, scalar=False):
        super().__init__(source)
        self.node = node
        self.fake = fake
        self.scalar = scalar
        self.view_of = None
        self.strides = None   # ``a.strides`` where eager's are known (see numpy_calls.array_strides)

    @property
    def dtype(self):
        return TORCH_TO_NUMPY[self.fake.dtype]

    def python_type(self):
        return self.dtype.type if self.scalar else np.ndarray

    def _repr_body(self):
        kind = "scalar " if self.scalar else ""
        return f"{self.node.name}: {kind}{tuple(self.fake.shape)} {self.dtype}"


UNREBUILDABLE = ("unrebuildable",)


class NdarrayMethodValue(Value):
    """``array.name`` not yet called: a NumPy method traced when called."""

    __slots__ = ("array", "name")

    def __init__(self, array, name):
        super().__init__(None)
        self.array = array
        self.name = name

    def python_type(self):
        return type(np.ndarray.sum)


def unsupported_reason(obj):
    """Why the array ``obj`` is not traced (it then runs natively), or None."""
    if type(obj) is not np.ndarray:
        if isinstance(obj, np.ma.MaskedArray):
            return "masked arrays (np.ma) are not traced"
        return f"ndarray subclasses ({type(obj).__qualname__}) are not traced"
    return dtype_unsupported_reason(obj.dtype) or (
        None if obj.flags.aligned else "unaligned arrays are not traced")


def dtype_unsupported_reason(dtype):
    """Why arrays of this NumPy dtype are not traced, or None."""
    if dtype in NUMPY_TO_TORCH:
        return None
    if dtype.kind in "biufc":
        if not dtype.isnative:
            return f"arrays of non-native byte order ({dtype.str}) are not traced"
        return f"the dtype {dtype} has no torch counterpart"
    return f"arrays of the non-numeric dtype {dtype} are not traced"


# --- what the generated code calls at run time ---------------------------------------------

SHARE, COPY = "share", "copy"


def input_mode(array, device):
    """How an array argument reaches the graph: SHARE its memory (a CPU tensor over the same
    bytes) or COPY it (another default device, negative strides, read-only memory)."""
    if device.type != "cpu" or not array.flags.writeable or any(s < 0 for s in array.strides):
        return COPY
    return SHARE


def array_to_tensor(array):
    """The tensor an array argument is traced as, sharing its memory (mode SHARE)."""
    return torch.from_numpy(array)


def array_to_tensor_copy(array):
    """The tensor an array argument is traced as: a copy, on the default device (mode COPY)."""
    return torch.as_tensor(np.array(array))     # np.array copies: C order, positive strides, writeable


def tensor_to_array(tensor):
    """The ``np.ndarray`` for a graph output: the same memory for a CPU tensor that needs no
    gradient; otherwise a detached CPU copy (NumPy has no devices and no autograd)."""
    if tensor.device.type == "cpu" and not tensor.requires_grad:
        return tensor.numpy()
    return tensor.numpy(force=True)


def tensor_to_scalar(tensor):
    """The NumPy scalar eager NumPy gives for a 0-d result (``np.sum(x)``)."""
    return tensor_to_array(tensor)[()]


def write_back(array, tensor):
    """After a graph changed the copy of an array argument in place: the change, made on the
    caller's array."""
    np.copyto(array, tensor_to_array(tensor), casting="no")

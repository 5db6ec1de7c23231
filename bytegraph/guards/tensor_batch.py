"""Many tensors' TENSOR_MATCH checks as one call into torch's C++ tensor checker.

An optimizer's step frame guards every parameter, gradient and state tensor: hundreds of
TENSOR_MATCH guards, each a handful of attribute reads in the generated guard function (about a
microsecond a tensor in Python, over a millisecond a step for GPT-2 small's 600 tensors, on the
host's critical path of a launch-bound step). ``torch._C._dynamo.guards.TensorGuards`` checks a
tensor's class, dispatch keys, dtype, device, requires_grad, sizes and strides in C++ (about a
sixth of the time); DESIGN.md admits torch's C helpers for tensor checks where they pay off. It
is a checker only: nothing of TorchDynamo's tracing is used.

A ``TensorBatch`` stands for the static TENSOR_MATCH guards of one guard function that are
plain tensors or parameters (a subclass, a dynamic size or an unusual layout keeps its own
Python check). The checker needs example tensors: ``prime`` runs a new entry's guard function
once on the arguments it was compiled for, and the batch builds its checker from those tensors,
so their dispatch keys (an inference tensor's, under the thread's dispatch state of that call)
are what later calls must match too: stricter than the Python checks only there, and a call that
differs recompiles. Until primed (an entry made elsewhere), a batch runs the Python checks.
"""
import torch

from .kinds import _plain_cpu

try:
    from torch._C._dynamo.guards import TensorGuards
except ImportError:      # a torch build without the C++ guard helpers: the Python checks stay
    TensorGuards = None

# Fewer tensors than this are checked one by one: a call with its arguments tuple costs about
# as much as a couple of Python checks.
MIN_BATCH = 3

_PLAIN = (torch.Tensor, torch.nn.Parameter)
_DEVICE_TYPES = ("cpu", "cuda")


def batchable(g):
    """Can ``g`` (a TENSOR_MATCH guard) be checked in a batch?"""
    t = g.expected
    return (TensorGuards is not None and not g.dynamic_dims and t.cls in _PLAIN
            and t.device.type in _DEVICE_TYPES and not t.dtype.is_complex)


class TensorBatch:
    """The checks of ``metas`` (TensorMeta, one per argument), named ``names`` in messages."""

    def __init__(self, metas, names):
        self.metas = metas
        self.names = names
        self.priming = False
        self._checker = None
        self._slot = None       # (namespace, name) the guard function calls ``check`` by

    def bind(self, namespace, name):
        self._slot = (namespace, name)

    def _holds(self, tensors):
        if len(tensors) != len(self.metas):
            return False
        for t, m in zip(tensors, self.metas):
            if not (type(t) is m.cls and t.dtype is m.dtype and t.requires_grad is m.requires_grad
                    and (t.is_cpu if _plain_cpu(m) else t.device == m.device)
                    and t.shape == m.shape and t.stride() == m.stride):
                return False
        return True

    def check(self, *tensors):
        """True when every tensor matches (by the C++ checker once primed)."""
        if self._checker is not None:
            return self._checker.check(*tensors)
        if not self._holds(tensors):
            return False
        if self.priming:
            self._checker = TensorGuards(*tensors, dynamic_dims_sizes=[list(m.shape) for m in self.metas],
                                         dynamic_dims_strides=[list(m.stride) for m in self.metas])
            if self._slot is not None:
                namespace, name = self._slot
                namespace[name] = self._checker.check
        return True

    def explain(self, *tensors):
        """None when ``check`` would pass, else what differs (the Python checks of the same
        guards report the usual differences first; this names a dispatch-key difference)."""
        if self._checker is None or self._checker.check(*tensors):
            return None
        why = self._checker.check_verbose(*tensors, tensor_check_names=list(self.names))
        return f"tensor check failed: {why}" if isinstance(why, str) else "tensor check failed"


def prime(guard, frame_args):
    """Run a new entry's ``guard`` on the arguments it was compiled for, so that its batches
    build their checkers from those tensors (a batch its guard does not reach, behind a check
    that fails, stays on the Python checks)."""
    batches = getattr(guard, "tensor_batches", ())
    if not batches:
        return
    for b in batches:
        b.priming = True
    try:
        guard(*frame_args)
    except Exception:       # (a guard function catches its own; anything else: stay unprimed)
        pass
    finally:
        for b in batches:
            b.priming = False

"""Calling an ``nn.Module`` inside the trace, and making one.

``module(*args)`` inlines its forward (copied from an earlier trace of the same class when
``blocks`` can), with its forward hooks when it has any (``hooks``); modules whose call runs
natively (DDP, FSDP2, a recurrent layer on a GPU, a padded ``TransformerEncoder``) are refused
with the reason. ``Layer(...)`` inside forward makes a module private to the trace.
"""
from __future__ import annotations

import types

import torch
from torch.nn.parallel import DistributedDataParallel

from ...config import config
from ...datamodel import class_lookup
from ...errors import Unsupported
from ...guards.builder import GLOBAL_HOOKS, NO_HOOKS
from ...residual import has_hooks, is_fsdp_module
from ...values.base import BoundMethodValue, PrivateObjectValue
from ...values.builder import wrap
from . import blocks, higher_order_regions
from ..core import ops
from ..python import lookup, operators
from .hooks import call_with_hooks
from ...values.base import ObjectValue, Value
from ..core.context import RunningFrame


def call_module(frame: RunningFrame, mv: ObjectValue, args: list[Value], kwargs: dict[str, Value]) -> Value:
    """``module(*args)``: inline its forward, and its forward hooks if it has any (trace/nn/hooks.py)."""
    m = mv.obj
    if isinstance(m, DistributedDataParallel):
        raise Unsupported(
            "DistributedDataParallel's forward runs natively: it prepares its reducer for backward around "
            "the module it wraps, which is compiled on its own (split at DDP's bucket boundaries)",
            hint="expected with DDP; compile the DDP module itself (bytegraph.compile(ddp_model)) so the "
                 "forward has no graph around this call")
    if is_fsdp_module(m):
        raise Unsupported(
            f"{type(m).__name__} is sharded by FSDP2 (fully_shard): its hooks all-gather its DTensor parameters "
            "before forward and free them after; they run natively and its forward is compiled on its own",
            hint="expected with FSDP2: each sharded module's forward is a graph of its own")
    if isinstance(m, (torch.nn.RNNBase, torch.nn.TransformerEncoder)):
        mask = kwargs.get("src_key_padding_mask", args[2] if len(args) > 2 else None)
        refuse_native_module(m, mask is not None and not operators.is_none(mask))
    if has_hooks(m):
        return call_with_hooks(frame, mv, args, kwargs, lambda a, k: _call_forward(frame, mv, a, k))
    if mv.source is not None:
        frame.tx.guards.add(NO_HOOKS, mv.source, None)
    frame.tx.guards.add(GLOBAL_HOOKS, None, None)
    return _call_forward(frame, mv, args, kwargs)


def refuse_native_module(m: torch.nn.Module, padding_mask: bool) -> None:
    """Raise for a torch.nn module whose call runs natively, whether called from compiled code
    (``call_module``) or compiled itself (``tracer.trace_frame``); ``padding_mask``: whether a
    ``src_key_padding_mask`` was given.

    * A recurrent layer on a GPU: on the CPU its fused recurrence is one node of the graph (its
      weights' check folds, see WeakRefCallSource); on a GPU AOTAutograd would trace it past
      cuDNN's kernel.
    * ``nn.TransformerEncoder`` with a padding mask, in eval mode without grad: eager packs the
      batch into a nested tensor by the mask and pads the result with zeros; under a compiler
      (torch.compile too) its layers run on the dense batch, and the padded positions hold
      other values. (Its own checks decide the rest: this is taken whenever they could choose
      the nested tensor.)"""
    if isinstance(m, torch.nn.RNNBase) and any(p.is_cuda for p in m.parameters()):
        raise Unsupported(f"torch.nn.{type(m).__name__} on a GPU runs natively (as under torch.compile): in a "
                          "graph its cuDNN kernel would become torch's step-by-step recurrence",
                          hint="expected: one graph before the call and one after it")
    if isinstance(m, torch.nn.TransformerEncoder) and padding_mask and getattr(m, "use_nested_tensor", False) \
            and not torch.is_grad_enabled() and not m.layers[0].training:
        raise Unsupported("nn.TransformerEncoder with a padding mask, in eval mode without grad, runs natively: "
                          "eager computes it on a nested tensor (zeros at the padded positions), which a graph "
                          "cannot hold",
                          hint="expected; enable_nested_tensor=False keeps it in the graph (the padded positions "
                               "then hold the layers' values, as under torch.compile)")


def _call_forward(frame, mv, args, kwargs):
    if higher_order_regions.is_region_module(mv.obj):
        return _trace_forward(frame, mv, args, kwargs)      # a compile region: traced once, no copy
    # A forward traced before for a module of the same class may be copied (trace/nn/blocks.py).
    return blocks.call_forward(frame, mv, args, kwargs, lambda: _trace_forward(frame, mv, args, kwargs))


def _trace_forward(frame, mv, args, kwargs):
    m = mv.obj
    if "forward" not in m.__dict__ and class_lookup(type(m), "forward")[0] is torch.nn.Module.forward:
        raise Unsupported(f"{type(m).__name__} has no forward()")
    # ``m.forward`` in Python's order (an own entry, else the class's method bound to m), guarded
    # as any attribute read: `m.forward = ...` later, or another forward on the class, recompiles.
    forward = lookup.instance_attr(frame, lookup.ExistingInstance(mv), "forward")
    if config.nest_repeated_blocks and isinstance(forward, BoundMethodValue) and forward.self_value is mv \
            and isinstance(getattr(forward.func, "obj", None), types.FunctionType):
        # A repeated block (the class's plain forward) as a compile region (nn/higher_order_regions.py)
        region = higher_order_regions.repeated_block(frame, mv, args, kwargs, forward.func)
        if region is not None:
            return region
    return ops.call(frame, forward, args, kwargs)


def make_module(frame: RunningFrame, cls: type, args: list[Value], kwargs: dict[str, Value]) -> Value:
    """``Layer(...)`` for an ``nn.Module`` subclass inside forward (an activation picked from a
    table, a small helper layer): a real module private to the trace (``PrivateObjectValue``).

    Its ``__init__`` is traced on a new, empty object, so what it does outside the module is
    seen as usual; ``nn.Module.__init__`` and the module's own ``__setattr__`` run for real on
    it. A module that ends up owning parameters or buffers is refused: eager makes new
    tensors (new random weights) on every call, which a graph cannot hold as constants.
    """
    if type(cls).__call__ is not type.__call__ or cls.__new__ is not object.__new__:
        raise Unsupported(f"creating {cls.__qualname__} modules (custom metaclass or __new__) inside the compiled "
                          "function is not supported yet", hint="create modules in __init__, not in forward")
    module = PrivateObjectValue(object.__new__(cls))
    result = ops.call(frame, wrap(frame.tx, cls.__init__, None), [module] + list(args), kwargs)
    if not operators.is_none(result):
        raise Unsupported(f"{cls.__qualname__}.__init__ returned a value")
    m = module.obj
    if "_parameters" not in m.__dict__:
        raise Unsupported(f"{cls.__qualname__}.__init__ did not call nn.Module.__init__")
    if any(True for _ in m.parameters()) or any(True for _ in m.buffers()):
        raise Unsupported(f"creating a {cls.__qualname__} module with parameters or buffers inside the compiled "
                          "function is not supported yet", hint="create modules in __init__, not in forward")
    return module

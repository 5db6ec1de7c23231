"""Symbolic sizes: torch's ShapeEnv, which symbol came from where, and the guards it implies.

A dynamic dimension of an input tensor (or a dynamic int argument) becomes a
SymInt in the fake tensors; arithmetic on it stays symbolic, and every
comparison the trace decides records a guard in the ShapeEnv. At the end
``shape_guards()`` renders those as Python over the frame's arguments, for
the generated guard function.
"""
import dataclasses
import re

import sympy
import torch
from torch._guards import GuardSource, Source as TorchSource
from torch.fx.experimental.symbolic_shapes import (DimDynamic, ShapeEnv, StatelessSymbolicContext,
                                                   free_unbacked_symbols)
from torch.utils._sympy.printers import PythonPrinter

from .. import config
from ..errors import Unsupported
from ..guards.sources import AttrSource



def _dim_kinds(tensor, dynamic_dims):
    """Per dim of ``tensor``: symbolic (DUCK) where ``dynamic_dims`` names it, else static."""
    return [DimDynamic.DUCK if d in dynamic_dims else DimDynamic.STATIC for d in range(tensor.dim())]

class _Name(str):
    # torch reads Source.name as a method in some versions and as a property in others.
    def __call__(self):
        return str(self)


@dataclasses.dataclass(frozen=True)
class ShapeSource(TorchSource):
    """What ShapeEnv needs to name a symbol: our source's user-facing name."""
    text: str

    @property
    def name(self):
        return _Name(self.text)

    def guard_source(self):
        return GuardSource.LOCAL


class SymbolOrigin:
    """Where a symbol's value is read at run time: a tensor's (or an np.ndarray's) size, or an int argument."""
    __slots__ = ("source", "dim", "array")

    def __init__(self, source, dim=None, array=False):
        self.source = source
        self.dim = dim     # None: the source is the int itself
        self.array = array   # an np.ndarray: its sizes are read as .shape[dim]

    def render(self, render_source):
        base = render_source(self.source)
        if self.dim is None:
            return base
        return f"{base}.shape[{self.dim}]" if self.array else f"{base}.size({self.dim})"

    def user_name(self):
        if self.dim is None:
            return self.source.name()
        return f"{self.source.name()}.shape[{self.dim}]" if self.array else f"{self.source.name()}.size({self.dim})"


def _finite(bound):
    try:
        return int(bound)
    except (TypeError, ValueError, AttributeError, OverflowError):
        return None


class Shapes:
    def __init__(self):
        # An op whose output size or a Python scalar depends on tensor data (nonzero, boolean
        # masks, unique, item) raises on fake tensors unless its capture mode is on: the tracer
        # then breaks the graph there and runs the op natively (see GraphBuilder.call). With the
        # mode on, the fake result gets an unbacked symbol (u0, zuf0): a size or number the graph
        # computes, known to nothing outside it (no guard may read it; see unbacked.py).
        self.env = ShapeEnv(allow_dynamic_output_shape_ops=config.capture_dynamic_output_shape_ops,
                            allow_scalar_outputs=config.capture_scalar_outputs)
        self.origins = {}           # sympy.Symbol -> [SymbolOrigin, ...] (first one is read)
        self.lower_bounds = {}      # sympy.Symbol -> min given by mark_dynamic
        self.upper_bounds = {}
        self.unbacked = set()       # unbacked symbols bound by a node of the graph

    @property
    def has_symbols(self):
        """Symbolic sizes of inputs, or unbacked ones made in the graph: the backend then gets the
        fake inputs (one ShapeEnv for the trace and the backend)."""
        return bool(self.origins) or bool(self.unbacked)

    @property
    def needs_guard(self):
        """Symbols read from the frame's arguments (the ones guards may check), or guards the
        ShapeEnv recorded (``guards`` refuses one on an unbacked symbol)."""
        return bool(self.origins) or bool(self.env.guards)

    def fake_dynamic(self, fake_mode, tensor, source, dynamic_dims, array=False):
        """Fake tensor whose dims in ``dynamic_dims`` (dim -> (min, max)) are symbolic."""
        ctx = StatelessSymbolicContext(dynamic_sizes=_dim_kinds(tensor, dynamic_dims))
        fake = fake_mode.from_tensor(tensor, symbolic_context=ctx, source=ShapeSource(source.name()))
        self._note_origins(fake, source, dynamic_dims, array)
        return fake

    def fake_dynamic_subclass(self, fake_mode, tensor, source, outer_dims, inner_dims):
        """Fake of a traceable wrapper subclass whose outer dims in ``outer_dims`` and inner
        tensors' dims in ``inner_dims`` (name -> dim -> (min, max)) are symbolic, made through
        the class's flatten/unflatten."""
        from torch.fx.experimental.symbolic_shapes import SubclassSymbolicContext

        inner = {}
        for name in tensor.__tensor_flatten__()[0]:
            t = getattr(tensor, name)
            if isinstance(t, torch.Tensor):
                inner[name] = StatelessSymbolicContext(dynamic_sizes=_dim_kinds(t, inner_dims.get(name, {})))
        outer_source = ShapeSource(source.name())
        ctx = SubclassSymbolicContext(dynamic_sizes=_dim_kinds(tensor, outer_dims), constraint_sizes=[None] * tensor.dim(),
                                      tensor_source=outer_source, inner_contexts=inner)
        fake = fake_mode.from_tensor(tensor, symbolic_context=ctx, source=outer_source)
        self._note_origins(fake, source, outer_dims)
        for name, dims in inner_dims.items():
            self._note_origins(getattr(fake, name), AttrSource(source, name), dims)
        return fake

    def _note_origins(self, fake, source, dynamic_dims, array=False):
        """Remember where each new symbol of ``fake`` was read from and its (min, max) bounds."""
        for d, bounds in dynamic_dims.items():
            size = fake.shape[d]
            if isinstance(size, torch.SymInt) and isinstance(size.node.expr, sympy.Symbol):
                sym = size.node.expr
                self.origins.setdefault(sym, []).append(SymbolOrigin(source, d, array))
                lo, hi = bounds
                if lo is not None:
                    self.lower_bounds[sym] = max(lo, self.lower_bounds.get(sym, lo))
                if hi is not None:
                    self.upper_bounds[sym] = min(hi, self.upper_bounds.get(sym, hi))

    def symint(self, value, source):
        """A SymInt standing for an int argument read from ``source``."""
        sym = self.env.create_unspecified_symbol(value, source=ShapeSource(source.name()),
                                                 dynamic_dim=DimDynamic.DYNAMIC)
        out = self.env.create_symintnode(sym, hint=value, source=ShapeSource(source.name()))
        if isinstance(out, torch.SymInt) and isinstance(out.node.expr, sympy.Symbol):
            self.origins.setdefault(out.node.expr, []).append(SymbolOrigin(source))
        return out

    def guards(self, render_source):
        """[(python condition, description)] that must hold for the symbolic graph to be valid."""
        out = []
        names = {}
        for sym, origins in self.origins.items():
            names[str(sym)] = f"({origins[0].render(render_source)})"
            first = origins[0]
            for other in origins[1:]:
                out.append((f"{other.render(render_source)} == {first.render(render_source)}",
                            f"{other.user_name()} == {first.user_name()}"))
        for sym, origins in self.origins.items():
            expr = origins[0].render(render_source)
            vr = self.env.var_to_range.get(sym)
            lo = _finite(vr.lower) if vr is not None else None
            if sym in self.lower_bounds:
                lo = max(lo, self.lower_bounds[sym]) if lo is not None else self.lower_bounds[sym]
            if lo is not None:
                out.append((f"{expr} >= {lo}", f"{origins[0].user_name()} >= {lo}"))
            hi = self.upper_bounds.get(sym)
            if hi is not None:
                out.append((f"{expr} <= {hi}", f"{origins[0].user_name()} <= {hi}"))
        by_name = {str(s): o for s, o in self.origins.items()}
        printer = PythonPrinter()
        for g in self.env.guards:
            if free_unbacked_symbols(g.expr):
                # Never reached: deciding on an unbacked symbol raises, and the tracer breaks there.
                raise Unsupported(f"a guard on a value computed inside the graph ({g.expr})")
            text = printer.doprint(g.expr)
            user = text
            for sym_name in sorted(names, key=len, reverse=True):
                text = re.sub(rf"\b{sym_name}\b", names[sym_name], text)
                user = re.sub(rf"\b{sym_name}\b", by_name[sym_name][0].user_name(), user)
            out.append((text, user))
        return out

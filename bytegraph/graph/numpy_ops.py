"""NumPy operations as graph nodes: callables over tensors with NumPy's semantics.

A traced NumPy operation becomes one ``call_function`` node whose target is one of
the callables below. They take and return tensors (an array's data), so fake-tensor
propagation, AOTAutograd and Inductor see ordinary torch code:

* ``Ufunc``: an elementwise ufunc, computed by torch in the loop dtypes NumPy's own
  type resolution chose (``ufunc.resolve_dtypes``, NEP 50), cast to NumPy's result
  dtype, written into ``out=`` arrays when given;
* ``Function`` / ``Method`` / ``Attr``: a function, method or attribute of
  ``torch._numpy``, the NumPy-on-tensors implementation torch ships;
* ``getitem`` / ``setitem_``: NumPy indexing.

Targets whose name ends in ``_`` change their first argument in place (what
``codegen`` and ``graph.builder`` look for in a node that mutates).
"""
import numpy as np
import torch
import torch._numpy as tnp
from torch._numpy import _dtypes, _dtypes_impl


# torch._numpy takes its default dtypes from torch._dynamo's config on first use; set NumPy's
# own defaults first, so that no other front end is imported.
if _dtypes_impl._default_dtypes is None:
    _dtypes_impl._default_dtypes = _dtypes_impl.DefaultDTypes(
        float_dtype=torch.float64, complex_dtype=torch.complex128, int_dtype=torch.int64)


def to_tnp(x):
    """A tensor as a ``torch._numpy`` array (tuples and lists item by item)."""
    if isinstance(x, torch.Tensor):
        return tnp.ndarray(x)
    if isinstance(x, (tuple, list)):
        return type(x)(to_tnp(i) for i in x)
    return x


def to_tensors(x):
    """``torch._numpy`` arrays in a result as tensors; dtypes as NumPy dtypes."""
    if isinstance(x, tnp.ndarray):
        return x.tensor
    if isinstance(x, (tuple, list)):
        return type(x)(to_tensors(i) for i in x)
    if isinstance(x, _dtypes.DType):
        return np.dtype(x.name)
    return x


class GraphOp:
    """A graph target with a readable name (FX names the node after it)."""
    __slots__ = ("__name__", "__qualname__")

    def __init__(self, name):
        self.__name__ = name
        self.__qualname__ = name

    def __repr__(self):
        return f"<numpy op {self.__name__}>"


# --- ufuncs ---------------------------------------------------------------------------------

def _copy(x):
    return x.clone()


def _absolute(x):
    return x.clone() if x.dtype == torch.bool else torch.abs(x)


def _sign(x):
    return torch.sgn(x) if x.is_complex() else torch.sign(x)


def _cbrt(x):
    return torch.sign(x) * torch.abs(x).pow(1.0 / 3.0)


def _conjugate(x):
    return torch.conj_physical(x) if x.is_complex() else x.clone()


def _rounding(fn):
    # Integer and bool loops of floor/ceil/trunc/rint are the identity.
    def impl(x):
        return x.clone() if not (x.is_floating_point() or x.is_complex()) else fn(x)
    return impl


def _integer_safe(fn):
    """NumPy's integer division by zero gives 0 (with a warning); torch raises."""
    def impl(x, y):
        if isinstance(y, torch.Tensor) and not (y.is_floating_point() or y.is_complex()):
            zero = y == 0
            return torch.where(zero, torch.zeros((), dtype=y.dtype, device=y.device),
                               fn(x, torch.where(zero, torch.ones((), dtype=y.dtype, device=y.device), y)))
        return fn(x, y)
    impl.__name__ = fn.__name__
    return impl


_floor_divide = _integer_safe(torch.floor_divide)
_remainder = _integer_safe(torch.remainder)
_fmod = _integer_safe(torch.fmod)


def _divmod(x, y):
    return _floor_divide(x, y), _remainder(x, y)


def _modf(x):
    whole = torch.trunc(x)
    return x - whole, whole


def _frexp(x):
    mantissa, exponent = torch.frexp(x)
    return mantissa, exponent


# ufunc name -> (torch implementation over tensors of the loop dtypes, outputs)
UFUNC_IMPLS = {
    "add": torch.add, "subtract": torch.sub, "multiply": torch.mul, "divide": torch.true_divide,
    "true_divide": torch.true_divide, "floor_divide": _floor_divide, "remainder": _remainder,
    "mod": _remainder, "fmod": _fmod, "power": torch.pow, "pow": torch.pow,
    "float_power": torch.float_power, "maximum": torch.maximum, "minimum": torch.minimum,
    "fmax": torch.fmax, "fmin": torch.fmin, "arctan2": torch.atan2, "atan2": torch.atan2,
    "hypot": torch.hypot, "copysign": torch.copysign, "heaviside": torch.heaviside,
    "logaddexp": torch.logaddexp, "logaddexp2": torch.logaddexp2, "gcd": torch.gcd, "lcm": torch.lcm,
    "ldexp": torch.ldexp, "nextafter": torch.nextafter,
    "equal": torch.eq, "not_equal": torch.ne, "less": torch.lt, "less_equal": torch.le,
    "greater": torch.gt, "greater_equal": torch.ge,
    "logical_and": torch.logical_and, "logical_or": torch.logical_or, "logical_xor": torch.logical_xor,
    "logical_not": torch.logical_not,
    "bitwise_and": torch.bitwise_and, "bitwise_or": torch.bitwise_or, "bitwise_xor": torch.bitwise_xor,
    "invert": torch.bitwise_not, "bitwise_not": torch.bitwise_not, "bitwise_invert": torch.bitwise_not,
    "matmul": torch.matmul,
    "negative": torch.neg, "positive": _copy, "absolute": _absolute, "abs": _absolute, "fabs": torch.abs,
    "sign": _sign, "conjugate": _conjugate, "conj": _conjugate,
    "sqrt": torch.sqrt, "square": torch.square, "cbrt": _cbrt, "exp": torch.exp, "exp2": torch.exp2,
    "expm1": torch.expm1, "log": torch.log, "log2": torch.log2, "log10": torch.log10, "log1p": torch.log1p,
    "sin": torch.sin, "cos": torch.cos, "tan": torch.tan, "arcsin": torch.asin, "arccos": torch.acos,
    "arctan": torch.atan, "asin": torch.asin, "acos": torch.acos, "atan": torch.atan,
    "sinh": torch.sinh, "cosh": torch.cosh, "tanh": torch.tanh, "arcsinh": torch.asinh,
    "arccosh": torch.acosh, "arctanh": torch.atanh, "asinh": torch.asinh, "acosh": torch.acosh,
    "atanh": torch.atanh, "deg2rad": torch.deg2rad, "radians": torch.deg2rad, "rad2deg": torch.rad2deg,
    "degrees": torch.rad2deg,
    "floor": _rounding(torch.floor), "ceil": _rounding(torch.ceil), "trunc": _rounding(torch.trunc),
    "rint": _rounding(torch.round),
    "isnan": torch.isnan, "isinf": torch.isinf, "isfinite": torch.isfinite, "signbit": torch.signbit,
    "divmod": _divmod, "modf": _modf, "frexp": _frexp,
}

# Shift ufuncs: NumPy gives 0 (or -1) for shifts past the width, torch does not promise it.
UFUNC_IMPLS.update({"left_shift": torch.bitwise_left_shift, "right_shift": torch.bitwise_right_shift,
                    "bitwise_left_shift": torch.bitwise_left_shift,
                    "bitwise_right_shift": torch.bitwise_right_shift})

# Ufuncs whose integer loops torch computes differently (NumPy's C integer semantics).
UFUNC_FLOAT_ONLY = {"reciprocal"}
UFUNC_IMPLS["reciprocal"] = torch.reciprocal


# Ops that take a Python number as their second operand and give the tensor operand's dtype when
# the number's kind is no higher than that dtype's (so: the loop dtype NumPy chose).
SCALAR_SECOND = {torch.add, torch.sub, torch.mul, torch.true_divide, torch.pow, torch.eq, torch.ne, torch.lt,
                 torch.le, torch.gt, torch.ge}


class Ufunc(GraphOp):
    """``ufunc(*operands, out=...)`` with the dtypes NumPy resolved: operands cast to the loop's
    input dtypes, torch computes, results cast to the output dtypes (and copied into ``out``)."""
    __slots__ = ("impl", "in_dtypes", "out_dtypes")

    def __init__(self, name, in_dtypes, out_dtypes):
        super().__init__(f"np_{name}")
        self.impl = UFUNC_IMPLS[name]
        self.in_dtypes = tuple(in_dtypes)      # torch dtypes
        self.out_dtypes = tuple(out_dtypes)

    def __call__(self, *operands, out=None):
        device = next((x.device for x in operands if isinstance(x, torch.Tensor)), None)
        xs = [x.to(dt) if isinstance(x, torch.Tensor) else x for x, dt in zip(operands, self.in_dtypes)]
        if not (self.impl in SCALAR_SECOND and len(xs) == 2 and isinstance(xs[0], torch.Tensor)):
            # A Python number stays one only as the second operand of an op that takes it (x ** 2
            # lets Inductor multiply); elsewhere it is a 0-d tensor of the loop dtype.
            xs = [x if isinstance(x, torch.Tensor) else torch.tensor(x, dtype=dt, device=device)
                  for x, dt in zip(xs, self.in_dtypes)]
        results = self.impl(*xs)
        if not isinstance(results, tuple):
            results = (results,)
        results = tuple(r if r.dtype == dt else r.to(dt) for r, dt in zip(results, self.out_dtypes))
        if out is not None:
            outs = out if isinstance(out, tuple) else (out,)
            for o, r in zip(outs, results):
                if o is not None:
                    o.copy_(torch.broadcast_to(r.to(o.dtype), o.shape))
            results = tuple(r if o is None else o for o, r in zip(outs, results))
        return results if len(results) > 1 else results[0]


# --- torch._numpy functions, methods, attributes -------------------------------------------------

class Function(GraphOp):
    """A ``torch._numpy`` function on tensors: its array results come back as tensors."""
    __slots__ = ("fn",)

    def __init__(self, name, fn):
        super().__init__(f"np_{name}")
        self.fn = fn

    def __call__(self, *args, **kwargs):
        if kwargs.get("out") is not None:
            kwargs["out"] = to_tnp(kwargs["out"])
        try:
            return to_tensors(self.fn(*args, **kwargs))
        except (tnp.linalg.LinAlgError, torch.linalg.LinAlgError) as e:
            # What NumPy raises (a singular matrix...), so `except np.linalg.LinAlgError` works.
            raise np.linalg.LinAlgError(str(e)) from e


class Method(GraphOp):
    """``array.name(*args)`` of a ``torch._numpy`` array over the first argument."""
    __slots__ = ("method",)

    def __init__(self, name, in_place=False):
        super().__init__(f"np_{name}_" if in_place else f"np_{name}")
        self.method = name

    def __call__(self, array, *args, **kwargs):
        return to_tensors(getattr(tnp.ndarray(array), self.method)(*args, **kwargs))


class Attr(GraphOp):
    """``array.name`` (``.T``, ``.real``...) of a ``torch._numpy`` array."""
    __slots__ = ("attr",)

    def __init__(self, name):
        super().__init__(f"np_attr_{name}")
        self.attr = name

    def __call__(self, array):
        return to_tensors(getattr(tnp.ndarray(array), self.attr))


class Getitem(GraphOp):
    """``array[index]`` with NumPy's indexing (the index may hold tensors: index arrays)."""
    __slots__ = ()

    def __call__(self, array, index):
        return tnp.ndarray(array)[index].tensor


class Setitem(GraphOp):
    """``array[index] = value``, in place."""
    __slots__ = ()

    def __call__(self, array, index, value):
        tnp.ndarray(array)[index] = tnp.ndarray(value) if isinstance(value, torch.Tensor) else value


class Astype(GraphOp):
    """``array.astype(dtype)``: always a new array, as NumPy's default ``copy=True`` makes."""
    __slots__ = ()

    def __call__(self, array, dtype):
        return array.to(dtype, copy=True)


class Split(GraphOp):
    """The rows of an ``(k, n)`` index tensor as a tuple: NumPy's ``tril_indices`` and friends
    return a tuple of arrays where ``torch._numpy`` returns one array."""
    __slots__ = ()

    def __call__(self, t):
        return tuple(t.unbind(0))


getitem = Getitem("np_getitem")
setitem_ = Setitem("np_setitem_")
astype = Astype("np_astype")
split_rows = Split("np_split_rows")

_functions = {}
_methods = {}
_attrs = {}
_ufuncs = {}


def function(name, fn):
    op = _functions.get(fn)
    if op is None:
        op = _functions[fn] = Function(name, fn)
    return op


def method(name, in_place=False):
    key = (name, in_place)
    op = _methods.get(key)
    if op is None:
        op = _methods[key] = Method(name, in_place)
    return op


def attr(name):
    op = _attrs.get(name)
    if op is None:
        op = _attrs[name] = Attr(name)
    return op


def ufunc(name, in_dtypes, out_dtypes):
    key = (name, tuple(in_dtypes), tuple(out_dtypes))
    op = _ufuncs.get(key)
    if op is None:
        op = _ufuncs[key] = Ufunc(name, in_dtypes, out_dtypes)
    return op


# --- NumPy's namespaces and their torch._numpy counterparts ---------------------------------------

TNP_MODULES = (("numpy", np, tnp), ("numpy.linalg", np.linalg, tnp.linalg), ("numpy.fft", np.fft, tnp.fft))

_by_id = None


def counterpart(obj):
    """(qualified name, torch._numpy callable) for a NumPy function, or None."""
    global _by_id
    if _by_id is None:
        table = {}
        for prefix, np_mod, tnp_mod in TNP_MODULES:
            for name in dir(tnp_mod):
                if name.startswith("_"):
                    continue
                np_obj = getattr(np_mod, name, None)
                tnp_obj = getattr(tnp_mod, name)
                if np_obj is None or not callable(np_obj) or not callable(tnp_obj) or isinstance(np_obj, type):
                    continue
                table.setdefault(id(np_obj), (np_obj, f"{prefix.replace('numpy', 'np')}.{name}", name, tnp_obj))
        _by_id = table
    entry = _by_id.get(id(obj))
    if entry is None or entry[0] is not obj:
        return None
    return entry[1], entry[2], entry[3]

"""NumPy functions traced through ``torch._numpy``: the checked list ``TRACED`` (which functions,
with which per-function fixes so results match NumPy's dtypes and layouts), binding NumPy's
signatures, and the call that makes the graph node."""
import inspect

import numpy as np
import torch

from ...graph import numpy_ops as nops
from ...guards import builder as g
from ...values.arrays import NUMPY_TO_TORCH, UNREBUILDABLE, NdarrayValue, dtype_unsupported_reason
from ...values.base import ConstantValue, ListValue, TupleValue
from ..core.basics import as_constant
from ..core.basics import PythonError
from .numpy_values import (_array, _dtype_of, _graph_arg, _graph_call, _new_array, _numpy_scalar_array, _probed,
                           storage_key, unsupported)


# --- torch._numpy functions ------------------------------------------------------------------------

class Spec:
    """How a traced NumPy function's results look: ``array``: a 0-d result stays an array (else it is
    a NumPy scalar, as NumPy returns for reductions and the like); ``fix``: adjusts the arguments
    and the result where torch._numpy differs from NumPy."""
    __slots__ = ("array", "fix", "renames")

    def __init__(self, array=False, fix=None, renames=None):
        self.array = array
        self.fix = fix
        self.renames = renames or {}


def _sig(fn):
    try:
        return inspect.signature(fn)
    except (TypeError, ValueError):
        return None


_SIGS = {}


def signature(fn):
    key = id(fn)
    if key not in _SIGS:
        _SIGS[key] = (fn, _sig(fn))
    return _SIGS[key][1]


def bind(np_fn, name, args, kwargs):
    """The call's arguments by NumPy's parameter names (an OrderedDict), or None without a signature."""
    sig = signature(np_fn)
    if sig is None:
        return None
    try:
        return sig.bind(*args, **kwargs).arguments
    except TypeError as e:
        raise PythonError(f"{name}() {e}", TypeError(str(e))) from None


def call_tnp(frame, np_fn, name, tnp_fn, args, kwargs, spec):
    """A NumPy function through its torch._numpy counterpart, arguments given as the user gave them
    (positional ones by position, keywords by name, renamed where torch._numpy names them otherwise)."""
    args = list(args)
    bound = bind(np_fn, name, args, kwargs)
    post = None
    if spec.fix is not None and bound is not None:
        before = dict(bound)
        post = spec.fix(frame, name, bound)
        if isinstance(post, (NdarrayValue, TupleValue)):
            return post      # the fix computed the result itself
        # What a fix changed or added: in the argument's own position, or by keyword.
        kwargs = dict(kwargs)
        order = list(signature(np_fn).parameters)
        for k, v in bound.items():
            if k in before and before[k] is v:
                continue
            i = order.index(k) if k in order else len(args)
            if i < len(args) and k not in kwargs:
                args[i] = v
            else:
                kwargs[k] = v
    call_args, call_kwargs = _match(name, np_fn, tnp_fn, args, kwargs, spec.renames, frame)
    result = _new_array(frame, nops.function(name.split(".")[-1], tnp_fn), call_args, call_kwargs, name,
                        scalar=not spec.array)
    if post is not None:
        result = post(result)
    return result


def _match(name, np_fn, tnp_fn, args, kwargs, renames, frame):
    """(args, kwargs) for the torch._numpy function: positional arguments by position, keywords by
    (renamed) name; a keyword torch._numpy does not take is refused unless it is None."""
    target = signature(tnp_fn)
    params = list(target.parameters.values()) if target is not None else None
    if params is None:
        return ([_graph_arg(frame, a, True) for a in args],
                {k: _graph_arg(frame, v, True) for k, v in kwargs.items()})
    by_name = {p.name: p for p in params}
    var_positional = next((p for p in params if p.kind is inspect.Parameter.VAR_POSITIONAL), None)
    var_keyword = next((p for p in params if p.kind is inspect.Parameter.VAR_KEYWORD), None)
    positional = [p for p in params if p.kind in (inspect.Parameter.POSITIONAL_ONLY,
                                                  inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    call_args = []
    for i, value in enumerate(args):
        if i < len(positional):
            p = positional[i]
        elif var_positional is not None:
            p = var_positional
        else:
            raise unsupported(f"{name}() with {len(args)} positional arguments is not traced")
        call_args.append(_graph_arg(frame, value, "ArrayLike" in str(p.annotation)))
    call_kwargs = {}
    for key, value in kwargs.items():
        key = renames.get(key, key)
        p = by_name.get(key)
        if p is None or p.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
            if var_keyword is not None:
                call_kwargs[key] = _graph_arg(frame, value, False)
                continue
            if _is_default(value):
                continue
            raise unsupported(f"{name}(..., {key}=...) is not traced")
        if p.kind is inspect.Parameter.POSITIONAL_ONLY:
            raise unsupported(f"{name}(..., {key}=...) is not traced")
        call_kwargs[key] = _graph_arg(frame, value, "ArrayLike" in str(p.annotation))
    return call_args, call_kwargs


def _is_default(value):
    return isinstance(value, ConstantValue) and value.value is None


# -- fixes where torch._numpy and NumPy differ (each checked against NumPy) --

_SMALL_INTS = (np.dtype(np.bool_), np.dtype(np.int8), np.dtype(np.int16), np.dtype(np.int32))


def _first_array(bound):
    v = next(iter(bound.values()))
    return v if isinstance(v, NdarrayValue) else None


def _no_dtype(bound):
    d = bound.get("dtype")
    return d is None or isinstance(d, ConstantValue) and d.value is None


def _fix_accumulate(frame, name, bound):
    """sum/prod/cumsum/cumprod: NumPy accumulates small integers in int64 (unsigned ones in uint64)."""
    a = _first_array(bound)
    if a is None or not _no_dtype(bound):
        return None
    if a.dtype in _SMALL_INTS:
        bound["dtype"] = ConstantValue("int64")
    elif a.dtype.kind == "u":
        raise unsupported(f"{name} of {a.dtype} accumulates in uint64, which torch lacks")
    return None


def _cast_to(frame, dtype):
    def post(result):
        if isinstance(result, NdarrayValue) and result.dtype != dtype:
            out = _new_array(frame, nops.astype, [result, ConstantValue(NUMPY_TO_TORCH[dtype])], {}, "astype")
            out.scalar = result.scalar
            return out
        return result
    return post


def _fix_logical_reduction(frame, name, bound):
    """all/any return bool arrays for every input dtype."""
    return _cast_to(frame, np.dtype(bool))


def _fix_median(frame, name, bound):
    a = _first_array(bound)
    if a is None:
        return None
    if a.dtype.kind == "c":
        raise unsupported(f"{name} of complex arrays is not traced")
    axis = bound.get("axis")
    post_dtype = np.dtype(np.float64) if a.dtype.kind in "biu" else a.dtype
    cast = _cast_to(frame, post_dtype)
    if axis is None or isinstance(axis, ConstantValue) and axis.value is None:
        keep = bound.get("keepdims")
        if keep is not None and as_constant(keep):
            raise unsupported(f"{name}(..., keepdims=True) without an axis is not traced")

        def post(result):
            # torch._numpy's median over everything has shape (1,); NumPy's is 0-d.
            out = _new_array(frame, nops.method("reshape"), [result, ConstantValue(())], {}, name, scalar=True)
            return cast(out)
        return post
    return cast


def _fix_mean_like(frame, name, bound):
    """mean/std/var: NumPy computes float16 in float32 and returns float16; ints give float64."""
    a = _first_array(bound)
    if a is None or not _no_dtype(bound):
        return None
    if a.dtype == np.float16:
        bound["dtype"] = ConstantValue("float32")
        return _cast_to(frame, np.dtype(np.float16))
    return None


def _fix_indices(frame, name, bound):
    """tril_indices/triu_indices(_from): a tuple of index arrays, as NumPy returns."""
    def post(result):
        rows = _graph_call(frame, nops.split_rows, [result], {}, name)
        return _array(rows)
    return post


def _fix_flip(frame, name, bound):
    """np.flip / np.flipud / np.fliplr: eager NumPy returns a negative-stride view; here it is a copy."""
    a = _first_array(bound)
    fn = {"np.flip": np.flip, "np.flipud": np.flipud, "np.fliplr": np.fliplr}[name]
    rest = {k: v for k, v in bound.items() if v is not a}
    recipe = (fn, [a], rest) if all(isinstance(v, ConstantValue) for v in rest.values()) else None

    def post(result):
        mark_reversed(frame, a, result, recipe)
        return result
    return post


def mark_reversed(frame, base, result, recipe):
    """``result`` is eager NumPy's negative-stride view of ``base``, traced as a copy; ``recipe``
    (function, argument values, keyword values) makes the view at run time, or None."""
    if isinstance(result, NdarrayValue):
        result.view_of = recipe if recipe is not None else UNREBUILDABLE
        frame.tx.reversed_copies.add(storage_key(result.fake))
        if isinstance(base, NdarrayValue):
            frame.tx.reversed_bases.add(storage_key(base.fake))


_LINALG_RESULTS = {}


def _linalg_tuple(np_fn):
    """The namedtuple class NumPy's linalg function returns (SVDResult, EighResult...)."""
    key = id(np_fn)
    if key not in _LINALG_RESULTS:
        try:
            sample = np_fn(np.eye(2))
            _LINALG_RESULTS[key] = type(sample) if isinstance(sample, tuple) else None
        except Exception:
            _LINALG_RESULTS[key] = None
    return _LINALG_RESULTS[key]


def _fix_linalg(frame, name, bound):
    """np.linalg computes integer and bool matrices in float64 (torch._numpy in float32) and refuses
    float16 (except norm)."""
    for key, v in list(bound.items()):
        if isinstance(v, NdarrayValue):
            if v.dtype.kind in "biu":
                bound[key] = _new_array(frame, nops.astype, [v, ConstantValue(torch.float64)], {}, name)
            elif v.dtype == np.float16 and name != "np.linalg.norm":
                raise unsupported(f"{name} of float16 arrays (NumPy raises TypeError)")
    return None


def _fix_linalg_tuple(np_fn):
    def fix(frame, name, bound):
        _fix_linalg(frame, name, bound)
        cls = _linalg_tuple(np_fn)

        def post(result):
            if isinstance(result, TupleValue) and cls is not None and len(result.items) == len(cls._fields):
                return TupleValue(result.items, cls=cls)
            return result
        return post
    return fix


def _result_container(cls):
    """NumPy returns a list here (np.split) or a tuple (np.meshgrid); torch._numpy the other."""
    def fix(frame, name, bound):
        def post(result):
            if isinstance(result, (TupleValue, ListValue)):
                return ListValue(result.items) if cls is list else TupleValue(result.items)
            return result
        return post
    return fix


def _fix_trace(frame, name, bound):
    """np.trace sums: small integers in int64, unsigned ones in uint64 (which torch lacks)."""
    a = _first_array(bound)
    if a is not None and _no_dtype(bound):
        if a.dtype in _SMALL_INTS:
            return _cast_to(frame, np.dtype(np.int64))
        if a.dtype.kind == "u":
            raise unsupported(f"{name} of {a.dtype} accumulates in uint64, which torch lacks")
    return None


def _fix_range_dtype(frame, name, bound):
    """np.arange/linspace/...: a dtype torch cannot make ranges of is a fall-back."""
    dtype = bound.get("dtype")
    if dtype is None or isinstance(dtype, ConstantValue) and dtype.value is None:
        return None
    dt = _dtype_of(dtype)
    if dtype_unsupported_reason(dt):
        raise unsupported(dtype_unsupported_reason(dt))
    if dt.kind == "b":
        raise unsupported(f"{name} of dtype bool (NumPy raises)")
    verdict = _probed.get(("range", dt))
    if verdict is None:
        try:
            torch.arange(2, dtype=NUMPY_TO_TORCH[dt], device=g.default_device())
            torch.linspace(0, 1, 2, dtype=NUMPY_TO_TORCH[dt], device=g.default_device())
            verdict = True
        except (RuntimeError, NotImplementedError) as e:
            verdict = str(e).splitlines()[0]
        _probed[("range", dt)] = verdict
    if verdict is not True:
        raise unsupported(f"{name} of {dt} is not implemented by torch ({verdict})")
    return None


def _fix_complex_unsupported(frame, name, bound):
    a = _first_array(bound)
    if a is not None and a.dtype.kind == "c":
        raise unsupported(f"{name} of complex arrays (ordering them) is not traced")
    return None


def _describe_operand(v):
    """What np.result_type sees for an operand (NEP 50: Python numbers are weak)."""
    if isinstance(v, NdarrayValue):
        return v.dtype
    if isinstance(v, ConstantValue) and isinstance(v.value, np.generic):
        return v.value.dtype
    if isinstance(v, ConstantValue) and isinstance(v.value, (bool, int, float, complex)):
        return v.value
    return None


def _fix_where(frame, name, bound):
    """np.where(c, x, y): the result has NumPy's promoted dtype of x and y; torch._numpy promotes
    Python numbers its own way, so they become 0-d arrays of that dtype first."""
    x, y = bound.get("x"), bound.get("y")
    if x is None or y is None:
        return None
    parts = [_describe_operand(x), _describe_operand(y)]
    if any(p is None for p in parts):
        return None
    dtype = np.result_type(*parts)
    if dtype_unsupported_reason(dtype):
        raise unsupported(dtype_unsupported_reason(dtype))
    for key in ("x", "y"):
        v = bound[key]
        if isinstance(v, ConstantValue):
            bound[key] = _numpy_scalar_array(frame, dtype.type(v.value))
    return _cast_to(frame, dtype)


def _pad_spec(pad_width, ndim):
    """np.pad's pad_width as torch.nn.functional.pad's flat list (last dimension first)."""
    pw = np.broadcast_to(np.asarray(pad_width, dtype=np.int64), (ndim, 2))
    out = []
    for before, after in reversed(pw.tolist()):
        out += [before, after]
    return out


def _fix_pad(frame, name, bound):
    """np.pad with constant padding: torch.nn.functional.pad (torch._numpy's needs the data)."""
    a = _first_array(bound)
    mode = bound.get("mode")
    if a is None or mode is not None and as_constant(mode) != "constant":
        raise unsupported(f"{name} other than mode='constant' is not traced")
    extra = dict(bound.get("kwargs") or {})
    value = extra.pop("constant_values", ConstantValue(0))
    if extra:
        raise unsupported(f"{name}(..., {', '.join(extra)}=...) is not traced")
    value = as_constant(value)
    if not isinstance(value, (int, float, bool)):
        raise unsupported(f"{name}(..., constant_values={value!r}) is not traced")
    spec = _pad_spec(as_constant(bound["pad_width"]), a.fake.dim())
    if min(spec, default=0) < 0:
        raise unsupported(f"{name} with negative widths (eager raises)")
    result = _graph_call(frame, torch.nn.functional.pad, [a, ConstantValue(spec)],
                         {"value": ConstantValue(value)}, name)
    return _array(result)


def _fix_dtype_kept(frame, name, bound):
    """Functions whose result keeps the first array's dtype (torch._numpy may promote)."""
    a = _first_array(bound)
    if a is not None and a.dtype.kind == "b":
        raise unsupported(f"{name} of a bool array (NumPy raises)")
    return _cast_to(frame, a.dtype) if a is not None else None


def _fix_einsum(frame, name, bound):
    """np.einsum keeps the operands' promoted dtype (torch._numpy widens small integers)."""
    operands = [v for v in bound.get("operands", ()) if isinstance(v, NdarrayValue)]
    if not operands or bound.get("dtype") is not None or bound.get("out") is not None:
        return None
    return _cast_to(frame, np.result_type(*[v.dtype for v in operands]))


_A = Spec(array=True)
_S = Spec()

# NumPy functions traced through torch._numpy: name -> Spec (a 0-d result stays an array or
# becomes a NumPy scalar, as NumPy does). Each is compared with NumPy over every supported dtype
# (tests/test_numpy_dtypes.py) and in programs (tests/test_numpy_corpus.py); anything else runs
# natively at a graph break.
TRACED = {
    # creation
    "np.zeros": _A, "np.ones": _A, "np.empty": _A, "np.full": _A, "np.zeros_like": _A, "np.ones_like": _A,
    "np.empty_like": _A, "np.full_like": _A, "np.arange": Spec(array=True, fix=_fix_range_dtype), "np.linspace": Spec(array=True, fix=_fix_range_dtype),
    "np.logspace": Spec(array=True, fix=_fix_range_dtype), "np.geomspace": Spec(array=True, fix=_fix_range_dtype), "np.eye": _A, "np.identity": _A, "np.tri": _A, "np.diag": _A, "np.diagflat": _A,
    "np.meshgrid": Spec(array=True, fix=_result_container(tuple)), "np.indices": _A,
    # shapes
    "np.reshape": Spec(array=True, renames={"shape": "newshape"}), "np.ravel": _A, "np.transpose": _A,
    "np.swapaxes": _A, "np.moveaxis": _A, "np.rollaxis": _A, "np.squeeze": _A, "np.expand_dims": _A,
    "np.atleast_1d": _A, "np.atleast_2d": _A, "np.atleast_3d": _A, "np.broadcast_to": _A,
    "np.broadcast_arrays": Spec(array=True, fix=_result_container(tuple)), "np.concatenate": _A, "np.stack": _A, "np.vstack": _A, "np.hstack": _A,
    "np.dstack": _A, "np.column_stack": _A, "np.row_stack": _A, "np.split": Spec(array=True, fix=_result_container(list)),
    "np.array_split": Spec(array=True, fix=_result_container(list)),
    "np.hsplit": Spec(array=True, fix=_result_container(list)), "np.vsplit": Spec(array=True, fix=_result_container(list)),
    "np.dsplit": Spec(array=True, fix=_result_container(list)), "np.tile": _A, "np.repeat": _A,
    "np.flip": Spec(array=False, fix=_fix_flip), "np.flipud": Spec(array=False, fix=_fix_flip),
    "np.fliplr": Spec(array=False, fix=_fix_flip), "np.roll": _A, "np.rot90": _A,
    "np.tril": _A, "np.triu": _A, "np.diagonal": _A, "np.pad": Spec(array=True, fix=_fix_pad),
    "np.tril_indices": Spec(array=True, fix=_fix_indices), "np.triu_indices": Spec(array=True, fix=_fix_indices),
    "np.tril_indices_from": Spec(array=True, fix=_fix_indices),
    "np.triu_indices_from": Spec(array=True, fix=_fix_indices),
    # reductions
    "np.sum": Spec(fix=_fix_accumulate), "np.prod": Spec(fix=_fix_accumulate),
    "np.cumsum": Spec(fix=_fix_accumulate), "np.cumprod": Spec(fix=_fix_accumulate),
    "np.mean": Spec(fix=_fix_mean_like), "np.std": Spec(fix=_fix_mean_like), "np.var": Spec(fix=_fix_mean_like),
    "np.max": Spec(fix=_fix_complex_unsupported), "np.min": Spec(fix=_fix_complex_unsupported),
    "np.amax": Spec(fix=_fix_complex_unsupported), "np.amin": Spec(fix=_fix_complex_unsupported),
    "np.argmax": Spec(fix=_fix_complex_unsupported), "np.argmin": Spec(fix=_fix_complex_unsupported),
    "np.ptp": Spec(fix=_fix_complex_unsupported),
    "np.all": Spec(fix=_fix_logical_reduction), "np.any": Spec(fix=_fix_logical_reduction),
    "np.median": Spec(fix=_fix_median), "np.average": _S,
    "np.count_nonzero": _S,
    # products, sorting, selection
    "np.dot": _S, "np.vdot": _S, "np.inner": _S, "np.outer": _A, "np.tensordot": _A, "np.einsum": Spec(fix=_fix_einsum),
    "np.kron": _A, "np.cross": _S, "np.trace": Spec(fix=_fix_trace),
    "np.where": Spec(array=True, fix=_fix_where), "np.clip": Spec(renames={"a_min": "min", "a_max": "max"}),
    "np.round": Spec(fix=_fix_dtype_kept), "np.around": Spec(fix=_fix_dtype_kept),
    "np.sort": Spec(array=True, fix=_fix_complex_unsupported), "np.argsort": Spec(array=True, fix=_fix_complex_unsupported),
    "np.take": _S, "np.take_along_axis": _A, "np.diff": _A, "np.ediff1d": _A,
    "np.isclose": _S, "np.nan_to_num": _A, "np.real": _A, "np.imag": _A,
    "np.searchsorted": _S, "np.copy": _A,
    # linalg
    "np.linalg.norm": Spec(fix=_fix_linalg), "np.linalg.det": Spec(fix=_fix_linalg),
    "np.linalg.inv": Spec(array=True, fix=_fix_linalg), "np.linalg.solve": Spec(array=True, fix=_fix_linalg),
    "np.linalg.pinv": Spec(array=True, fix=_fix_linalg), "np.linalg.matrix_power": _A,
    "np.linalg.cholesky": Spec(array=True, fix=_fix_linalg), "np.linalg.eigvalsh": Spec(array=True, fix=_fix_linalg),
    "np.linalg.multi_dot": _S,
    "np.linalg.eigh": Spec(array=True, fix=_fix_linalg_tuple(np.linalg.eigh)),
    "np.linalg.svd": Spec(array=True, fix=_fix_linalg_tuple(np.linalg.svd)),
    "np.linalg.qr": Spec(array=True, fix=_fix_linalg_tuple(np.linalg.qr)),
    "np.linalg.slogdet": Spec(fix=_fix_linalg_tuple(np.linalg.slogdet)),
    # fft: the shifts are rolls, every dtype kept as NumPy keeps it
    "np.fft.fftshift": _A, "np.fft.ifftshift": _A,
}



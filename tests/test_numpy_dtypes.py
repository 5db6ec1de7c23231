"""Traced NumPy functions and ufuncs against eager NumPy, over every supported dtype.

For each program and dtype the function is compiled anew (so the cache limit never hides a
difference) without fullgraph: what is traced must equal eager NumPy (values, dtypes, result
types), and what is not falls back to NumPy and equals it too. A failing eager call must fail
compiled as well. The test also checks that the common programs stay traced (one graph) for
the numeric dtypes, so the checked list in trace/numpy_api/numpy_functions.py does not silently shrink,
and that for float64 the number of graphs is torch.compile's (which traces NumPy too). Each
compiled function is called again on other values of the same dtype and shape.
"""
import warnings

import numpy as np
import pytest

import bytegraph
from bytegraph.testing import CompileCounter
from helpers import torch_compile_graphs
from numpy_helpers import same_np

DTYPES = [np.bool_, np.int8, np.int16, np.int32, np.int64, np.uint8, np.float16, np.float32, np.float64,
          np.complex64, np.complex128]
RNG = np.random.default_rng(5)


def sample(dtype, shape=(3, 4)):
    dtype = np.dtype(dtype)
    if dtype.kind == "b":
        return RNG.random(shape) > 0.5
    if dtype.kind in "iu":
        return RNG.integers(1, 6, shape).astype(dtype)
    if dtype.kind == "c":
        return (RNG.standard_normal(shape) + 1j * RNG.standard_normal(shape)).astype(dtype)
    return RNG.standard_normal(shape).astype(dtype)


PROGRAMS = {
    # ufuncs and operators
    "add_self": lambda x: x + x, "sub_const": lambda x: x - 1, "mul_float": lambda x: x * 2.5,
    "truediv": lambda x: x / 3, "floordiv": lambda x: x // 2, "mod": lambda x: x % 3, "pow2": lambda x: x ** 2,
    "neg": lambda x: -x, "abs": lambda x: np.abs(x), "invert": lambda x: ~x, "and": lambda x: x & x,
    "lt": lambda x: x < 2, "eq": lambda x: x == x, "maximum": lambda x: np.maximum(x, 1),
    "sqrt": lambda x: np.sqrt(x), "exp": lambda x: np.exp(x), "log1p": lambda x: np.log1p(x),
    "sin": lambda x: np.sin(x), "tanh": lambda x: np.tanh(x), "sign": lambda x: np.sign(x),
    "floor": lambda x: np.floor(x), "rint": lambda x: np.rint(x), "square": lambda x: np.square(x),
    "isnan": lambda x: np.isnan(x), "conj": lambda x: np.conj(x), "hypot": lambda x: np.hypot(x, x),
    "arctan2": lambda x: np.arctan2(x, 2.0), "logical_and": lambda x: np.logical_and(x, x),
    "matmul": lambda x: x @ x.T,
    # reductions
    "sum": lambda x: np.sum(x), "sum0": lambda x: x.sum(axis=0), "prod": lambda x: np.prod(x, axis=1),
    "mean": lambda x: np.mean(x, axis=0), "std": lambda x: x.std(), "var": lambda x: np.var(x, axis=1),
    "max": lambda x: np.max(x, axis=0), "min": lambda x: x.min(), "argmax": lambda x: np.argmax(x, axis=1),
    "all": lambda x: np.all(x, axis=0), "any": lambda x: x.any(), "cumsum": lambda x: np.cumsum(x, axis=1),
    "cumprod": lambda x: np.cumprod(x), "median": lambda x: np.median(x), "ptp": lambda x: np.ptp(x, axis=0),
    "keepdims": lambda x: np.sum(x, axis=1, keepdims=True), "average": lambda x: np.average(x, axis=0),
    # shapes, selection
    "reshape": lambda x: x.reshape(2, 6), "transpose": lambda x: np.transpose(x),
    "concat": lambda x: np.concatenate([x, x], axis=1), "stack": lambda x: np.stack([x, x]),
    "where": lambda x: np.where(x == x, x, 0), "clip": lambda x: np.clip(x, 1, 3),
    "sort": lambda x: np.sort(x, axis=1), "argsort": lambda x: np.argsort(x, axis=0),
    "flip": lambda x: np.flip(x, 0), "roll": lambda x: np.roll(x, 1), "tile": lambda x: np.tile(x, 2),
    "take": lambda x: np.take(x, [0, 3]), "diag": lambda x: np.diag(x), "tril": lambda x: np.tril(x),
    "dot": lambda x: np.dot(x, x.T), "einsum": lambda x: np.einsum("ij,ij->i", x, x),
    "round": lambda x: np.round(x, 1), "astype_f32": lambda x: x.astype(np.float32),
    "zeros_like": lambda x: np.zeros_like(x), "full_like": lambda x: np.full_like(x, 2),
    "getitem": lambda x: (x[1], x[1, 2], x[:, ::2], x[[0, 2]]),
    "amax_amin": lambda x: (np.amax(x, axis=1), np.amin(x)), "argmin": lambda x: x.argmin(axis=0),
    "diff": lambda x: np.diff(x, axis=1), "repeat": lambda x: np.repeat(x, 2, axis=0),
    "squeeze_expand": lambda x: np.squeeze(np.expand_dims(x, 0), 0), "moveaxis": lambda x: np.moveaxis(x, 0, 1),
    "swapaxes": lambda x: np.swapaxes(x, 0, 1), "broadcast_to": lambda x: np.broadcast_to(x[:1], (2, 4)),
    "split": lambda x: np.split(x, 2, axis=1), "array_split": lambda x: np.array_split(x, 3),
    "vstack_hstack": lambda x: (np.vstack([x, x]), np.hstack([x, x])), "outer": lambda x: np.outer(x[0], x[1]),
    "kron": lambda x: np.kron(x[:2, :2], x[:2, :2]), "cross": lambda x: np.cross(x[0, :3], x[1, :3]),
    "trace": lambda x: np.trace(x), "diagonal": lambda x: np.diagonal(x), "triu": lambda x: np.triu(x, 1),
    "tril_indices_from": lambda x: x[np.tril_indices_from(x[:3, :3])], "rot90": lambda x: np.rot90(x),
    "isclose": lambda x: np.isclose(x, x), "nan_to_num": lambda x: np.nan_to_num(x),
    "real_imag": lambda x: (np.real(x), np.imag(x)), "angle": lambda x: np.angle(x),
    "searchsorted": lambda x: np.searchsorted(np.sort(x.ravel()), x[0]),
    "take_along_axis": lambda x: np.take_along_axis(x, np.argsort(x, axis=1), axis=1),
    "inner_vdot": lambda x: (np.inner(x, x), np.vdot(x, x)), "tensordot": lambda x: np.tensordot(x, x, axes=([1], [1])),
    "copy": lambda x: np.copy(x), "count_nonzero": lambda x: np.count_nonzero(x, axis=0),
    "around_fix": lambda x: (np.around(x), np.fix(x)), "meshgrid": lambda x: np.meshgrid(x[0], x[1]),
    "norm": lambda x: np.linalg.norm(x, axis=1), "det": lambda x: np.linalg.det(x[:3, :3] + 3 * np.eye(3, dtype=x.dtype)),
    "inv": lambda x: np.linalg.inv(x[:3, :3] + 3 * np.eye(3, dtype=x.dtype)),
    "solve": lambda x: np.linalg.solve(x[:3, :3] + 3 * np.eye(3, dtype=x.dtype), x[:3, 0]),
    "svdvals": lambda x: np.linalg.svd(x, compute_uv=False), "pinv": lambda x: np.linalg.pinv(x),
    "eigvalsh": lambda x: np.linalg.eigvalsh(x @ x.T), "qr_r": lambda x: np.abs(np.linalg.qr(x)[1]),
    "cholesky": lambda x: np.linalg.cholesky(x @ x.T + 4 * np.eye(3, dtype=x.dtype)),
    "linspace_arange": lambda x: (np.linspace(0, x.shape[0], 5, dtype=x.dtype), np.arange(4, dtype=x.dtype)),
    "eye_full": lambda x: (np.eye(3, dtype=x.dtype), np.full((2, 2), 1, dtype=x.dtype)),
    "setitem": lambda x: (x.__setitem__((0, 0), 1), x)[1],
    "iadd": lambda x: x.__iadd__(1),
    "fftshift": lambda x: (np.fft.fftshift(x), np.fft.ifftshift(x, axes=1), np.fft.fftshift(x[0], axes=(0,))),
}

# Programs that must stay one graph for these dtype kinds (b: bool, i/u: ints, f: floats, c: complex).
MUST_TRACE = {
    "add_self": "biufc", "mul_float": "biufc", "truediv": "iufc", "pow2": "iufc", "sqrt": "iufc",
    "exp": "iufc", "sum": "bifc", "sum0": "bifc", "mean": "iufc", "max": "biuf", "all": "biufc",
    "cumsum": "bif", "reshape": "biufc", "where": "biufc", "clip": "iuf", "dot": "iufc",
    "getitem": "biufc", "setitem": "biufc", "astype_f32": "biuf", "matmul": "iufc", "fftshift": "biufc",
    "and": "biu", "invert": "biu",
}


# Programs torch.compile runs natively (no graph) where bytegraph traces them (float64).
TORCH_DOES_NOT_TRACE = {"cholesky", "det", "inv", "solve", "linspace_arange", "eye_full"}


# Programs whose results a graph answering its first call's outputs cannot change
# (scripts/mutate.py's memo_graph; the mark ``mutation_blind``), and why.
MEMO_BLIND = {
    "any": "the samples hold no zero (integers from 1, floats drawn nonzero): any() is True on every call",
    "eq": "x == x is all True whatever the values",
    "isclose": "isclose(x, x) is all True whatever the values",
    "isnan": "the samples hold no NaN: all False on every call",
    "zeros_like": "no result depends on the argument's values",
    "full_like": "no result depends on the argument's values",
    "eye_full": "no result depends on the argument's values",
    "linspace_arange": "no result depends on the argument's values (only its shape)",
    "flip": "its result is a view of the argument, made again from it after the graph",
}


@pytest.mark.parametrize("name", [pytest.param(n, marks=[pytest.mark.mutation_blind("memo_graph", reason=MEMO_BLIND[n])]
                                               if n in MEMO_BLIND else []) for n in sorted(PROGRAMS)])
def test_program_over_dtypes(name):
    fn = PROGRAMS[name]
    for dtype in DTYPES:
        x = sample(dtype)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                expected = fn(x.copy())
                error = None
            except Exception as e:      # eager NumPy refuses: so must the compiled code
                expected, error = None, type(e)
            cnt = CompileCounter()
            compiled = bytegraph.compile(fn, backend=cnt)
            if error is not None:
                with pytest.raises(Exception) as info:
                    compiled(x.copy())
                assert isinstance(info.value, error) or issubclass(error, type(info.value)), (
                    f"{name}[{np.dtype(dtype)}]: eager raised {error.__name__}, compiled {type(info.value).__name__}")
                continue
            actual = compiled(x.copy())
            graphs = cnt.frame_count
            # Other values, same dtype and shape: no recompile. Drawn until eager accepts them
            # (an integer matrix can be singular for solve/inv).
            for _ in range(20):
                other = sample(dtype)
                try:
                    expected_other = fn(other.copy())
                    break
                except Exception:   # noqa: BLE001
                    continue
            actual_other = compiled(other.copy())
        tol = 1e-2 if np.dtype(dtype) in (np.float16, np.complex64, np.float32) else 1e-6
        try:
            same_np(expected, actual, rtol=tol, atol=tol)
            same_np(expected_other, actual_other, rtol=tol, atol=tol)
        except AssertionError as e:
            raise AssertionError(f"{name}[{np.dtype(dtype)}]: {e}") from None
        assert cnt.frame_count == graphs, f"{name}[{np.dtype(dtype)}] recompiled for other values"
        if np.dtype(dtype) == np.float64:
            reference = 0 if name in TORCH_DOES_NOT_TRACE else torch_compile_graphs(fn, (x.copy(),))
            assert graphs == (1 if name in TORCH_DOES_NOT_TRACE else reference), (
                f"{name}[float64]: {graphs} graph(s), torch.compile makes {reference}")
        kinds = MUST_TRACE.get(name, "")
        if np.dtype(dtype).kind in kinds and np.dtype(dtype) != np.float16:
            assert cnt.frame_count == 1 and cnt.op_count > 0, f"{name}[{np.dtype(dtype)}] is no longer traced"

"""NumPy programs: eager NumPy vs bytegraph + Inductor vs torch.compile + Inductor (CPU by default).

    OMP_NUM_THREADS=1 python bench/numpy_speed.py [--repeat 5] [--json PATH] [--device cpu|cuda]

Programs (np.ndarray in, np.ndarray out; float64 like NumPy's defaults):

* ``faq``: the FAQ's ``np.sum(X[:, :, None] * Y[:, None, :], axis=(-2, -1))`` on 1024x64 arrays;
* ``kmeans``: one k-means assignment and update step (pairwise distances, argmin, per-cluster mean
  through a one-hot matrix), 4096 points x 16 dims, 32 centroids;
* ``layernorm_gelu``: row-wise standardisation, tanh-GELU and a residual, 2048x512;
* ``small``: ``np.tanh(x) * 2 + 1`` on 16 elements: mostly per-call overhead.

Each compiled function is called once to compile (the compile time is printed), checked against
NumPy, then timed: the best of ``--repeat`` loops of about ``--target-ms`` each, as ms per call.
With ``--device cuda`` the compiled calls run inside ``with torch.device("cuda")`` (the FAQ's way
to run NumPy code on the GPU: arrays go to the GPU, results come back as arrays).
"""
import argparse
import json
import os
import sys
import time
from pathlib import Path

_ROOT = Path(__file__).resolve().parent.parent
if str(_ROOT) not in sys.path:
    sys.path.insert(0, str(_ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402

import bytegraph  # noqa: E402

bytegraph.config.persistent_cache = False   # measure compiles, not loads from an earlier run's cache


def faq(X, Y):
    return np.sum(X[:, :, None] * Y[:, None, :], axis=(-2, -1))


def kmeans(points, centroids):
    d = ((points[:, None, :] - centroids[None, :, :]) ** 2).sum(axis=-1)
    labels = np.argmin(d, axis=1)
    onehot = (labels[:, None] == np.arange(centroids.shape[0])[None, :]).astype(points.dtype)
    counts = onehot.sum(axis=0)
    new = (onehot.T @ points) / np.maximum(counts, 1)[:, None]
    return new, d.min(axis=1).sum()


def layernorm_gelu(x, w):
    mu = x.mean(axis=1, keepdims=True)
    y = (x - mu) / np.sqrt(x.var(axis=1, keepdims=True) + 1e-5)
    g = 0.5 * y * (1.0 + np.tanh(0.7978845608 * (y + 0.044715 * y ** 3)))
    return x + g * w


def small(x):
    return np.tanh(x) * 2 + 1


def _inputs():
    rng = np.random.default_rng(0)
    return {
        "faq": (faq, (rng.standard_normal((1024, 64)), rng.standard_normal((1024, 64)))),
        "kmeans": (kmeans, (rng.standard_normal((4096, 16)), rng.standard_normal((32, 16)))),
        "layernorm_gelu": (layernorm_gelu, (rng.standard_normal((2048, 512)), rng.standard_normal(512))),
        "small": (small, (rng.standard_normal(16),)),
    }


def _time(fn, args, target_ms, repeat):
    fn(*args)
    start = time.perf_counter()
    fn(*args)
    one = max(time.perf_counter() - start, 1e-6)
    number = max(3, int(target_ms / 1e3 / one))
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        for _ in range(number):
            fn(*args)
        best = min(best, (time.perf_counter() - start) / number)
    return best * 1e3


def _check(expected, actual, what):
    exp = expected if isinstance(expected, tuple) else (expected,)
    act = actual if isinstance(actual, tuple) else (actual,)
    for e, a in zip(exp, act):
        if type(e) is not type(a) or not np.allclose(e, a, rtol=1e-6, atol=1e-6):
            raise AssertionError(f"{what}: result differs from NumPy ({type(e).__name__} vs {type(a).__name__})")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--target-ms", type=float, default=300.0)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--only", default="")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)

    import torch._dynamo  # the reference front end, for the comparison only

    device_ctx = torch.device(args.device) if args.device != "cpu" else None
    rows = []
    programs = _inputs()
    only = [s for s in args.only.split(",") if s]
    for name, (fn, inputs) in programs.items():
        if only and name not in only:
            continue
        expected = fn(*inputs)
        row = {"program": name, "numpy_ms": _time(fn, inputs, args.target_ms, args.repeat)}
        for key, make in (("bytegraph", lambda f: bytegraph.compile(f)),
                          ("torch_compile", lambda f: torch.compile(f))):
            bytegraph.reset()
            torch._dynamo.reset()
            compiled = make(fn)

            def call(*a, compiled=compiled):
                if device_ctx is None:
                    return compiled(*a)
                with device_ctx:
                    return compiled(*a)

            start = time.perf_counter()
            actual = call(*inputs)
            row[f"{key}_compile_s"] = time.perf_counter() - start
            _check(expected, actual, f"{name} / {key}")
            row[f"{key}_ms"] = _time(call, inputs, args.target_ms, args.repeat)
        rows.append(row)

    threads = os.environ.get("OMP_NUM_THREADS", "unset")
    print(f"NumPy programs, device={args.device}, OMP_NUM_THREADS={threads}, torch.get_num_threads()="
          f"{torch.get_num_threads()}, torch {torch.__version__}, numpy {np.__version__}")
    header = f"{'program':16s} {'numpy ms':>10s} {'bytegraph ms':>13s} {'torch.compile ms':>17s} " \
             f"{'bg/tc':>7s} {'np/bg':>7s} {'compile s bg/tc':>16s}"
    print(header)
    print("-" * len(header))
    for r in rows:
        ratio = r["bytegraph_ms"] / r["torch_compile_ms"]
        speedup = r["numpy_ms"] / r["bytegraph_ms"]
        print(f"{r['program']:16s} {r['numpy_ms']:10.3f} {r['bytegraph_ms']:13.3f} {r['torch_compile_ms']:17.3f} "
              f"{ratio:7.2f} {speedup:7.2f} {r['bytegraph_compile_s']:7.1f}/{r['torch_compile_compile_s']:<7.1f}")
    print("bg/tc: bytegraph time over torch.compile time (below 1.10 is the goal); np/bg: NumPy time over "
          "bytegraph time (above 1: faster than NumPy)")
    if args.json:
        Path(args.json).write_text(json.dumps({"device": args.device, "omp_num_threads": threads,
                                               "rows": rows}, indent=2))
    return rows


if __name__ == "__main__":
    main()

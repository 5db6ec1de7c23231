"""What depth costs: capture, time outside the graph per call, and first call, for 2/8/32/64 layers.

    OMP_NUM_THREADS=1 python bench/depth.py [--layers 2,8,32,64] [--repeat 3] [--backend eager]
                                           [--only bytegraph|torch] [--json PATH]

The subject is a nanoGPT-style decoder (``bytegraph.demo.models.TinyGPT``, d=128, 4 heads),
called on 1 x 8 tokens in eval mode under ``torch.no_grad()``, on the CPU with one thread. For
bytegraph and torch.compile side by side, in one process, each depth gets:

* **capture ms**: wall time of the first call after a reset with ``backend="eager"``, less one
  eager call of the model (what is left is the front end's work: tracing, guards, code);
  median of ``--repeat`` fresh compiles of a fresh model;
* **outside µs**: steady-state time per call with a backend whose compiled function returns
  the output it computed once (so the graph itself costs nothing): guards, dispatch, the
  transformed function, output handling; best of ``--repeat`` timing loops;
* **first call ms**: wall time of the first call after a reset with ``--backend`` (default
  ``eager``: then it is capture plus one eager call); with ``--backend inductor`` on a GPU
  machine (``--device cuda``) this is the compile-dominated first call.

bytegraph's capture also shows its phases from ``bytegraph.compile_times()``.
"""
import argparse
import gc
import json
import os
import statistics
import sys
import time
from pathlib import Path

_ROOT = Path(__file__).resolve().parent.parent
if str(_ROOT) not in sys.path:
    sys.path.insert(0, str(_ROOT))

import torch  # noqa: E402

import bytegraph  # noqa: E402
from bytegraph.demo.models import GPTConfig, TinyGPT  # noqa: E402

bytegraph.config.persistent_cache = False   # measure compiles, not loads from an earlier run's cache


def make_model(layers, device):
    torch.manual_seed(0)
    cfg = GPTConfig(n_layer=layers, n_embd=128, n_head=4, block_size=8, vocab_size=256, dropout=0.0)
    model = TinyGPT(cfg).to(device).eval()
    x = torch.randint(0, cfg.vocab_size, (1, 8), device=device)
    return model, x


def cached_backend(gm, example_inputs):
    """A backend whose compiled function returns the graph's output of the first run."""
    with torch.no_grad():
        out = gm(*example_inputs)

    def run(*args):
        return out
    return run


def _sync(device):
    if device == "cuda":
        torch.cuda.synchronize()


class Front:
    def __init__(self, key):
        self.key = key

    def reset(self):
        if self.key == "bytegraph":
            bytegraph.reset()
        else:
            import torch._dynamo   # the reference
            torch._dynamo.reset()

    def compile(self, model, backend):
        if self.key == "bytegraph":
            return bytegraph.compile(model, backend=backend)
        return torch.compile(model, backend=backend)


def first_call_ms(front, layers, device, backend):
    model, x = make_model(layers, device)
    front.reset()
    gc.collect()
    compiled = front.compile(model, backend)
    with torch.no_grad():
        _sync(device)
        t0 = time.perf_counter()
        compiled(x)
        _sync(device)
        return (time.perf_counter() - t0) * 1e3


def eager_call_ms(layers, device):
    model, x = make_model(layers, device)
    with torch.no_grad():
        for _ in range(3):
            model(x)
        _sync(device)
        t0 = time.perf_counter()
        n = 20
        for _ in range(n):
            model(x)
        _sync(device)
        return (time.perf_counter() - t0) * 1e3 / n


def outside_us(front, layers, device, repeat):
    model, x = make_model(layers, device)
    front.reset()
    compiled = front.compile(model, cached_backend)
    with torch.no_grad():
        for _ in range(3):
            compiled(x)
        # Loops of about 50 ms each, garbage collector off.
        t0 = time.perf_counter()
        compiled(x)
        one = max(time.perf_counter() - t0, 1e-6)
        number = max(50, int(0.05 / one))
        best = float("inf")
        gc.disable()
        try:
            for _ in range(max(repeat, 3)):
                t0 = time.perf_counter()
                for _ in range(number):
                    compiled(x)
                best = min(best, (time.perf_counter() - t0) / number)
        finally:
            gc.enable()
    return best * 1e6


def bytegraph_phases():
    total = bytegraph.compile_times(repr="dict")["total"]
    return {k: round(v * 1e3, 1) for k, v in total.items()}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", default="2,8,32,64")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--backend", default="eager", help="backend of the first-call column")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--only", choices=("bytegraph", "torch"), default=None)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    layers = [int(n) for n in args.layers.split(",")]
    fronts = [Front(k) for k in ("bytegraph", "torch") if args.only in (None, k)]
    results = {}
    for front in fronts:   # the first compile in a process pays for imports and caches: not counted
        first_call_ms(front, 1, args.device, "eager")
        outside_us(front, 1, args.device, 1)
    print(f"torch {torch.__version__}, python {sys.version.split()[0]}, device {args.device}, "
          f"threads {torch.get_num_threads()}, OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')}, "
          f"first-call backend {args.backend}")
    head = f"{'layers':>6} | {'compiler':>13} | {'capture ms':>10} | {'outside µs':>10} | {'first call ms':>13}"
    print(head)
    print("-" * len(head))
    for n in layers:
        eager_ms = eager_call_ms(n, args.device)
        for front in fronts:
            caps, phases = [], None
            for _ in range(args.repeat):
                caps.append(first_call_ms(front, n, args.device, "eager") - eager_ms)
                if front.key == "bytegraph":
                    phases = bytegraph_phases()
            capture = statistics.median(caps)
            if args.backend == "eager":
                first = capture + eager_ms
            else:
                first = first_call_ms(front, n, args.device, args.backend)
            outside = outside_us(front, n, args.device, args.repeat)
            label = "bytegraph" if front.key == "bytegraph" else "torch.compile"
            print(f"{n:>6} | {label:>13} | {capture:>10.1f} | {outside:>10.1f} | {first:>13.1f}"
                  + (f"   phases ms: {phases}" if phases else ""), flush=True)
            results.setdefault(str(n), {})[front.key] = {
                "capture_ms": capture, "capture_all_ms": caps, "outside_us": outside,
                "first_call_ms": first, "eager_call_ms": eager_ms, "phases_ms": phases}
    if args.json:
        Path(args.json).write_text(json.dumps({"torch": torch.__version__, "python": sys.version,
                                               "device": args.device, "backend": args.backend,
                                               "results": results}, indent=1))


if __name__ == "__main__":
    main()

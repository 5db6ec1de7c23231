"""Cold and warm first calls: the same model compiled in two fresh processes over one persistent cache.

    OMP_NUM_THREADS=1 python bench/warm_start.py [--layers 8] [--backend eager] [--device cpu] [--runs 3]

Each run makes a new, empty cache directory (``BYTEGRAPH_CACHE_DIR``), then starts a fresh
Python process that compiles a nanoGPT-style model (``bytegraph.demo.models.TinyGPT``, d=128,
4 heads, 1 x 8 tokens, eval, ``torch.no_grad()``) and times its first call (cold: traced,
compiled, saved), then a second fresh process that does the same (warm: loaded from the
cache). Both processes import torch and bytegraph before the clock starts. Prints the median
over ``--runs`` of each and the warm/cold ratio; checks that both results equal eager.

With ``--backend inductor --device cuda`` (on a GPU machine) the warm process also finds
Inductor's own FX graph cache and AOTAutograd's cache (``TORCHINDUCTOR_CACHE_DIR``, set per run
here too, so the cold run really is cold).

Python must be allowed to keep bytecode caches (``__pycache__``), as on any ordinary install:
with ``PYTHONDONTWRITEBYTECODE=1`` (set in some container images) every process compiles the
source of each module Inductor imports during the first call again, seconds that are no cost
of either cold or warm start. The script says so when it sees that setting; run it with
``env -u PYTHONDONTWRITEBYTECODE PYTHONPYCACHEPREFIX=/tmp/pyc`` (a writable place) there.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

_ROOT = Path(__file__).resolve().parent.parent

CHILD = r"""
import json, sys, time
import torch
import bytegraph
from bytegraph.demo.models import GPTConfig, TinyGPT
layers, backend, device = int(sys.argv[1]), sys.argv[2], sys.argv[3]
torch.set_num_threads(1)
torch.manual_seed(0)
model = TinyGPT(GPTConfig(n_layer=layers, n_embd=128, n_head=4, block_size=8, vocab_size=256,
                          dropout=0.0)).to(device).eval()
x = torch.randint(0, 256, (1, 8), device=device)
compiled = bytegraph.compile(model, backend=backend)
with torch.no_grad():
    if device == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    out = compiled(x)
    if device == "cuda":
        torch.cuda.synchronize()
    first = time.perf_counter() - t0
    same = torch.allclose(out, model(x), atol=1e-4, rtol=1e-4)
from bytegraph.debug import records
print(json.dumps({"first_ms": first * 1e3, "same": bool(same), "frames": len(records.frames)}))
"""


def child(layers, backend, device, cache, inductor_cache):
    env = dict(os.environ, BYTEGRAPH_CACHE_DIR=cache, TORCHINDUCTOR_CACHE_DIR=inductor_cache,
               PYTHONPATH=str(_ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.setdefault("OMP_NUM_THREADS", "1")
    out = subprocess.run([sys.executable, "-c", CHILD, str(layers), backend, device], env=env,
                         capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise SystemExit(f"child process failed:\n{out.stderr[-4000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--backend", default="eager")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args(argv)
    if os.environ.get("PYTHONDONTWRITEBYTECODE"):
        print("note: PYTHONDONTWRITEBYTECODE is set: each process compiles every imported module's source again "
              "(unset it, with PYTHONPYCACHEPREFIX pointing somewhere writable, to measure as on an ordinary install)")
    cold, warm = [], []
    for _ in range(args.runs):
        with tempfile.TemporaryDirectory() as cache, tempfile.TemporaryDirectory() as inductor_cache:
            c = child(args.layers, args.backend, args.device, cache, inductor_cache)
            w = child(args.layers, args.backend, args.device, cache, inductor_cache)
            if not (c["same"] and w["same"]):
                raise SystemExit(f"results differ from eager: cold {c}, warm {w}")
            cold.append(c["first_ms"])
            warm.append(w["first_ms"])
    c, w = statistics.median(cold), statistics.median(warm)
    print(f"python {sys.version.split()[0]}, {args.layers} layers, backend {args.backend}, device {args.device}, "
          f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', '1')}")
    print(f"cold first call: {c:9.1f} ms   (runs: {', '.join(f'{v:.0f}' for v in cold)})")
    print(f"warm first call: {w:9.1f} ms   (runs: {', '.join(f'{v:.0f}' for v in warm)})")
    print(f"warm / cold:     {w / c:9.2f}")


if __name__ == "__main__":
    main()

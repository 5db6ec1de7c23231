"""Regional compilation: first call and steady-state step of a GPT-2-small-like model with Inductor.

    python bench/regional.py [--device cuda] [--layers 12] [--n-embd 768] [--heads 12] [--tokens 256]
                             [--batch 1] [--train] [--only regional,whole,torch]

Three ways, each in a fresh process (so Inductor's in-memory state does not carry over; its
on-disk FX graph cache is pointed at a new directory per process, so every first call is cold):

* ``regional``: bytegraph, ``backend="inductor"``, each distinct block compiled once;
* ``whole``: bytegraph with ``BYTEGRAPH_REGIONAL_COMPILE=0`` (the whole graph at once);
* ``torch``: ``torch.compile(backend="inductor")``.

For each: the first call (compile-dominated) and the median steady-state step (inference
under ``no_grad``; with ``--train`` forward + backward of the summed logits). The persistent
cache is off. On the CPU it runs too (slowly: Inductor's C++ compiles). On a GPU ``regional``
keeps the graph whole with each distinct block a shared subgraph (``backends/subgraphs.py``)
where its blocks do enough work (``regions.worth_sharing``), for training too; below that it is
compiled as ``whole`` is.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

_ROOT = Path(__file__).resolve().parent.parent

CHILD = r"""
import json, statistics, sys, time
import torch
way, device, layers, n_embd, heads, tokens, batch, train = sys.argv[1:9]
layers, n_embd, heads, tokens, batch, train = int(layers), int(n_embd), int(heads), int(tokens), int(batch), train == "1"
from bytegraph.demo.models import GPTConfig, TinyGPT
torch.manual_seed(0)
cfg = GPTConfig(n_layer=layers, n_embd=n_embd, n_head=heads, block_size=tokens, vocab_size=50304, dropout=0.0,
                flash=True)
model = TinyGPT(cfg).to(device)
model.train(train)
x = torch.randint(0, cfg.vocab_size, (batch, tokens), device=device)
if way == "torch":
    compiled = torch.compile(model, backend="inductor")
else:
    import bytegraph
    bytegraph.config.persistent_cache = False
    compiled = bytegraph.compile(model, backend="inductor")
def sync():
    if device == "cuda":
        torch.cuda.synchronize()
def step():
    if train:
        out = compiled(x)
        out.float().sum().backward()
    else:
        with torch.no_grad():
            compiled(x)
sync(); t0 = time.perf_counter(); step(); sync(); first = time.perf_counter() - t0
for _ in range(3):
    step()
times = []
for _ in range(20):
    sync(); t0 = time.perf_counter(); step(); sync(); times.append(time.perf_counter() - t0)
print(json.dumps({"first_s": first, "step_ms": statistics.median(times) * 1e3}))
"""


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if _cuda() else "cpu")
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--n-embd", type=int, default=768)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--train", action="store_true")
    parser.add_argument("--only", default="regional,whole,torch")
    args = parser.parse_args(argv)
    print(f"{args.layers} layers, d={args.n_embd}, {args.heads} heads, {args.batch}x{args.tokens} tokens, "
          f"{'training step' if args.train else 'inference'}, device {args.device}")
    print(f"{'way':>9} | {'first call s':>12} | {'step ms':>9}")
    for way in args.only.split(","):
        with tempfile.TemporaryDirectory() as inductor_cache:
            env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=inductor_cache,
                       PYTHONPATH=str(_ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
                       BYTEGRAPH_REGIONAL_COMPILE="0" if way == "whole" else "1")
            out = subprocess.run([sys.executable, "-c", CHILD, "torch" if way == "torch" else way, args.device,
                                  str(args.layers), str(args.n_embd), str(args.heads), str(args.tokens),
                                  str(args.batch), "1" if args.train else "0"],
                                 env=env, capture_output=True, text=True)
        if out.returncode != 0:
            print(f"{way:>9} | failed: {out.stderr.strip().splitlines()[-1] if out.stderr.strip() else '?'}")
            continue
        r = json.loads(out.stdout.strip().splitlines()[-1])
        print(f"{way:>9} | {r['first_s']:>12.2f} | {r['step_ms']:>9.2f}", flush=True)


def _cuda():
    try:
        import torch
        return torch.cuda.is_available()
    except Exception:
        return False


if __name__ == "__main__":
    main()

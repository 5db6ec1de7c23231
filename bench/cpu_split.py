"""Steps on the CPU of a GPT compiled split at its blocks, compiled whole, and by torch.compile.

Variants: bytegraph's default, bytegraph forced to split, bytegraph with regional compilation
off, torch.compile. Each variant runs in its own fresh process (Inductor's caches in a new folder): first call,
then the median of ``--steps`` timed steps after 20 untimed ones. ``--mode train`` times the
model's forward and backward (the model compiled alone), ``--mode infer`` its forward under
``no_grad``. The figures behind ``regions.worth_splitting``'s rule for the CPU::

    python bench/cpu_split.py --mode train
    python bench/cpu_split.py --mode infer
    python bench/cpu_split.py --mode train --layers 6 --d 128 --batch 8
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# "default": bytegraph as it decides; "split": split at the blocks whatever the rule says;
# "whole": regional compilation off.
VARIANTS = {"default": {}, "split": {}, "whole": {"BYTEGRAPH_REGIONAL_COMPILE": "0"}, "torch.compile": {}}


def measure(args):
    import torch
    import bytegraph
    from bytegraph.demo.models import GPTConfig, TinyGPT
    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    train = args.mode == "train"
    model = TinyGPT(GPTConfig(n_layer=args.layers, n_embd=args.d, n_head=4, block_size=args.tokens,
                              vocab_size=512, dropout=0.0)).train(train)
    x = torch.randint(0, 512, (args.batch, args.tokens))
    if args.only == "torch.compile":
        compiled = torch.compile(model)
    else:
        if args.only == "split":
            from bytegraph.backends import inductor
            inductor.worth_splitting = lambda gm: True
        compiled = bytegraph.compile(model, backend="inductor")
    torch.set_grad_enabled(train)

    def step():
        y = compiled(x)
        if train:
            y.float().sum().backward()
    t0 = time.perf_counter()
    step()
    first = time.perf_counter() - t0
    for _ in range(20):
        step()
    times = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        step()
        times.append((time.perf_counter() - t0) * 1e3)
    return {"variant": args.only, "first_s": first, "step_ms": statistics.median(times),
            "spread_ms": [min(times), max(times)]}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--mode", choices=["train", "infer"], default="train")
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--d", type=int, default=256)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--only", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.only:
        print(json.dumps(measure(args)), flush=True)
        return
    print(f"{args.mode}: GPT {args.layers} layers, d={args.d}, {args.batch}x{args.tokens} tokens, "
          f"{args.threads} threads")
    for variant in args.variants.split(","):
        env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=tempfile.mkdtemp(prefix="cpu_split_"),
                   BYTEGRAPH_CACHE_DIR=tempfile.mkdtemp(prefix="cpu_split_bg_"), **VARIANTS[variant])
        cmd = [sys.executable, os.path.abspath(__file__), "--only", variant] + [
            f"--{k}={v}" for k, v in vars(args).items() if k not in ("only", "variants")]
        out = subprocess.run(cmd, env=env, capture_output=True, text=True)
        line = next((ln for ln in out.stdout.splitlines() if ln.startswith("{")), None)
        if line is None:
            print(f"{variant:>14}: failed: {(out.stderr.strip().splitlines() or ['no output'])[-1]}")
            continue
        r = json.loads(line)
        print(f"{variant:>14}: first call {r['first_s']:6.1f} s, step {r['step_ms']:7.2f} ms "
              f"({r['spread_ms'][0]:.2f}-{r['spread_ms'][1]:.2f})")


if __name__ == "__main__":
    main()

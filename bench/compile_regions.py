"""Capture time against depth with the block's forward marked ``torch.compiler.nested_compile_region``.

    OMP_NUM_THREADS=1 python bench/compile_regions.py [--layers 2,8,32] [--repeat 3] [--grad] [--clock cpu] [--stat min]
    OMP_NUM_THREADS=1 python bench/compile_regions.py --layers 2,32 --only regions --calls

The subject is ``bench/depth.py``'s nanoGPT-style decoder (``TinyGPT``, d=128, 4 heads, 1 x 8
tokens, CPU, one thread) with each ``Block`` replaced by a subclass whose ``forward`` is marked
(``--grad``: in training mode with gradients, else eval under ``torch.no_grad()``). Columns: capture
ms (first call with ``backend="eager"`` less one eager call; median of ``--repeat`` fresh
compiles, the depths taking turns; ``--clock cpu``: this process's CPU time, which other work on a shared machine
disturbs less than wall time; ``--stat min``: the least of the repeats, steadier there than the
median) for bytegraph with the regions, bytegraph with the same model unmarked (flat graph,
repeated blocks copied: trace/blocks.py), bytegraph with ``config.nest_repeated_blocks`` on the
unmarked model, and torch.compile with the regions; then each one's ratio of the deepest to
the shallowest depth. The issue's target: at most 2x from 2 to 32 layers.
"""
import argparse
import contextlib
import gc
import statistics
import sys
import time
from pathlib import Path

_ROOT = Path(__file__).resolve().parent.parent
if str(_ROOT) not in sys.path:
    sys.path.insert(0, str(_ROOT))

import torch  # noqa: E402

import bytegraph  # noqa: E402
from bytegraph.demo.models import Block, GPTConfig, TinyGPT  # noqa: E402

bytegraph.config.persistent_cache = False


class RegionBlock(Block):
    forward = torch.compiler.nested_compile_region(Block.forward)


def make_model(layers, marked, train):
    torch.manual_seed(0)
    cfg = GPTConfig(n_layer=layers, n_embd=128, n_head=4, block_size=8, vocab_size=256, dropout=0.0)
    model = TinyGPT(cfg)
    if marked:
        for i, b in enumerate(model.h):
            rb = RegionBlock(cfg)
            rb.load_state_dict(b.state_dict())
            model.h[i] = rb
    model.train(train)
    return model, torch.randint(0, cfg.vocab_size, (1, 8))


def run(compiled, x, train):
    ctx = contextlib.nullcontext() if train else torch.no_grad()
    with ctx:
        out = compiled(x)
        if train:
            out.sum().backward()


CLOCK = [time.perf_counter]


def eager_ms(layers, train):
    model, x = make_model(layers, False, train)
    for _ in range(3):
        run(model, x, train)
    t0 = CLOCK[0]()
    for _ in range(10):
        run(model, x, train)
    return (CLOCK[0]() - t0) * 100


def capture_calls(variant, layers, train):
    """Python calls of one fresh capture (cProfile's count): a measure the machine's load does not move."""
    import cProfile
    import pstats
    model, x = make_model(layers, variant in ("regions", "torch"), train)
    bytegraph.reset()
    compiled = bytegraph.compile(model, backend="eager")
    gc.collect()
    prof = cProfile.Profile()
    with bytegraph.config.patch(nest_repeated_blocks=variant == "nested"):
        prof.enable()
        run(compiled, x, train)
        prof.disable()
    return sum(v[1] for v in pstats.Stats(prof).stats.values())


def capture_ms(variant, layers, train):
    model, x = make_model(layers, variant in ("regions", "torch"), train)
    gc.collect()
    if variant == "torch":
        import torch._dynamo   # the reference
        torch._dynamo.reset()
        compiled = torch.compile(model, backend="eager")
    else:
        bytegraph.reset()
        compiled = bytegraph.compile(model, backend="eager")
    with bytegraph.config.patch(nest_repeated_blocks=variant == "nested"):
        t0 = CLOCK[0]()
        run(compiled, x, train)
        return (CLOCK[0]() - t0) * 1e3


VARIANTS = {"regions": "bytegraph, marked", "flat": "bytegraph, unmarked", "nested": "bytegraph, nest_repeated_blocks",
            "torch": "torch.compile, marked"}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", default="2,8,32")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--grad", action="store_true")
    parser.add_argument("--only", default=",".join(VARIANTS))
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall")
    parser.add_argument("--stat", choices=("median", "min"), default="median")
    parser.add_argument("--calls", action="store_true",
                        help="instead of times: Python calls per added layer, (calls(deepest) - calls(shallowest)) / "
                             "(deepest - shallowest) layers, from cProfile's counts (bytegraph variants)")
    args = parser.parse_args(argv)
    CLOCK[0] = time.process_time if args.clock == "cpu" else time.perf_counter
    torch.set_num_threads(1)
    variants = args.only.split(",")
    layers = [int(n) for n in args.layers.split(",")]
    for v in variants:      # imports and first-compile caches: not counted
        capture_ms(v, 1, args.grad)
    if args.calls:
        lo, hi = layers[0], layers[-1]
        for v in variants:
            capture_calls(v, lo, args.grad)    # (lazily made caches of the first profiled capture)
            per = (capture_calls(v, hi, args.grad) - capture_calls(v, lo, args.grad)) / (hi - lo)
            print(f"{VARIANTS[v]}: {per:.0f} Python calls per layer ({lo} to {hi} layers)")
        return
    print(f"torch {torch.__version__}, python {sys.version.split()[0]}, {'training' if args.grad else 'no_grad'}; "
          f"capture ms of {args.clock} time, {args.stat} of {args.repeat} (first call less an eager call)")
    print(f"{'layers':>6} | " + " | ".join(f"{VARIANTS[v]:>30}" for v in variants))
    # The depths take turns, repeat after repeat: a machine slower for a while slows each alike.
    base = {n: eager_ms(n, args.grad) for n in layers}
    caps = {(v, n): [] for v in variants for n in layers}
    for _ in range(args.repeat):
        for n in layers:
            for v in variants:
                caps[(v, n)].append(capture_ms(v, n, args.grad) - base[n])
    table = {key: min(c) if args.stat == "min" else statistics.median(c) for key, c in caps.items()}
    for n in layers:
        print(f"{n:>6} | " + " | ".join(f"{table[(v, n)]:>30.1f}" for v in variants), flush=True)
    lo, hi = layers[0], layers[-1]
    print(f"{f'{hi}/{lo}':>6} | " + " | ".join(f"{table[(v, hi)] / table[(v, lo)]:>29.2f}x" for v in variants))


if __name__ == "__main__":
    main()

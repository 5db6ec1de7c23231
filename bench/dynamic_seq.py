"""Compile counts and total compile time over changing sequence lengths, bytegraph vs torch.compile.

The nanoGPT-style model from bytegraph.demo is called with sequence lengths
16, 32, 48, 64, 80 (backend="eager", dynamic=None: automatic dynamic shapes).
    python bench/dynamic_seq.py [--backend eager|aot_eager|inductor]
"""
import argparse
import sys
import time

import torch
import torch._dynamo  # the reference

sys.path.insert(0, ".")
import bytegraph  # noqa: E402
from bytegraph.demo.models import GPTConfig, TinyGPT  # noqa: E402
from bytegraph.testing import CompileCounter  # noqa: E402

bytegraph.config.persistent_cache = False   # measure compiles, not loads from an earlier run's cache

LENGTHS = (16, 32, 48, 64, 80)


def measure(compile_fn, counter, model, lengths):
    compiled = compile_fn(model)
    total = 0.0
    rows = []
    with torch.no_grad():
        for T in lengths:
            x = torch.randint(0, 128, (2, T))
            before = counter.frame_count
            t0 = time.perf_counter()
            out = compiled(x)
            dt = time.perf_counter() - t0
            ok = torch.allclose(out, model(x), rtol=1e-4, atol=1e-5)
            if counter.frame_count > before:
                total += dt
            rows.append((T, counter.frame_count - before, dt, ok))
    return rows, total


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", default="eager")
    args = ap.parse_args()
    from bytegraph.backends.registry import lookup_backend
    torch.manual_seed(0)
    model = TinyGPT(GPTConfig(block_size=128)).eval()
    # warm up both front ends once so first-import costs are not counted
    bytegraph.compile(lambda x: x + 1, backend="eager")(torch.randn(2))
    torch.compile(lambda x: x + 1, backend="eager")(torch.randn(2))

    bytegraph.reset()
    bg_cnt = CompileCounter(lookup_backend(args.backend))
    bg_rows, bg_total = measure(lambda m: bytegraph.compile(m, backend=bg_cnt), bg_cnt, model, LENGTHS)

    from torch._dynamo.testing import CompileCounterWithBackend
    torch._dynamo.reset()
    tc_cnt = CompileCounterWithBackend(args.backend)
    tc_rows, tc_total = measure(lambda m: torch.compile(m, backend=tc_cnt), tc_cnt, model, LENGTHS)

    print(f"nanoGPT-style model, backend={args.backend}, dynamic=None, torch {torch.__version__}")
    print(f"{'seq len':>7} | {'bytegraph compiles':>18} {'call ms':>8} | {'torch.compile compiles':>22} {'call ms':>8}")
    for (T, bc, bt, bok), (_, tc, tt, tok) in zip(bg_rows, tc_rows):
        flag = "" if bok and tok else "  (MISMATCH)"
        print(f"{T:>7} | {bc:>18} {bt * 1000:>8.1f} | {tc:>22} {tt * 1000:>8.1f}{flag}")
    print(f"{'total':>7} | {bg_cnt.frame_count:>18} {bg_total * 1000:>8.1f} | {tc_cnt.frame_count:>22} "
          f"{tc_total * 1000:>8.1f}   (compile ms = calls that compiled)")


if __name__ == "__main__":
    main()

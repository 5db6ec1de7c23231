import cProfile, pstats, sys, os, time, io, argparse
sys.path.insert(0, os.getcwd())
import torch
from bench import train_step as ts
comp = sys.argv[1]
args = ts.main.__globals__  # noqa
p = argparse.Namespace(device="cuda", backend="inductor", tiny=False, checkpoint=False, rows=None, layers=12, d=768, heads=12,
                       batch=8, tokens=1024, iters=30, warmup=5, timeout=1800, json=None, warm_caches=False, only_row=None, only_compiler=None)
ts.cold_caches()
s = ts.sizes(p)
row = [r for r in ts.ROWS if r.startswith("inference")][0] if hasattr(ts, "ROWS") else "inference"
fn, inputs, counter, model = ts.build(row, comp, p, s, "cuda")
torch.cuda.synchronize()
pr = cProfile.Profile()
t0 = time.perf_counter()
pr.enable(); out = fn(*inputs); torch.cuda.synchronize(); pr.disable()
first = time.perf_counter() - t0
t1 = time.perf_counter(); fn(*inputs); torch.cuda.synchronize(); second = time.perf_counter() - t1
t1 = time.perf_counter(); fn(*inputs); torch.cuda.synchronize(); third = time.perf_counter() - t1
with open(os.path.join(os.environ["OUT"], f"prof_{comp.replace('.', '_')}.txt"), "w") as f:
    f.write(f"{comp} row={row} first {first:.2f}s second {second*1e3:.1f}ms third {third*1e3:.1f}ms\n")
    st = pstats.Stats(pr, stream=f); st.sort_stats("cumulative").print_stats(150)
    st.sort_stats("tottime").print_stats(40)
print(comp, "first", round(first, 2), "second ms", round(second * 1e3, 1), "third", round(third*1e3,1))

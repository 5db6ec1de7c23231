import sys, os, time, argparse
sys.path.insert(0, os.getcwd())
import torch
from bench import train_step as ts
import bytegraph
comp = sys.argv[1]
p = argparse.Namespace(device="cuda", backend="inductor", tiny=False, checkpoint=False, rows=None, layers=12, d=768, heads=12,
                       batch=8, tokens=1024, iters=30, warmup=5, timeout=1800, json=None, warm_caches=False, only_row=None, only_compiler=None)
ts.cold_caches()
s = ts.sizes(p)
row = "inference batch 1, reduce-overhead"
fn, inputs, counter, model = ts.build(row, comp, p, s, "cuda")
torch.cuda.synchronize()
t0 = time.perf_counter(); out = fn(*inputs); torch.cuda.synchronize(); first = time.perf_counter() - t0
print(comp, "first", round(first, 2))
if comp == "bytegraph":
    print("bytegraph phases", bytegraph.compile_times())
from torch._dynamo.utils import compile_times
print(compile_times(repr="str", aggregate=True))

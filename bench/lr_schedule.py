"""Compiles that an LR scheduler costs: bytegraph vs torch.compile, ``opt.step`` compiled,
100 steps with ExponentialLR changing lr every step (CPU is enough: it counts graphs).

    python bench/lr_schedule.py [--steps 100] [--backend aot_eager]

Each row runs in a fresh process. ``graphs`` is how many graphs the backend received over
all the steps (torch.compile: dynamo's ``unique_graphs``); ``max|param diff|`` compares the
parameters after the last step with eager's.
"""
import argparse
import json
import os
import subprocess
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import bytegraph  # noqa: E402

bytegraph.config.persistent_cache = False   # measure compiles, not loads from an earlier run's cache

OPTIMIZERS = {
    "SGD momentum": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9),
    "SGD momentum foreach": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, foreach=True),
    "Adam": lambda p: torch.optim.Adam(p, lr=0.01),
    "AdamW foreach": lambda p: torch.optim.AdamW(p, lr=0.01, foreach=True),
    "AdamW fused": lambda p: torch.optim.AdamW(p, lr=0.01, fused=True),
    "RMSprop": lambda p: torch.optim.RMSprop(p, lr=0.01),
    "Adagrad": lambda p: torch.optim.Adagrad(p, lr=0.1),
}


def run(name, compiler, steps, backend):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))
    ref = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))
    ref.load_state_dict(model.state_dict())
    opt, ref_opt = OPTIMIZERS[name](model.parameters()), OPTIMIZERS[name](ref.parameters())
    scheds = [torch.optim.lr_scheduler.ExponentialLR(o, 0.97) for o in (opt, ref_opt)]
    graphs = [0]
    if compiler == "bytegraph":
        inner = bytegraph.backends.registry.lookup_backend(backend)

        def counting(gm, example_inputs):
            graphs[0] += 1
            return inner(gm, example_inputs)
        step = bytegraph.compile(opt.step, backend=counting)
    else:
        step = torch.compile(opt.step, backend=backend)
    x = torch.randn(8, 16)
    for _ in range(steps):
        for m, o, s, sched in ((model, opt, step, scheds[0]), (ref, ref_opt, ref_opt.step, scheds[1])):
            m(x).pow(2).mean().backward()
            s()
            o.zero_grad()
            sched.step()
    if compiler != "bytegraph":
        from torch._dynamo.utils import counters
        graphs[0] = counters["stats"]["unique_graphs"]
    diff = max((a - b).abs().max().item() for a, b in zip(model.parameters(), ref.parameters()))
    return {"optimizer": name, "compiler": compiler, "graphs": graphs[0], "diff": diff}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--backend", default="aot_eager")
    p.add_argument("--only", nargs=2, default=None)
    args = p.parse_args()
    if args.only:
        print(json.dumps(run(args.only[0], args.only[1], args.steps, args.backend)))
        return
    print(f"{args.steps} steps, ExponentialLR, opt.step compiled with backend {args.backend}, torch {torch.__version__}")
    print(f"{'optimizer':22s} {'compiler':14s} {'graphs':>6s} {'max|param diff|':>16s}")
    for name in OPTIMIZERS:
        for compiler in ("torch.compile", "bytegraph"):
            proc = subprocess.run([sys.executable, __file__, "--steps", str(args.steps), "--backend", args.backend,
                                   "--only", name, compiler], capture_output=True, text=True)
            line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("{")), None)
            if line is None:
                print(f"{name:22s} {compiler:14s} ERROR {proc.stderr.strip().splitlines()[-1:]}")
                continue
            r = json.loads(line)
            print(f"{name:22s} {compiler:14s} {r['graphs']:6d} {r['diff']:16.2e}")


if __name__ == "__main__":
    main()

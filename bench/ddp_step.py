"""DDP training step: eager DDP vs torch.compile(DDP) vs bytegraph.compile(DDP), on 2 processes.

    python bench/ddp_step.py                           # 2 GPUs, NCCL, GPT-2-small-like model
    python bench/ddp_step.py --device cpu --tiny       # 2 CPU processes, gloo, tiny model
    torchrun --nproc_per_node 2 bench/ddp_step.py      # the same, started by torchrun
    python bench/ddp_step.py --wrap fsdp2              # FSDP2 instead of DDP (fully_shard per block, then the root)

``--wrap fsdp2`` shards the model with FSDP2 (``fully_shard`` on every block, then on the root)
instead of wrapping it in DDP, and compiles that model; its all-gathers and reduce-scatters are
FSDP2's own, so the bucket columns stay empty; ``peak MiB`` is the largest memory a rank
allocated during the timed steps (CUDA; NaN on the CPU).

Without torchrun the script starts its own processes (a free port on 127.0.0.1). Each variant
trains a fresh copy of the same model on the same data (AdamW, bf16 autocast on CUDA) and
reports, on rank 0:

- step ms: median of ``--steps`` timed steps (forward, backward, optimizer step) after
  ``--warmup`` steps, measured with CUDA events (``time.perf_counter`` on CPU);
- first step s: wall time of the first step (compilation included);
- graphs: graphs the backend compiled (with the DDP split, the pieces of the forward);
- buckets / early: all-reduces DDP started per step, and how many of them started before the
  backward's computation ended: each bucket's launch is marked on the compute stream when DDP
  calls its comm hook, and the end of every autograd node that computes (all but AccumulateGrad)
  by a node hook; a bucket is early when its launch comes before the last of those. ``overlap
  ms`` is the largest lead of a launch over that end (compute the all-reduce could hide behind);
- loss diff: largest difference of the first steps' losses from eager DDP's.

All variants go through the same comm hook (DDP's default all-reduce, in Python, so the launch
can be recorded); that costs a few µs per bucket in every variant alike.
"""
import argparse
import copy
import json
import os
import socket
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import bytegraph  # noqa: E402
from bytegraph.backends.registry import lookup_backend  # noqa: E402
from bytegraph.demo.models import GPTConfig, TinyGPT  # noqa: E402
from bytegraph.testing import CompileCounter  # noqa: E402

VARIANTS = ("eager", "torch.compile", "bytegraph")
# Also accepted by --variants: the compilers with their DDP graph split turned off (one graph).
EXTRA_VARIANTS = ("torch.compile-one-graph", "bytegraph-one-graph")


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--tiny", action="store_true", help="a 4-layer, 128-wide model (quick check, CPU)")
    p.add_argument("--world", type=int, default=2, help="processes to start (ignored under torchrun)")
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--d", type=int, default=768)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--vocab", type=int, default=50304)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--batch", type=int, default=8, help="sequences per process")
    p.add_argument("--wrap", choices=("ddp", "fsdp2"), default="ddp", help="DDP (default) or FSDP2's fully_shard")
    p.add_argument("--bucket-cap-mb", type=float, default=None, help="DDP bucket_cap_mb (default: DDP's 25)")
    p.add_argument("--backend", default="inductor", help="compile backend for both compilers")
    p.add_argument("--variants", default=",".join(VARIANTS),
                   help=f"comma-separated, from {', '.join(VARIANTS + EXTRA_VARIANTS)}")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--steps", type=int, default=None, help="timed steps (default 20; 8 with --tiny)")
    p.add_argument("--no-autocast", action="store_true", help="fp32 on CUDA (default: bf16 autocast)")
    p.add_argument("--json", default=None, help="write the results here (rank 0)")
    args = p.parse_args(argv)
    unknown = set(args.variants.split(",")) - set(VARIANTS + EXTRA_VARIANTS)
    if unknown:
        p.error(f"unknown variants {sorted(unknown)}")
    if args.tiny:
        args.layers, args.d, args.heads, args.vocab, args.seq, args.batch = 4, 128, 4, 512, 32, 4
        if args.bucket_cap_mb is None:
            # torch.compile's DDPOptimizer insists on caps of at least its 1 MiB first bucket.
            args.bucket_cap_mb = 1
    if args.steps is None:
        args.steps = 8 if args.tiny else 20
    return args


def make_model(args):
    torch.manual_seed(0)
    cfg = GPTConfig(block_size=args.seq, vocab_size=args.vocab, n_layer=args.layers, n_head=args.heads,
                    n_embd=args.d, dropout=0.0, flash=True)
    return TinyGPT(cfg)


def batches(args, rank, n, device):
    g = torch.Generator().manual_seed(1234 + rank)
    out = []
    for _ in range(n):
        idx = torch.randint(0, args.vocab, (args.batch, args.seq + 1), generator=g)
        out.append((idx[:, :-1].to(device), idx[:, 1:].to(device)))
    return out


class Clock:
    """CUDA events on the current stream, or perf_counter on CPU; elapsed in ms."""

    def __init__(self, device):
        self.cuda = device.type == "cuda"

    def mark(self):
        if self.cuda:
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            return e
        return time.perf_counter()

    def ms(self, a, b):
        return a.elapsed_time(b) if self.cuda else (b - a) * 1000.0

    def sync(self):
        if self.cuda:
            torch.cuda.synchronize()


class BucketRecorder:
    """DDP comm hook (default all-reduce) that marks where each bucket's all-reduce was launched."""

    def __init__(self, clock):
        self.clock = clock
        self.recording = False
        self.launches = []

    def hook(self):
        def record_and_allreduce(state, bucket):   # DDP checks a comm hook's __name__
            if self.recording:
                self.launches.append(self.clock.mark())
            return default_hooks.allreduce_hook(None, bucket)
        return record_and_allreduce


def mark_compute_nodes(loss, clock, marks):
    """Mark, on the compute stream, the end of every node of ``loss``'s backward that computes
    (all but AccumulateGrad): the last mark is where the backward's computation ends."""
    seen, stack = set(), [loss.grad_fn]
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        if type(node).__name__ != "AccumulateGrad":
            node.register_hook(lambda grad_inputs, grad_outputs: marks.append(clock.mark()))
        stack.extend(f for f, _ in node.next_functions)


def compile_variant(name, ddp, args, counter_box):
    if name == "eager":
        return ddp
    if name.startswith("torch.compile"):
        if args.backend == "inductor":
            # Heavy: only the torch.compile variant needs it.
            from torch._inductor.compile_fx import compile_fx as inner
        else:
            inner = args.backend
        counter = CompileCounterTorch(inner)
        counter_box.append(counter)
        return torch.compile(ddp, backend=counter)
    counter = CompileCounter(lookup_backend(args.backend))
    counter_box.append(counter)
    return bytegraph.compile(ddp, backend=counter)


class CompileCounterTorch:
    """A torch.compile backend counting the graphs it gets (with DDPOptimizer: the pieces)."""

    def __init__(self, inner):
        self.inner = inner
        self.frame_count = 0

    def __call__(self, gm, example_inputs):
        self.frame_count += 1
        if isinstance(self.inner, str):
            # Heavy: only for a named torch backend.
            from torch._dynamo.backends.registry import lookup_backend as torch_backend
            return torch_backend(self.inner)(gm, example_inputs)
        return self.inner(gm, example_inputs)


def run_variant(name, args, rank, device, clock, data):
    model = make_model(args).to(device)
    recorder = BucketRecorder(clock)
    if args.wrap == "fsdp2":
        from torch.distributed.fsdp import fully_shard   # heavy; only this wrap needs it
        for block in model.h:
            fully_shard(block)
        ddp = fully_shard(model)
    else:
        ddp_kwargs = {"device_ids": [device.index]} if device.type == "cuda" else {}
        if args.bucket_cap_mb is not None:
            ddp_kwargs["bucket_cap_mb"] = args.bucket_cap_mb
        ddp = DDP(model, **ddp_kwargs)
        ddp.register_comm_hook(None, recorder.hook())
    counters = []
    step_fn = compile_variant(name, ddp, args, counters)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    autocast = device.type == "cuda" and not args.no_autocast

    def step(i, timed, on_loss=None):
        idx, target = data[i % len(data)]
        start = clock.mark() if timed else None
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
            logits = step_fn(idx)
            loss = F.cross_entropy(logits.flatten(0, 1).float(), target.flatten())
        if on_loss is not None:
            on_loss(loss)
        backward_start = clock.mark()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        end = clock.mark() if timed else None
        return loss.detach(), start, end, backward_start

    t0 = time.perf_counter()
    losses = [step(0, False)[0]]
    clock.sync()
    first_s = time.perf_counter() - t0
    for i in range(1, args.warmup):
        losses.append(step(i, False)[0])
    graphs_after_warmup = counters[0].frame_count if counters else 0
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    timings = []
    for i in range(args.steps):
        _, start, end, _ = step(args.warmup + i, True)
        timings.append((start, end))
    clock.sync()
    step_ms = statistics.median(clock.ms(a, b) for a, b in timings)
    graphs_after_timing = counters[0].frame_count if counters else 0
    peak_mib = torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else float("nan")

    # Overlap: two more steps with the end of every backward compute node and the launch of every
    # bucket marked.
    per_step = []
    for i in range(2):
        compute_marks = []
        recorder.launches.clear()
        recorder.recording = True
        _, _, _, backward_start = step(args.warmup + args.steps + i, False,
                                       on_loss=lambda loss: mark_compute_nodes(loss, clock, compute_marks))
        recorder.recording = False
        clock.sync()
        end = compute_marks[-1]
        leads = [clock.ms(launch, end) for launch in recorder.launches]
        per_step.append((len(leads), sum(1 for x in leads if x > 0), max(leads + [0.0]),
                         clock.ms(backward_start, end)))
    buckets, early, lead, backward_ms = per_step[-1]
    result = {"variant": name, "step_ms": step_ms, "first_step_s": first_s,
              "graphs": graphs_after_warmup, "recompiled_while_timed": graphs_after_timing != graphs_after_warmup,
              "buckets": buckets, "early": early, "overlap_ms": lead, "backward_ms": backward_ms,
              "peak_mib": peak_mib, "losses": [float(x) for x in losses]}
    if name.startswith("bytegraph"):
        splits = [s for r in bytegraph.debug.records.frames for s in r.ddp_splits]
        result["pieces"] = [s.piece_count for s in splits]
    del step_fn, ddp, model, opt
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return result


def worker(rank, world, args, port=None):
    if port is not None:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    if args.device == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)) % torch.cuda.device_count())
        device = torch.device("cuda", torch.cuda.current_device())
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    else:
        device = torch.device("cpu")
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", rank=rank, world_size=world,
                            device_id=device if device.type == "cuda" else None)
    clock = Clock(device)
    data = batches(args, rank, 8, device)
    results = []
    try:
        for name in args.variants.split(","):
            bytegraph.reset()
            torch._dynamo.reset()
            dist.barrier()
            one_graph = name.endswith("-one-graph")
            with bytegraph.config.patch(optimize_ddp=not one_graph), \
                    torch._dynamo.config.patch(optimize_ddp=not one_graph):
                results.append(run_variant(name, args, rank, device, clock, data))
    finally:
        gathered = [None] * world
        dist.all_gather_object(gathered, results)
        dist.destroy_process_group()
    if rank == 0:
        report(args, gathered, device)


def report(args, gathered, device):
    rows = gathered[0]
    eager = next((r for r in rows if r["variant"] == "eager"), None)
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    print(f"# {'FSDP2' if args.wrap == 'fsdp2' else 'DDP'} step, {len(gathered)} x {where}, {args.layers} layers d={args.d} seq={args.seq} "
          f"batch={args.batch}/process, backend={args.backend}, bucket_cap_mb={args.bucket_cap_mb or 25}, "
          f"torch {torch.__version__}")
    print(f"{'variant':24} {'step ms':>9} {'first s':>8} {'graphs':>6} {'buckets':>7} {'early':>5} "
          f"{'overlap ms':>10} {'loss diff':>9} {'peak MiB':>9}")
    for r in rows:
        # Slowest rank's step time: the step is as slow as its slowest process.
        step_ms = max(g[rows.index(r)]["step_ms"] for g in gathered)
        diff = max(abs(a - b) for a, b in zip(r["losses"], eager["losses"])) if eager else float("nan")
        flag = " (recompiled while timed)" if r["recompiled_while_timed"] else ""
        print(f"{r['variant']:24} {step_ms:9.2f} {r['first_step_s']:8.1f} {r['graphs']:6d} {r['buckets']:7d} "
              f"{r['early']:5d} {r['overlap_ms']:10.2f} {diff:9.2e} {r['peak_mib']:9.0f}{flag}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "ranks": gathered}, f, indent=1)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv=None):
    args = parse(argv)
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:   # torchrun
        worker(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), args)
        return
    if args.device == "cuda" and torch.cuda.device_count() < args.world:
        sys.exit(f"needs {args.world} GPUs, found {torch.cuda.device_count()} (use --device cpu --tiny on CPU)")
    mp.spawn(worker, args=(args.world, args, free_port()), nprocs=args.world)


if __name__ == "__main__":
    main()

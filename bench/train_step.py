"""The training step, whole: eager vs torch.compile vs bytegraph, side by side.

    python bench/train_step.py                                  # GPU: GPT-2 small, batch 8 x 1024, bf16 autocast
    python bench/train_step.py --device cpu --tiny --backend aot_eager   # a quick check that it all runs

Rows (each variant runs in a fresh process: compile caches, CUDA graph pools and torch.compile's
patching of torch.optim are per process):

- ``whole step, AdamW foreach`` / ``whole step, AdamW fused``: one compiled function doing
  forward, cross-entropy loss, ``loss.backward()``, ``opt.step()``, ``opt.zero_grad()``.
- ``model compiled, AdamW foreach``: only the model is compiled; the rest runs eagerly.
- ``whole step + LR scheduler``: the whole step with OneCycleLR moving lr (and betas) every
  step; the ``graphs`` column says how many graphs each compiler made over all the steps.
- ``inference batch 1, reduce-overhead``: ``mode="reduce-overhead"`` (CUDA graphs) on a
  batch of 1 x 128 tokens, under no_grad.
- ``whole step, float8 linears (torchao)`` (``--float8``): the whole step with the blocks' Linear
  layers converted by torchao's ``convert_to_float8_training`` (float8 matmuls through its tensor
  subclass; needs an H100/H200 and torchao installed).
- ``activation checkpointing`` (``--checkpoint``): the whole step with every block under
  ``torch.utils.checkpoint.checkpoint(..., use_reentrant=False)`` next to the same without;
  the ``memory`` column is the peak memory of a step above the model's (CUDA), or on the CPU
  the bytes the autograd graph keeps for backward (saved tensors).

Columns: ``first call`` is the wall time of the first step (compiling included, and the
``compile(...)`` call before it, where torch.compile imports its compiler stack), ``median`` the
steady-state median per step (CUDA events on the GPU, wall clock on the CPU), ``pipelined`` the
wall time per step of steps run back to back without a sync between them (as a training loop
runs them: the GPU's time where the CPU keeps ahead, the CPU's where it does not), ``loss`` the
loss after the timed steps (the same seed everywhere: eager's and the compilers' should agree to
a few digits), ``graphs`` the graphs compiled. Each process starts with empty compile caches
(Inductor's, AOTAutograd's, Triton's, bytegraph's), so ``first call`` is a cold compile for both
compilers; ``--warm-caches`` keeps the ordinary on-disk caches instead. ``--warm-start`` runs each
row twice over one fresh set of caches, cold then warm, and reports both first calls.

The host side (CUDA): ``host`` is the CPU time to issue one step, measured while the GPU is still
busy (a ``torch.cuda._sleep`` queued ahead of it), so the time is the Python and launch work of
the step, not the GPU's; ``--host-profile`` adds the functions where that time goes (cProfile of
issued steps, top entries by own time) to the JSON. ``--slow-host`` runs every process pinned with
``taskset`` to one core that a busy process shares: the CPU-bound case of a slow or busy host, on
any machine. ``--processes N`` runs each row N times (fresh processes) and reports medians with
the spread (min-max), so a 10% difference can be told from noise. ``--compilers`` picks the
columns; ``bytegraph-whole`` is bytegraph with regional compilation off
(``BYTEGRAPH_REGIONAL_COMPILE=0``).

``--interleave``: per row, one process builds every compiler's step and times them in
alternating rounds (``bench/interleave.py``): the steady-state comparison a host that runs fast
in one process and slow in the next cannot tilt. Its first calls are not cold (the second
compiler finds the first one's imports and kernels) and are not reported; ``--rounds`` and
``--iters`` set its length, ``--slow-host-too`` adds the same rounds pinned to a busy core. After
the rounds, the same process measures each compiler's ``host`` time, and with ``--host-profile`` /
``--kernel-profile`` its host profile and its kernels: issue cost and GPU work side by side.
Every process also reports ``host_speed_us`` (a fixed pure-Python loop, lower is faster) and
the CUDA allocator's device allocations per step, which tell a slow host or a thrashing
allocator from a slow compiler.
"""
import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from reduce_overhead import GPT  # noqa: E402
import interleave  # noqa: E402
from stack_sampler import StackSampler  # noqa: E402


class CheckpointedGPT(GPT):
    """The same model with each block's activations recomputed in backward."""

    def forward(self, idx):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for blk in self.blocks:
            x = checkpoint(blk, x, use_reentrant=False)
        return self.head(self.ln(x))


ROWS = ["whole step, AdamW foreach", "whole step, AdamW fused", "model compiled, AdamW foreach",
        "whole step + LR scheduler", "inference batch 1, reduce-overhead"]
CHECKPOINT_ROWS = ["whole step, no checkpointing", "whole step, checkpointed blocks"]
FLOAT8_ROWS = ["whole step, float8 linears (torchao), AdamW foreach"]
COMPILERS = ["eager", "torch.compile", "bytegraph"]
VARIANT_ENV = {"bytegraph-whole": ("bytegraph", {"BYTEGRAPH_REGIONAL_COMPILE": "0"})}


def sizes(args):
    if args.tiny:
        return dict(layers=2, d=64, heads=4, vocab=512, batch=2, tokens=32, infer_tokens=16)
    return dict(layers=args.layers, d=args.d, heads=args.heads, vocab=50257, batch=args.batch,
                tokens=args.tokens, infer_tokens=128)


def counting(backend, mode, counter):
    """A backend for bytegraph that counts the graphs it gets, then hands them to ``backend``."""
    inner = _bytegraph().backends.registry.lookup_backend(backend, mode=mode)

    def compile_graph(gm, example_inputs):
        counter[0] += 1
        return inner(gm, example_inputs)
    return compile_graph


COMPILE_CALL_S = [0.0]


def _bytegraph():
    """bytegraph, imported where it is first used, inside ``timed_compile``: its import counts in
    its first call as torch.compile's imports count in torch.compile's."""
    import bytegraph
    return bytegraph


def timed_compile(make):
    """``make()`` (a ``torch.compile(...)`` or ``bytegraph.compile(...)`` call), its time added to
    the first call's: torch.compile imports TorchDynamo, AOTAutograd and Inductor there, while
    bytegraph imports itself there (``_bytegraph``) and AOTAutograd and Inductor when its first
    graph reaches them; the user waits for both."""
    t0 = time.perf_counter()
    out = make()
    COMPILE_CALL_S[0] += time.perf_counter() - t0
    return out


def torch_graphs():
    try:
        from torch._dynamo.utils import counters
        return counters["stats"]["unique_graphs"]
    except Exception:
        return None


def build(row, compiler, args, s, device):
    """(callable doing one step, its inputs, a function reading the graph count, model)."""
    torch.manual_seed(0)
    ckpt = row == CHECKPOINT_ROWS[1]
    cls = CheckpointedGPT if ckpt else GPT
    model = cls(s["layers"], s["d"], heads=s["heads"], vocab=s["vocab"], ctx=max(s["tokens"], 128)).to(device)
    if "float8" in row:
        float8_linears(model)
    counter = [0]
    mode = None
    backend = args.backend
    if row.startswith("inference"):
        model.eval()
        mode = "reduce-overhead" if device == "cuda" and backend == "inductor" else None
        x = torch.randint(0, s["vocab"], (1, s["infer_tokens"]), device=device)

        def infer(idx):
            with torch.no_grad():
                return model(idx)
        fn = {"eager": infer,
              "torch.compile": timed_compile(lambda: torch.compile(model, backend=backend, mode=mode))
              if compiler == "torch.compile" else None,
              "bytegraph": timed_compile(lambda: _bytegraph().compile(model, backend=counting(backend, mode, counter)))
              if compiler == "bytegraph" else None}[compiler]
        if compiler != "eager":
            compiled = fn
            fn = lambda idx: infer_with(compiled, idx)   # noqa: E731
        return fn, (x,), counter, model
    fused = "fused" in row
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1,
                            **({"fused": True} if fused else {"foreach": True}))
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=1e-3, total_steps=10_000) if "scheduler" in row else None
    amp = device == "cuda"
    forward = model
    if row.startswith("model compiled") and compiler != "eager":
        forward = timed_compile(lambda: torch.compile(model, backend=backend) if compiler == "torch.compile" else
                                _bytegraph().compile(model, backend=counting(backend, None, counter)))

    def step(idx, targets):
        with torch.autocast(device, dtype=torch.bfloat16, enabled=amp):
            logits = forward(idx)
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)).float(), targets.view(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    fn = step
    if not row.startswith("model compiled") and compiler != "eager":
        fn = timed_compile(lambda: torch.compile(step, backend=backend) if compiler == "torch.compile" else
                           _bytegraph().compile(step, backend=counting(backend, None, counter)))
    if sched is not None:
        inner = fn

        def fn(idx, targets):
            loss = inner(idx, targets)
            sched.step()
            return loss
    x = torch.randint(0, s["vocab"], (s["batch"], s["tokens"]), device=device)
    y = torch.randint(0, s["vocab"], (s["batch"], s["tokens"]), device=device)
    return fn, (x, y), counter, model


def float8_linears(model):
    """torchao's float8 training: every block's Linear becomes a Float8Linear (its matmuls in
    float8 with dynamic scaling, weights and activations cast by torchao's tensor subclass inside
    the step). The output head stays in bf16: its width (the vocabulary) is not a multiple of 16."""
    from torchao.float8 import convert_to_float8_training
    convert_to_float8_training(model, module_filter_fn=lambda mod, fqn: fqn.startswith("blocks."))


def cold_caches():
    """Fresh, empty compile caches for this process: Inductor's FX graph and AOTAutograd caches,
    Triton's kernels, bytegraph's saved frames. Otherwise a row measured after another one (or
    after the other compiler, whose kernels are often the same) finds what that one compiled,
    and its first call is not a cold compile."""
    import tempfile
    root = tempfile.mkdtemp(prefix="train_step_caches_")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(root, "inductor")
    os.environ["TRITON_CACHE_DIR"] = os.path.join(root, "triton")
    os.environ["BYTEGRAPH_CACHE_DIR"] = os.path.join(root, "bytegraph")


def infer_with(compiled, idx):
    with torch.no_grad():
        return compiled(idx)


def progress(message):
    """A line for whoever watches a long run: the parent passes these on as they come, so a run
    cut short (a device's time limit) still shows how far each process got."""
    print(f"progress: {message}", file=sys.stderr, flush=True)


def sync(device):
    if device == "cuda":
        torch.cuda.synchronize()


def measure(row, compiler, args):
    device = args.device
    s = sizes(args)
    fn, inputs, counter, model = build(row, compiler, args, s, device)
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    sync(device)
    profiler = None
    if args.first_call_profile:
        import cProfile
        profiler = cProfile.Profile()
        profiler.enable()
    sampler = StackSampler() if args.first_call_sample else contextlib.nullcontext()
    t0 = time.perf_counter()
    with sampler:
        out = fn(*inputs)
        sync(device)
    first = time.perf_counter() - t0 + COMPILE_CALL_S[0]
    if profiler is not None:
        profiler.disable()
    progress(f"{compiler}: first call {first:.1f} s")
    for _ in range(args.warmup):
        out = fn(*inputs)
    settled = settle(compiler, fn, inputs, args)
    if settled is not None:      # seconds from the first call's start until the steady state
        settled = time.perf_counter() - t0 + COMPILE_CALL_S[0]
        progress(f"{compiler}: steady after {settled:.1f} s")
    times = []
    for _ in range(args.iters):
        if device == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            out = fn(*inputs)
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t = time.perf_counter()
            out = fn(*inputs)
            times.append((time.perf_counter() - t) * 1e3)
    # Steps back to back, no sync between them (as a training loop runs): wall time per step.
    # Where the CPU is ahead, this is the GPU's time; where it is behind, the CPU's.
    sync(device)
    t0 = time.perf_counter()
    for _ in range(args.iters):
        out = fn(*inputs)
    sync(device)
    pipelined = (time.perf_counter() - t0) / args.iters * 1e3
    result = {"row": row, "compiler": compiler, "first_ms": first * 1e3, "median_ms": statistics.median(times),
              "pipelined_ms": pipelined, "host_speed_us": interleave.host_speed_us()}
    if profiler is not None:
        result["first_call_profile"] = top_functions(profiler, args.first_call_profile)
    if args.first_call_sample:
        result["first_call_sample"] = sampler.top(args.first_call_sample)
    if settled is not None:
        result["steady_after_s"] = settled
        from bytegraph.backends import tiers
        result["second_tiers"] = list(tiers.outcomes)
        result["cache_counters"] = cache_counters()
    if device == "cuda":
        result["device_allocs_per_step"] = device_allocs_per_step(fn, inputs)
    if device == "cuda":
        result["host_ms"], profile = host_time(fn, inputs, args)
        if profile:
            result["host_profile"] = profile
        if args.kernel_profile:
            result.update(kernel_profile(fn, inputs, args.kernel_profile))
    if args.slow_host_too:
        result.update(slow_host_figures(fn, inputs, args))
    value = out if out.dim() == 0 else out.float().abs().mean()
    result["loss"] = float(value)
    result["graphs"] = counter[0] if compiler == "bytegraph" else torch_graphs() if compiler == "torch.compile" else None
    if row in CHECKPOINT_ROWS:
        if device == "cuda":
            torch.cuda.reset_peak_memory_stats()
            fn(*inputs)
            torch.cuda.synchronize()
            result["memory_mb"] = (torch.cuda.max_memory_allocated() - base) / 2 ** 20
        else:
            result["memory_mb"] = saved_bytes(fn, inputs) / 2 ** 20
    return result


def cache_counters():
    """This process's AOTAutograd and Inductor cache hits and misses so far (torch's counters)."""
    from torch._dynamo.utils import counters
    return {k: v for k, v in {**counters["aot_autograd"], **counters["inductor"]}.items() if "cache" in k}


def settle(compiler, fn, inputs, args):
    """For bytegraph: wait until every graph's whole compile is in (``wait_for_background_compiles``:
    a training graph first called with shared blocks switches to the graph compiled whole by a
    child process), then warm up again, so that the steps timed are the steady state's. The
    seconds waited, or None for a compiler that compiles once (it takes the same warm-up steps)."""
    if not compiler.startswith("bytegraph"):
        # As many steps as bytegraph's warm-up after the switch: every column's ``loss`` comes
        # after the same number of steps (each trains the model on the same batch).
        for _ in range(max(1, args.warmup)):
            fn(*inputs)
        sync(args.device)
        return None
    t0 = time.perf_counter()
    _bytegraph().wait_for_background_compiles(args.timeout)
    for _ in range(max(1, args.warmup)):
        fn(*inputs)
    sync(args.device)
    return time.perf_counter() - t0


def device_allocs_per_step(fn, inputs, steps=5):
    """cudaMalloc calls the caching allocator made per step over ``steps`` warm steps: above zero,
    the allocator frees and re-allocates every step (a synchronizing, host-bound pattern)."""
    torch.cuda.synchronize()
    before = torch.cuda.memory_stats().get("num_device_alloc", 0)
    for _ in range(steps):
        fn(*inputs)
    torch.cuda.synchronize()
    return (torch.cuda.memory_stats().get("num_device_alloc", 0) - before) / steps


def measure_interleaved(row, compilers, args):
    """Every compiler's step for ``row`` built in this process, warmed up, then timed in
    alternating rounds (``interleave.alternate``), normal and (``--slow-host-too``) pinned to a
    busy core. The reference for the ratios is torch.compile when it is among them."""
    device = args.device
    s = sizes(args)
    steps, losses, graphs = {}, {}, {}
    for compiler in compilers:
        real, env = VARIANT_ENV.get(compiler, (compiler, {}))
        patch = None
        if env.get("BYTEGRAPH_REGIONAL_COMPILE") == "0":
            patch = _bytegraph().config.patch(regional_compile=False)
        fn, inputs, counter, _ = build(row, real, args, s, device)
        if patch is not None:       # compiling happens on the first calls: only they need it
            with patch:
                for _ in range(1 + args.warmup):
                    out = fn(*inputs)
        else:
            for _ in range(1 + args.warmup):
                out = fn(*inputs)
        settle(real, fn, inputs, args)
        sync(device)
        progress(f"{compiler}: compiled and steady")
        steps[compiler] = (lambda fn=fn, inputs=inputs: fn(*inputs))
        graphs[compiler] = counter[0] if real == "bytegraph" else torch_graphs() if real == "torch.compile" else None
        losses[compiler] = out
    reference = "torch.compile" if "torch.compile" in compilers else compilers[0]
    result = {"row": row, "compiler": "interleaved", "interleaved": interleave.alternate(
        steps, args.rounds, args.iters, device, reference=reference, progress=progress)}
    if args.slow_host_too:
        busy = subprocess.Popen(["taskset", "-c", "0", sys.executable, "-c", "while True: pass"])
        os.sched_setaffinity(0, {0})
        try:
            result["slow_interleaved"] = interleave.alternate(steps, args.rounds, args.iters, device,
                                                              reference=reference,
                                                              progress=lambda m: progress(f"busy core: {m}"))
        finally:
            busy.kill()
            os.sched_setaffinity(0, range(os.cpu_count()))
    for compiler, out in losses.items():
        value = steps[compiler]()
        value = value if value.dim() == 0 else value.float().abs().mean()
        result["interleaved"]["compilers"][compiler].update(loss=float(value), graphs=graphs[compiler])
    if device == "cuda":
        result["device_allocs_per_step"] = {c: device_allocs_per_step(lambda f=f: f(), ()) for c, f in steps.items()}
        # Issue cost and GPU work of each compiler's step, in the same process: tells a step
        # held back by the host from one whose kernels take longer.
        hosts = {c: host_time(f, (), args) for c, f in steps.items()}
        result["host_ms"] = {c: ms for c, (ms, _) in hosts.items()}
        if args.host_profile:
            result["host_profile"] = {c: profile for c, (_, profile) in hosts.items()}
        if args.kernel_profile:
            result["kernels"] = {c: kernel_profile(f, (), args.kernel_profile) for c, f in steps.items()}
    if any(c.startswith("bytegraph") for c in compilers):
        from bytegraph.backends import tiers
        result["second_tiers"] = list(tiers.outcomes)
        result["cache_counters"] = cache_counters()
    return result


def slow_host_figures(fn, inputs, args):
    """The same process's compiled step measured again with its thread pinned to core 0, which a
    busy process shares: the slow-host figures without compiling twice."""
    device = args.device
    busy = subprocess.Popen(["taskset", "-c", "0", sys.executable, "-c", "while True: pass"])
    os.sched_setaffinity(0, {0})
    try:
        times = []
        for _ in range(args.iters):
            t = time.perf_counter()
            fn(*inputs)
            sync(device)
            times.append((time.perf_counter() - t) * 1e3)
        sync(device)
        t0 = time.perf_counter()
        for _ in range(args.iters):
            fn(*inputs)
        sync(device)
        out = {"slow_median_ms": statistics.median(times),
               "slow_pipelined_ms": (time.perf_counter() - t0) / args.iters * 1e3}
        if device == "cuda":
            out["slow_host_ms"], profile = host_time(
                fn, inputs, argparse.Namespace(iters=args.iters, host_profile=args.host_profile))
            if profile:
                out["slow_host_profile"] = profile
        return out
    finally:
        busy.kill()
        os.sched_setaffinity(0, range(os.cpu_count()))


def host_time(fn, inputs, args):
    """(median CPU ms to issue one step while the GPU is busy with earlier work, top entries of
    a cProfile of those steps or None)."""
    times = []
    profiler = None
    if args.host_profile:
        import cProfile
        profiler = cProfile.Profile()
    for _ in range(args.iters):
        torch.cuda.synchronize()
        torch.cuda._sleep(200_000_000)      # ~0.1 s of GPU cycles: the step is queued behind it
        if profiler is not None:
            profiler.enable()
        t = time.perf_counter()
        fn(*inputs)
        times.append((time.perf_counter() - t) * 1e3)
        if profiler is not None:
            profiler.disable()
    torch.cuda.synchronize()
    if profiler is None:
        return statistics.median(times), None
    import pstats
    stats = pstats.Stats(profiler).stats
    top = sorted(stats.items(), key=lambda kv: -kv[1][2])[:args.host_profile]
    return statistics.median(times), [
        {"function": f"{os.path.basename(k[0])}:{k[1]}({k[2]})", "calls": v[1],
         "own_ms_per_step": v[2] / args.iters * 1e3, "cum_ms_per_step": v[3] / args.iters * 1e3}
        for k, v in top]


def top_functions(profiler, top):
    """The ``top`` functions of a cProfile by cumulative time, with their own time (seconds): where
    a first call's time goes (which imports, traces, cache loads and compiles)."""
    import pstats
    stats = pstats.Stats(profiler).stats
    return [{"function": f"{os.path.basename(k[0])}:{k[1]}({k[2]})", "calls": v[1],
             "own_s": round(v[2], 3), "cum_s": round(v[3], 3)}
            for k, v in sorted(stats.items(), key=lambda kv: -kv[1][3])[:top]]


def kernel_profile(fn, inputs, top, steps=3):
    """GPU kernels per step from torch.profiler over ``steps`` steps: how many kernels one step
    launches, their summed time, and the ``top`` kernels by time (name, launches and ms per step):
    where two compilers' steps differ on the GPU."""
    from torch.profiler import ProfilerActivity, profile
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            fn(*inputs)
        torch.cuda.synchronize()
    kernels = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            count, us = kernels.get(e.name, (0, 0.0))
            kernels[e.name] = (count + 1, us + e.device_time)
    ranked = sorted(kernels.items(), key=lambda kv: -kv[1][1])
    return {"kernels_per_step": sum(c for c, _ in kernels.values()) / steps,
            "kernel_ms_per_step": sum(us for _, us in kernels.values()) / steps / 1e3,
            "kernel_profile": [{"kernel": name[:120], "launches_per_step": c / steps, "ms_per_step": us / steps / 1e3}
                               for name, (c, us) in ranked[:top]]}


def saved_bytes(fn, inputs):
    """Bytes the autograd graph keeps for backward during one step (tensors packed by autograd)."""
    kept = [0]

    def pack(t):
        kept[0] += t.numel() * t.element_size()
        return t
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn(*inputs)
    return kept[0]


WARM_FILES = """
import torch
import torch._dynamo, torch._inductor.compile_fx, triton, bytegraph
from torch._inductor import config
config.fx_graph_cache = False
torch.compile(lambda x: (x.sin() @ x).relu().sum(), backend="inductor")(torch.randn(64, 64, device="cuda"))
"""


def warm_file_cache(args):
    """One throwaway process that imports torch, Inductor, Triton and bytegraph and compiles a
    small kernel (into a cache directory of its own): the first process measured on a freshly
    started machine otherwise reads them from a cold disk, which added ~6 s to whichever compiler
    ran first (GPT-2 small compiled alone on an H200: 14.8 s first, against 7.6-8.7 s later)."""
    if args.device != "cuda":
        return
    import tempfile
    root = tempfile.mkdtemp(prefix="train_step_warm_files_")
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": os.path.join(root, "inductor"),
           "TRITON_CACHE_DIR": os.path.join(root, "triton")}
    subprocess.run([sys.executable, "-c", WARM_FILES], env=env, timeout=600, check=False,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def run_all(args):
    warm_file_cache(args)
    rows = CHECKPOINT_ROWS if args.checkpoint else FLOAT8_ROWS if args.float8 else ROWS
    if args.rows in rows:
        rows = [args.rows]
    elif args.rows:
        rows = [r for r in rows if any(k in r for k in args.rows.split(","))]
    results = []
    compilers = args.compilers.split(",") if args.compilers else COMPILERS
    for row in rows:
        if args.interleave:
            for _ in range(args.processes):
                results.append(run_one(row, ",".join(c for c in compilers if c != "eager"), args))
                print(f"  done: {row} / interleaved: {json.dumps(results[-1])[:600]}", file=sys.stderr, flush=True)
                if args.json:     # as it goes: a run cut short keeps what it measured
                    with open(args.json, "w") as f:
                        json.dump({"args": vars(args), "torch": torch.__version__, "results": results}, f, indent=1)
            if args.json:
                with open(args.json, "w") as f:
                    json.dump({"args": vars(args), "torch": torch.__version__, "results": results}, f, indent=1)
            continue
        for compiler in compilers:
            if args.warm_start:
                results.append(warm_start(row, compiler, args))
            else:
                runs = [run_one(row, compiler, args) for _ in range(args.processes)]
                results.append(combine(runs))
            print(f"  done: {row} / {compiler}: {json.dumps(results[-1])[:600]}", file=sys.stderr, flush=True)
            if args.json:     # as it goes: a run cut short keeps what it measured
                with open(args.json, "w") as f:
                    json.dump({"args": vars(args), "torch": torch.__version__, "results": results}, f, indent=1)
    print_table(results, args)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "torch": torch.__version__, "results": results}, f, indent=1)


def combine(runs):
    """One row from several processes' results: medians, and the spread of each figure."""
    ok = [r for r in runs if "error" not in r]
    if not ok:
        return runs[0]
    out = dict(ok[0])
    for key in ("first_ms", "median_ms", "pipelined_ms", "host_ms", "slow_median_ms", "slow_pipelined_ms",
                "slow_host_ms", "steady_after_s"):
        values = [r[key] for r in ok if key in r]
        if values:
            out[key] = statistics.median(values)
            out[key + "_spread"] = [min(values), max(values)]
    out["processes"] = len(ok)
    out["runs"] = [{k: r.get(k) for k in ("first_ms", "median_ms", "pipelined_ms", "host_ms", "slow_median_ms",
                                          "slow_pipelined_ms", "slow_host_ms", "loss", "host_speed_us")} for r in ok]
    return out


def warm_start(row, compiler, args):
    """Two fresh processes over one new, empty set of on-disk caches (Inductor's, AOTAutograd's,
    Triton's, bytegraph's): the first compiles cold and fills them, the second starts warm. The
    row's figures are the warm process's; ``cold_first_ms``, ``warm_first_ms`` and their ratio
    are added."""
    import tempfile
    root = tempfile.mkdtemp(prefix="train_step_warm_")
    caches = {"TORCHINDUCTOR_CACHE_DIR": os.path.join(root, "inductor"),
              "TRITON_CACHE_DIR": os.path.join(root, "triton"),
              "BYTEGRAPH_CACHE_DIR": os.path.join(root, "bytegraph")}
    cold = run_one(row, compiler, args, caches=caches, keep_caches=True)
    warm = run_one(row, compiler, args, caches=caches, keep_caches=True)
    if "error" in cold or "error" in warm:
        return cold if "error" in cold else warm
    out = dict(warm)
    out.update(cold_first_ms=cold["first_ms"], warm_first_ms=warm["first_ms"],
               warm_over_cold=warm["first_ms"] / cold["first_ms"], cold_loss=cold["loss"])
    return out


def run_one(row, compiler, args, caches=None, keep_caches=False):
    """One fresh process measuring ``row`` with ``compiler`` (under ``taskset`` with a busy
    neighbour on the same core for ``--slow-host``)."""
    real, extra_env = VARIANT_ENV.get(compiler, (compiler, {}))
    if args.interleave:     # every compiler in one process; variants are set up inside it
        real, extra_env = compiler, {}
    env = {**os.environ, **extra_env, **(caches or {})}
    cmd = [sys.executable, os.path.abspath(__file__), "--only-row", row, "--only-compiler", real,
           "--device", args.device, "--backend", args.backend, "--iters", str(args.iters),
           "--warmup", str(args.warmup), "--layers", str(args.layers), "--d", str(args.d),
           "--heads", str(args.heads), "--batch", str(args.batch), "--tokens", str(args.tokens),
           "--host-profile", str(args.host_profile), "--kernel-profile", str(args.kernel_profile),
           "--first-call-profile", str(args.first_call_profile), "--first-call-sample", str(args.first_call_sample),
           "--rounds", str(args.rounds)] + (["--slow-host-too"] if args.slow_host_too else []) + (
               ["--interleave"] if args.interleave else [])
    if args.tiny:
        cmd.append("--tiny")
    if args.warm_caches or keep_caches:
        cmd.append("--warm-caches")
    busy = None
    if args.slow_host:
        cmd = ["taskset", "-c", "0"] + cmd
        busy = subprocess.Popen(["taskset", "-c", "0", sys.executable, "-c", "while True: pass"])
    try:
        stdout, stderr = run_passing_progress(cmd, env, args.timeout, label=f"{row} / {compiler}")
    finally:
        if busy is not None:
            busy.kill()
    line = next((ln for ln in stdout.splitlines() if ln.startswith("{")), None)
    if line is None:
        err = (stderr.strip().splitlines() or ["no output"])[-1]
        return {"row": row, "compiler": compiler, "error": err[:160]}
    result = json.loads(line)
    if not args.interleave:
        result["compiler"] = compiler
    return result


def run_passing_progress(cmd, env, timeout, label):
    """Run ``cmd`` (killed after ``timeout`` seconds); its stdout and stderr as text, its
    ``progress:`` lines passed on to this process's stderr as they come."""
    import threading
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    out, err = [], []

    def pump_err():
        for ln in proc.stderr:
            err.append(ln)
            if ln.startswith("progress: "):
                print(f"  {label}: {ln[len('progress: '):].rstrip()}", file=sys.stderr, flush=True)
    readers = [threading.Thread(target=pump_err, daemon=True),
               threading.Thread(target=lambda: out.append(proc.stdout.read()), daemon=True)]
    for r in readers:
        r.start()
    try:
        proc.wait(timeout)
    except BaseException:
        proc.kill()
        raise
    for r in readers:
        r.join()
    return "".join(out), "".join(err)


def print_table(results, args):
    device = torch.cuda.get_device_name() if args.device == "cuda" else f"cpu ({torch.get_num_threads()} threads)"
    print(f"\n{device}, torch {torch.__version__}, backend {args.backend}, sizes {sizes(args)}")
    mem = any("memory_mb" in r for r in results)
    head = (f"{'':38s} {'compiler':16s} {'first call':>12s} {'median':>10s} {'pipelined':>10s} {'host':>9s} "
            f"{'loss':>10s} {'graphs':>7s}")
    print(head + (f" {'memory':>11s}" if mem else ""))
    for r in results:
        if "error" in r:
            print(f"{r['row']:38s} {r['compiler']:16s} ERROR: {r['error']}")
            continue
        if "interleaved" in r:
            print_interleaved(r)
            continue
        graphs = "" if r.get("graphs") is None else str(r["graphs"])
        line = (f"{r['row']:38s} {r['compiler']:16s} {r['first_ms'] / 1e3:10.2f} s {r['median_ms']:7.2f} ms "
                f"{r.get('pipelined_ms', float('nan')):7.2f} ms {r.get('host_ms', float('nan')):6.2f} ms "
                f"{r['loss']:10.4f} {graphs:>7s}")
        if "steady_after_s" in r:
            done = ", ".join(map(second_tier, r.get("second_tiers") or []))
            line += f"  (steady after {r['steady_after_s']:.1f} s; second tiers: {done or 'none'})"
            if r.get("cache_counters"):
                line += "\n    " + caches_line(r["cache_counters"])
        if "warm_first_ms" in r:
            line += (f"  (cold first call {r['cold_first_ms'] / 1e3:.2f} s, warm {r['warm_first_ms'] / 1e3:.2f} s: "
                     f"{r['warm_over_cold']:.2f}x)")
        if r.get("processes", 1) > 1:
            lo, hi = r["median_ms_spread"]
            line += f"  (median over {r['processes']} processes; step {lo:.2f}-{hi:.2f} ms"
            if "host_ms_spread" in r:
                line += f", host {r['host_ms_spread'][0]:.2f}-{r['host_ms_spread'][1]:.2f} ms"
            line += ")"
        if "slow_median_ms" in r:
            line += (f"\n{'':38s} {'  slow host':16s} {'':12s} {r['slow_median_ms']:7.2f} ms "
                     f"{r['slow_pipelined_ms']:7.2f} ms {r.get('slow_host_ms', float('nan')):6.2f} ms")
        if mem:
            line += f" {r['memory_mb']:8.1f} MB"
        print(line)
    print_process_summary(results)


def print_process_summary(results):
    """Per row interleaved in several processes: each compiler's step ratio to the reference, the
    median over processes of each process's median ratio (with the spread over processes), and
    the median of all rounds pooled; normal and slow host."""
    by_row = {}
    for r in results:
        if "interleaved" in r:
            by_row.setdefault(r["row"], []).append(r)
    for row, runs in by_row.items():
        if len(runs) < 2:
            continue
        for key, label in (("interleaved", ""), ("slow_interleaved", " (slow host)")):
            blocks = [r[key] for r in runs if key in r]
            if len(blocks) < 2:
                continue
            print(f"{row + label:38s} over {len(blocks)} processes:")
            for name in blocks[0]["ratios"]:
                per_process = [b["ratios"][name]["step"] for b in blocks if name in b["ratios"]]
                pooled = [a / b for blk in blocks if name in blk["ratios"]
                          for a, b in zip(blk["compilers"][name]["round_medians_ms"],
                                          blk["compilers"][_reference(blk)]["round_medians_ms"])]
                line = (f"{'':38s} {name:16s} step {statistics.median(per_process):.3f}x "
                        f"(processes {', '.join(f'{x:.3f}' for x in per_process)})")
                if pooled:
                    line += f"; all {len(pooled)} rounds: median {statistics.median(pooled):.3f}x"
                print(line)


def _reference(block):
    return next(n for n in block["compilers"] if n not in block["ratios"])


def print_interleaved(r):
    """One interleaved process: each compiler's median step and pipelined time over its turns, and
    the median ratio to the reference over rounds (with its spread), normal and slow host."""
    for key, label in (("interleaved", ""), ("slow_interleaved", " (slow host)")):
        if key not in r:
            continue
        block = r[key]
        speeds = block["host_speed_us"]
        print(f"{r['row'] + label:38s} interleaved, {block['rounds']} rounds x {block['iters']} steps; "
              f"host speed {min(speeds):.0f}-{max(speeds):.0f} us")
        for name, c in block["compilers"].items():
            ratio = block["ratios"].get(name)
            extra = (f"  step {ratio['step']:.3f}x ({ratio['step_spread'][0]:.3f}-{ratio['step_spread'][1]:.3f}), "
                     f"pipelined {ratio['pipelined']:.3f}x") if ratio else "  (reference)"
            loss = f"{c['loss']:10.4f}" if "loss" in c else ""
            graphs = "" if c.get("graphs") is None else str(c["graphs"])
            print(f"{'':38s} {name:16s} {'':12s} {c['median_ms']:7.2f} ms {c['pipelined_ms']:7.2f} ms "
                  f"{'':9s} {loss} {graphs:>7s}{extra}")
    for name, ms in (r.get("host_ms") or {}).items():
        k = (r.get("kernels") or {}).get(name)
        gpu = f"; {k['kernels_per_step']:.0f} kernels, {k['kernel_ms_per_step']:.2f} ms of GPU" if k else ""
        print(f"{'':38s} {name:16s} host {ms:.2f} ms per step{gpu}")
    if r.get("cache_counters"):
        print(f"{'':38s} " + caches_line(r["cache_counters"]))
    for t in r.get("second_tiers") or []:
        print(f"{'':38s} second tier ({t['label']}): {second_tier(t)}")


def second_tier(t):
    """One graph's second tier (``bytegraph.backends.tiers.outcomes``) in words."""
    if not t["whole"]:
        return f"not in: {t['error'][:100]}"
    if t.get("from_caches"):
        return f"whole from an earlier run's caches at the first call, in {t['load_s']:.1f} s"
    return f"child {t['child_s']:.1f} s, loaded {t['load_s']:.1f} s"


def caches_line(counts):
    return "caches: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--backend", default="inductor", help="backend for both compilers (inductor, aot_eager...)")
    p.add_argument("--tiny", action="store_true", help="a 2-layer toy model (for checking on the CPU)")
    p.add_argument("--checkpoint", action="store_true", help="the activation checkpointing rows instead")
    p.add_argument("--float8", action="store_true",
                   help="the float8 training row instead (torchao's convert_to_float8_training; H100/H200)")
    p.add_argument("--rows", default=None, help="comma-separated words choosing rows (e.g. 'fused,inference')")
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--d", type=int, default=768)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--tokens", type=int, default=1024)
    p.add_argument("--iters", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--timeout", type=int, default=1800)
    p.add_argument("--json", default=None)
    p.add_argument("--warm-caches", action="store_true",
                   help="keep Inductor's, Triton's and bytegraph's on-disk caches (default: each run starts cold)")
    p.add_argument("--warm-start", action="store_true",
                   help="per row and compiler, a cold process then a warm one over the same fresh caches "
                        "(first calls and their ratio; the step figures are the warm process's)")
    p.add_argument("--compilers", default=None,
                   help="comma-separated columns (eager, torch.compile, bytegraph, bytegraph-whole); default: "
                        + ",".join(COMPILERS))
    p.add_argument("--processes", type=int, default=1, help="fresh processes per row (medians and spread)")
    p.add_argument("--slow-host", action="store_true",
                   help="each process pinned to core 0 with a busy process sharing it (a slow or busy host)")
    p.add_argument("--slow-host-too", action="store_true",
                   help="after the normal figures, measure the same compiled step again pinned to core 0 shared "
                        "with a busy process (slow_* figures; no second compile)")
    p.add_argument("--host-profile", type=int, default=0,
                   help="add the N functions taking most host time per issued step to the JSON (CUDA)")
    p.add_argument("--kernel-profile", type=int, default=0,
                   help="add kernels per step and the N kernels taking most GPU time per step to the JSON (CUDA)")
    p.add_argument("--first-call-profile", type=int, default=0,
                   help="add the N functions taking most time (cumulative) in the first call to the JSON")
    p.add_argument("--first-call-sample", type=int, default=0,
                   help="add the N functions taking most wall time in the first call (the compile() call not "
                        "included) to the JSON, from stack samples every 5 ms (bench/stack_sampler.py: "
                        "it hardly slows the call)")
    p.add_argument("--interleave", action="store_true",
                   help="per row, one process with every compiler's step, timed in alternating rounds "
                        "(steady state only: bench/interleave.py)")
    p.add_argument("--rounds", type=int, default=6, help="alternating rounds for --interleave")
    p.add_argument("--only-row", default=None)
    p.add_argument("--only-compiler", default=None)
    args = p.parse_args()
    if args.only_row is not None:
        if not args.warm_caches:
            cold_caches()
        if args.interleave:
            result = measure_interleaved(args.only_row, args.only_compiler.split(","), args)
        else:
            result = measure(args.only_row, args.only_compiler, args)
        print(json.dumps(result), flush=True)
        return
    run_all(args)


if __name__ == "__main__":
    main()

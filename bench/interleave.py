"""Two compiled steps timed in one process, in alternating rounds: a comparison the host's noise
cannot tilt.

On a shared GPU host the same benchmark process lands in a fast or a slow state (seen on H200s:
a launch-bound step's per-process median near 24 or near 35 ms, for either compiler, pinned or
not), so per-process medians need many processes before a few per cent can be told apart. Here
both compilers' steps live in one process and take turns, ``rounds`` times, ``iters`` steps a
turn, the order flipped every round; whatever state the host is in, both see it. The figures are
each compiler's median step over all its turns, the median of the per-round ratios, and a
host-speed probe (a fixed pure-Python loop) per round, which shows whether the host's speed moved
while they ran.

Only steady-state steps are comparable this way: the compiler that compiles second in a process
finds the imports, and often the kernels, of the first, so first calls are measured in separate
processes (``bench/train_step.py`` without ``--interleave``).
"""
import statistics
import time


def host_speed_us(loops=3):
    """Microseconds for a fixed pure-Python loop (the least of ``loops`` tries): the host's
    speed for the interpreter work a launch-bound step is made of. Lower is faster."""
    best = float("inf")
    for _ in range(loops):
        t0 = time.perf_counter()
        acc = 0
        for i in range(20_000):
            acc += i & 7
        best = min(best, time.perf_counter() - t0)
    return best * 1e6


def step_times_ms(fn, iters, device):
    """Per-step milliseconds of ``fn()`` (CUDA events on the GPU, wall clock elsewhere), each step
    synchronized, and the wall time per step of the same number of steps run back to back."""
    import torch
    cuda = device == "cuda"
    times = []
    for _ in range(iters):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t) * 1e3)
    if cuda:
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    if cuda:
        torch.cuda.synchronize()
    return times, (time.perf_counter() - t0) / iters * 1e3


def alternate(steps, rounds, iters, device, reference=None, progress=None):
    """Time each of ``steps`` (name -> callable with no arguments, already compiled and warm) in
    ``rounds`` turns of ``iters`` steps, flipping the order every round. Returns a dict: per name
    its median step and pipelined ms over all turns and per-round medians; ``ratios``: per name
    other than ``reference``, the median over rounds of (its round median / the reference's);
    ``host_speed_us`` per round; ``progress``, if given, is told each round's medians."""
    names = list(steps)
    reference = reference or names[0]
    per_round = {n: [] for n in names}
    pipelined = {n: [] for n in names}
    every = {n: [] for n in names}
    speeds = []
    for r in range(rounds):
        speeds.append(host_speed_us())
        for name in (names if r % 2 == 0 else names[::-1]):
            times, pipe = step_times_ms(steps[name], iters, device)
            every[name].extend(times)
            per_round[name].append(statistics.median(times))
            pipelined[name].append(pipe)
        if progress is not None:
            progress(f"round {r + 1}/{rounds}: " + ", ".join(f"{n} {per_round[n][-1]:.2f} ms" for n in names))
    out = {"rounds": rounds, "iters": iters, "host_speed_us": speeds, "compilers": {}}
    for n in names:
        out["compilers"][n] = {"median_ms": statistics.median(every[n]),
                               "pipelined_ms": statistics.median(pipelined[n]),
                               "round_medians_ms": per_round[n], "round_pipelined_ms": pipelined[n]}
    out["ratios"] = {}
    for n in names:
        if n == reference:
            continue
        step = [a / b for a, b in zip(per_round[n], per_round[reference])]
        pipe = [a / b for a, b in zip(pipelined[n], pipelined[reference])]
        out["ratios"][n] = {"step": statistics.median(step), "step_spread": [min(step), max(step)],
                            "pipelined": statistics.median(pipe), "pipelined_spread": [min(pipe), max(pipe)]}
    return out

"""Run many seeds of the generated-program differential test outside pytest, and count.

    python scripts/run_generated.py --sets closures,raising --seeds 5000 [--start 0] [--out fails.txt]

The set ``lookup`` runs tests/generated_lookup.py's programs (attribute lookup and protocol
builtins on classes, descriptors and modules) instead; the set ``breaks`` runs
tests/generated_breaks.py's (breaks inside callees at several depths: equal to eager, and at least
torch.compile's ops inside graphs).

Each seed's program (tests/test_generated_python.py) is compared with eager as the test
does; the script prints, per feature set, how many seeds agreed, how many differed (and the
first line of each difference kind), and how many crashed the interpreter or timed out.
Seeds run in a worker process that is restarted after a crash or a hang, so one bad seed
does not stop the run. ``BYTEGRAPH_ROOT`` (default: this checkout) is put first on the path,
so the same generator can be run against another checkout of bytegraph.
"""
import argparse
import collections
import multiprocessing as mp
import os
import sys
import time

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _worker(root, tests_dir, jobs, results):
    sys.path.insert(0, tests_dir)
    sys.path.insert(0, root)
    import contextlib
    import io
    import warnings
    warnings.simplefilter("ignore")
    import bytegraph
    import generated_breaks
    import generated_lookup
    import test_generated_python as g
    while True:
        job = jobs.get()
        if job is None:
            return
        name, seed = job
        bytegraph.reset()
        status, detail = "ok", ""
        try:
            with contextlib.redirect_stderr(io.StringIO()):
                if name == "lookup":   # tests/generated_lookup.py: Python's attribute lookup rules
                    generated_lookup.run_seed(seed)
                elif name == "breaks":   # tests/generated_breaks.py: capture after breaks in callees
                    generated_breaks.run_seed(seed)
                else:
                    g.run_seed(name, seed)
        except BaseException as e:  # noqa: BLE001 - we classify everything
            cause = e.__cause__ or e
            status = "differs"
            lines = [ln for ln in str(cause).splitlines() if ln.strip()]
            detail = f"{type(cause).__name__}: {lines[0][:160] if lines else ''}"
        results.put((name, seed, status, detail))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sets", default="core,functions,effects,control,closures,raising,inplace,grads,shared,all")
    p.add_argument("--seeds", type=int, default=100)
    p.add_argument("--start", type=int, default=0)
    p.add_argument("--timeout", type=float, default=60.0, help="seconds per seed before it counts as a hang")
    p.add_argument("--out", help="write the failing (set, seed, detail) lines here")
    p.add_argument("--rerun", metavar="FILE", help="run only the seeds listed in FILE (an --out file)")
    args = p.parse_args()
    root = os.environ.get("BYTEGRAPH_ROOT", HERE)
    tests_dir = os.path.join(HERE, "tests")
    todo = [(name, seed) for name in args.sets.split(",") for seed in range(args.start, args.start + args.seeds)]
    if args.rerun:
        with open(args.rerun) as f:
            todo = [(row.split("\t")[0], int(row.split("\t")[1])) for row in f if row.strip()]
    ctx = mp.get_context("spawn")
    counts = collections.defaultdict(collections.Counter)
    kinds = collections.defaultdict(collections.Counter)
    fails = []
    t0 = time.time()
    while todo:
        jobs, results = ctx.Queue(), ctx.Queue()
        proc = ctx.Process(target=_worker, args=(root, tests_dir, jobs, results), daemon=True)
        proc.start()
        for job in todo:
            jobs.put(job)
        jobs.put(None)
        done = 0
        while done < len(todo):
            try:
                name, seed, status, detail = results.get(timeout=args.timeout)
            except Exception:   # the worker crashed or hangs on todo[done]
                name, seed = todo[done]
                status, detail = ("crashed" if not proc.is_alive() else "timeout"), f"exit code {proc.exitcode}"
                proc.kill()
                counts[name][status] += 1
                fails.append((name, seed, status, detail))
                done += 1
                break
            counts[name][status] += 1
            if status != "ok":
                kinds[name][detail] += 1
                fails.append((name, seed, status, detail))
            done += 1
        todo = todo[done:]
        proc.join(1)
    print(f"python {sys.version.split()[0]}, bytegraph from {root}, {time.time() - t0:.0f} s")
    for name, c in counts.items():
        total = sum(c.values())
        print(f"[{name}] {c['ok']}/{total} agree with eager; differ {c['differs']}, crashed {c['crashed']}, "
              f"timeout {c['timeout']}")
        for detail, k in kinds[name].most_common(8):
            print(f"    {k:5d}  {detail}")
    if args.out:
        with open(args.out, "w") as f:
            for row in fails:
                f.write("\t".join(map(str, row)) + "\n")


if __name__ == "__main__":
    main()

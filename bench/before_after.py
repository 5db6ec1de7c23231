"""bytegraph's capture and per-call times before and after a change, in one run.

    python bench/before_after.py --before /path/to/old/checkout [--rounds 2] [--repeat 3] [--only NAME,...]

Runs ``bench/compare.py --bytegraph-only`` of this checkout for both bytegraphs (the old one
through ``BYTEGRAPH_ROOT``), each in its own process, alternating before/after for
``--rounds`` rounds so a machine that slows down mid-run weighs on both; prints per subject the
best capture and per-call overhead of each, and the after/before ratio. Make the old checkout
with ``git worktree add /tmp/before <commit>`` (or ``git archive <commit> | tar -x -C DIR``).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent


def run(root, args, out):
    env = dict(os.environ, BYTEGRAPH_ROOT=str(root), OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    cmd = [sys.executable, str(HERE / "compare.py"), "--bytegraph-only", "--repeat", str(args.repeat),
           "--json", out]
    if args.only:
        cmd += ["--only", args.only]
    subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL)
    return json.loads(Path(out).read_text())["results"]


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--before", required=True, help="checkout of the old bytegraph")
    p.add_argument("--after", default=str(HERE.parent), help="checkout of the new one (default: this one)")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--only", help="subjects (comma-separated), as for compare.py")
    args = p.parse_args()
    best = {"before": {}, "after": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for which in ("before", "after"):
                rows = run(getattr(args, which), args, os.path.join(tmp, f"{which}{r}.json"))
                for row in rows:
                    b = row["bytegraph"]
                    cur = best[which].setdefault(row["subject"], {})
                    for key in ("capture_ms", "overhead_us", "graphs", "ops"):
                        if b.get(key) is not None:
                            cur[key] = min(cur.get(key, b[key]), b[key]) if key.endswith(("ms", "us")) else b[key]
                    if b.get("errors"):
                        cur["errors"] = b["errors"]
    print(f"{'subject':<16} {'capture ms before':>18} {'after':>8} {'ratio':>6}   {'overhead us before':>19} "
          f"{'after':>8}   graphs/ops before -> after")
    for name, before in best["before"].items():
        after = best["after"].get(name, {})
        cb, ca = before.get("capture_ms"), after.get("capture_ms")
        ob, oa = before.get("overhead_us"), after.get("overhead_us")
        ratio = f"{ca / cb:.2f}" if cb and ca else "-"
        fmt = lambda v, f: format(v, f) if v is not None else "-"   # noqa: E731
        print(f"{name:<16} {fmt(cb, '18.1f')} {fmt(ca, '8.1f')} {ratio:>6}   {fmt(ob, '19.1f')} {fmt(oa, '8.1f')}   "
              f"{before.get('graphs')}/{before.get('ops')} -> {after.get('graphs')}/{after.get('ops')}"
              + (f"  errors: {before.get('errors') or ''} {after.get('errors') or ''}"
                 if before.get("errors") or after.get("errors") else ""))


if __name__ == "__main__":
    main()

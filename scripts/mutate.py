"""Break bytegraph on purpose and count the tests that do not notice.

    python scripts/mutate.py                                  # every break, the whole suite
    python scripts/mutate.py -m dead_tracer -m memo_graph tests/test_graph_breaks.py
    python scripts/mutate.py -n 2 -k "not slow" tests/        # anything after the options goes to pytest

Each break (``scripts/bytegraph_mutations.py``, a pytest plugin loaded with ``-p``; the package
has no hook for it) replaces one function of bytegraph in the test processes:

  dead_tracer      every frame not compiled with fullgraph=True runs eagerly
  memo_graph       every compiled graph returns its first call's outputs forever
  no_guards        every guard passes
  no_side_effects  side effects traced in a frame are not done after its graph
  skip_resume      a resume function after a graph break returns None at once

For each break and test file it prints: the items run, the items that still pass, the items
the break reached (it changed what bytegraph did while the item ran: a frame not traced, a
memoised graph output returned, a failing guard passed...) and, of those, the items that still
pass, the ones that let the break through. An item the break never reached cannot notice it.
The figure to watch is the last column: survivors among the reached items. An item marked
``@pytest.mark.mutation_blind(<break>..., reason=...)`` says it cannot notice that break (a result
that does not depend on the input values cannot tell a memoised graph); it is left out of the
reached items and shown apart, "+N reached, marked mutation_blind".
"""
import argparse
import collections
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from bytegraph_mutations import MUTATIONS  # noqa: E402


def run_pytest(mutation, pytest_args, workers, xml_path):
    env = dict(os.environ, BYTEGRAPH_MUTATION=mutation or "")
    env["PYTHONPATH"] = os.pathsep.join([HERE, ROOT] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    cmd = [sys.executable, "-m", "pytest", "-p", "bytegraph_mutations", "-p", "no:cacheprovider", "-q",
           "-n", str(workers), f"--junitxml={xml_path}", "-o", "junit_family=xunit1", "--no-header",
           "--tb=no", "-rN", *pytest_args]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seconds = time.perf_counter() - t0
    if not os.path.exists(xml_path):
        sys.stdout.write(proc.stdout[-5000:])
        raise SystemExit(f"pytest wrote no results for {mutation or 'no mutation'} (exit status {proc.returncode})")
    return seconds


def read_results(xml_path):
    """{file: [(passed, fired, name), ...]} from a junit xml file (skipped items left out; an
    item marked ``mutation_blind`` for the break counts as not reached, ``BLIND`` counts it)."""
    per_file = collections.defaultdict(list)
    for case in ET.parse(xml_path).getroot().iter("testcase"):
        outcome = {child.tag for child in case}
        if "skipped" in outcome:
            continue
        passed = not ({"failure", "error"} & outcome)
        fired, blind = 0, False
        for prop in case.iter("property"):
            if prop.get("name") == "mutation_fired":
                fired = int(prop.get("value"))
            elif prop.get("name") == "mutation_blind":
                blind = True
        path = case.get("file") or case.get("classname", "?").replace(".", "/") + ".py"
        name = os.path.basename(path.split("::")[0])
        if not name.endswith(".py"):
            name = case.get("classname", "?").split(".")[-1] + ".py"
        if blind and fired > 0:
            BLIND[name].append((passed, case.get("name")))
            fired = 0
        per_file[name].append((passed, fired > 0, case.get("name")))
    return per_file


# {file: [(passed, name), ...]}: the items a break reached that are marked blind to it.
BLIND = collections.defaultdict(list)


def table(mutation, per_file, seconds, survivors=False):
    print(f"\n== {mutation}: {MUTATIONS.get(mutation, 'bytegraph as it is')} ({seconds:.0f} s)")
    print(f"{'file':42} {'items':>6} {'pass':>6} {'reached':>8} {'reached+pass':>13}")
    totals = [0, 0, 0, 0]
    for name in sorted(per_file):
        rows = per_file[name]
        counts = [len(rows), sum(p for p, _, _ in rows), sum(f for _, f, _ in rows),
                  sum(p and f for p, f, _ in rows)]
        totals = [a + b for a, b in zip(totals, counts)]
        blind = BLIND.get(name, [])
        blind_note = (f"   (+{len(blind)} reached, marked mutation_blind, {sum(p for p, _ in blind)} pass)"
                      if blind else "")
        print(f"{name:42} {counts[0]:6} {counts[1]:6} {counts[2]:8} {counts[3]:13}{blind_note}")
        if survivors:
            for passed, fired, item in rows:
                if passed and fired:
                    print(f"    survived: {item}")
            for passed, item in blind:
                print(f"    blind ({'passed' if passed else 'failed'}): {item}")
    items, passed, reached, survived = totals
    share = f"{100 * survived / reached:.1f}%" if reached else "-"
    print(f"{'total':42} {items:6} {passed:6} {reached:8} {survived:13}   survivors among reached: {share}")
    return totals


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-m", "--mutation", action="append", choices=sorted(MUTATIONS),
                        help="a break to apply (repeatable; default: all)")
    parser.add_argument("-n", "--workers", default="2", help="pytest-xdist workers (default 2)")
    parser.add_argument("--reference", action="store_true", help="also run once with no break")
    parser.add_argument("--survivors", action="store_true", help="list the reached items that still pass")
    args, pytest_args = parser.parse_known_args()
    sys.stdout.reconfigure(line_buffering=True)
    mutations = args.mutation or list(MUTATIONS)
    if args.reference:
        mutations = [None] + mutations
    summary = []
    with tempfile.TemporaryDirectory() as folder:
        for mutation in mutations:
            xml_path = os.path.join(folder, f"{mutation or 'reference'}.xml")
            seconds = run_pytest(mutation, pytest_args or ["tests"], args.workers, xml_path)
            BLIND.clear()
            summary.append((mutation or "reference", table(mutation or "reference", read_results(xml_path),
                                                           seconds, args.survivors and mutation is not None)))
    print("\n== summary")
    print(f"{'break':18} {'items':>6} {'pass':>6} {'reached':>8} {'reached+pass':>13} {'survivors':>10}")
    for name, (items, passed, reached, survived) in summary:
        share = f"{100 * survived / reached:.1f}%" if reached else "-"
        print(f"{name:18} {items:6} {passed:6} {reached:8} {survived:13} {share:>10}")


if __name__ == "__main__":
    main()

"""Shrink a generated program that differs from eager to a small one that still differs.

    python scripts/shrink_generated.py SET SEED

Removes statements (a line with the block under it) of ``generated`` one at a time, as long
as the program still compiles and the comparison still fails the same way, and prints the
smallest program found with its inputs. For the bug hunt after a failing seed of
``scripts/run_generated.py`` or ``tests/test_generated_python.py``.
"""
import contextlib
import io
import os
import sys
import warnings

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(HERE, "tests"))
sys.path.insert(0, os.environ.get("BYTEGRAPH_ROOT", HERE))
warnings.simplefilter("ignore")

import bytegraph  # noqa: E402
import test_generated_python as g  # noqa: E402


def failure(src, inputs, feature_set, seed):
    """The first line of the mismatch, or None when the program agrees (or is invalid)."""
    bytegraph.reset()
    try:
        fn, ns = g.build(src, f"<shrunk {feature_set} {seed}>")
    except SyntaxError:
        return None
    if "grads" in g.FEATURE_SETS[feature_set]:
        fn = g.with_backward(fn)
    backend = g.lookup_backend("aot_eager") if feature_set in ("grads", "inplace") and seed % 2 == 0 else None
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            g.compare(fn, [g._maker(ns, a, k) for a, k in inputs], backend=backend)
    except AssertionError as e:
        msg = str(e).splitlines()[0]
        return msg.split(" (call")[0]
    except Exception:
        return None
    return None


def blocks(lines):
    """(start, end) of each statement of the body: a line and the deeper lines under it."""
    out = []
    for i, line in enumerate(lines):
        if i == 0 or not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        j = i + 1
        while j < len(lines) and (len(lines[j]) - len(lines[j].lstrip())) > indent:
            j += 1
        out.append((i, j))
    return out


def main():
    feature_set, seed = sys.argv[1], int(sys.argv[2])
    _, _, src, inputs = g.make_program(feature_set, seed)
    want = failure(src, inputs, feature_set, seed)
    if want is None:
        print("this seed agrees with eager")
        return
    print("failure:", want)
    head, sep, body = src.partition("def generated(")
    lines = (sep + body).splitlines()
    changed = True
    while changed:
        changed = False
        for start, end in reversed(blocks(lines)):
            if lines[start].lstrip().startswith("return ("):
                continue
            trial = lines[:start] + lines[end:]
            # a block left empty needs a body
            if start > 0 and lines[start - 1].rstrip().endswith(":") and (
                    start >= len(trial) or len(trial[start]) - len(trial[start].lstrip())
                    <= len(lines[start - 1]) - len(lines[start - 1].lstrip())):
                trial = trial[:start] + [lines[start][:len(lines[start]) - len(lines[start].lstrip())] + "pass"] \
                    + trial[start:]
                if trial == lines:
                    continue
            if failure(head + "\n".join(trial) + "\n", inputs, feature_set, seed) == want:
                lines = trial
                changed = True
                break
    print(head + "\n".join(lines))
    print("inputs:", inputs)


if __name__ == "__main__":
    main()

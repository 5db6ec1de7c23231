"""python -m bytegraph.report: the page, loaded in real headless Chromium.

Chromium comes from scripts/setup_test_deps.sh (run by the README's test command and CI). The
page is loaded twice from disk: once printing its DOM after the scripts ran (with Chromium's
console log on stderr, where script errors show), once taking a screenshot.
"""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

import pytest
import torch

import bytegraph
from bytegraph.report import main

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--no-first-run",
         "--disable-component-update", "--disable-sync", "--disable-extensions", "--hide-scrollbars"]


def helper(y):
    return y.sin()


def breaks(x, n):
    y = torch.relu(x) + 1
    print("between graphs")
    return helper(y) * n


def reads_locals(x):
    d = locals()
    return x + d["x"]


def chromium(*args, timeout=60):
    if CHROMIUM is None:
        if os.environ.get("CI"):
            pytest.fail("chromium is missing: scripts/setup_test_deps.sh installs it (the README's test command runs it)")
        pytest.skip("chromium is not installed (scripts/setup_test_deps.sh installs it)")
    with tempfile.TemporaryDirectory() as profile:
        return subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={profile}", *args],
                              capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    """A debug directory (a graph break, a recompile, an eager frame) and its page, written once."""
    tmp_path = tmp_path_factory.mktemp("report")
    bytegraph.reset()
    bytegraph.config.debug_dir = str(tmp_path / "debug")
    try:
        compiled = bytegraph.compile(breaks, backend="eager")
        for size in (3, 4):
            x = torch.randn(size)
            torch.testing.assert_close(compiled(x, 2), breaks(x, 2))
        x = torch.randn(3)
        torch.testing.assert_close(bytegraph.compile(reads_locals, backend="eager")(x), reads_locals(x))
    finally:
        bytegraph.config.debug_dir = ""
    page = tmp_path / "report.html"
    out = subprocess.run([sys.executable, "-m", "bytegraph.report", str(tmp_path / "debug"), "-o", str(page)],
                         capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    assert out.returncode == 0, out.stderr
    assert "wrote" in out.stdout
    return page


def test_report_in_chromium(report, tmp_path):
    html = report.read_text()
    assert "http://" not in html and "https://" not in html and "src=" not in html   # nothing fetched
    run = chromium("--enable-logging=stderr", "--v=0", "--dump-dom", report.as_uri())
    assert run.returncode == 0, run.stderr[-2000:]
    dom = run.stdout
    console = [line for line in run.stderr.splitlines() if ":CONSOLE" in line]
    assert console == []                                  # no script errors, no console output
    assert 'data-ready="1"' in dom and "data-script-errors" not in dom.split("<main>")[0]
    for section in ("summary", "time", "frames", "breaks", "recompiles", "cache", "details"):
        assert f'id="{section}"' in dom
    cards = dict(re.findall(r'<div class="card" id="count-([a-z-]+)"><div class="n">([^<]+)</div>', dom))
    assert {k: cards[k] for k in ("frames", "graphs", "ops", "graph-breaks", "eager-frames", "recompiles")} == {
        "frames": "5", "graphs": "4", "ops": "8", "graph-breaks": "2", "eager-frames": "1", "recompiles": "2"}
    assert '<span id="frames-shown">5</span>' in dom      # filled in by the page's script
    # The user's breaking line, highlighted, with the reason.
    assert re.search(r'<tr class="break-line"><td class="ln">\d+</td><td><pre>    <mark>print\("between graphs"\)'
                     r'</mark></pre>', dom)
    assert "print() cannot be put in a graph" in dom
    assert "builtin locals() cannot run inside a graph" in dom
    assert "size of x (dim 0): expected 3, got 4" in dom   # the recompile's failing guard
    assert re.search(r'data-ops="2">2 ops</span>', dom)
    assert dom.count('class="seg" data-phase=') >= 6       # time bars: the run, and each frame
    shot = tmp_path / "report.png"
    run = chromium(f"--screenshot={shot}", "--window-size=1280,2000", report.as_uri())
    assert run.returncode == 0, run.stderr[-2000:]
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000


def test_report_picks_the_newest_run_and_writes_into_it_by_default(report):
    debug = report.parent / "debug"
    assert main([str(debug)]) == 0
    (run,) = [d for d in debug.iterdir() if d.name.startswith("run_")]
    page = (run / "report.html").read_text()
    assert "001_breaks/graph_1.py" in page                # links relative to the page
    index = json.loads((run / "index.json").read_text())
    assert len(index["frames"]) == 5

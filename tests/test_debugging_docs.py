"""Every example of docs/debugging.md marked <!-- example: NAME -->, run as written.

The blocks of one NAME run in order in one fresh folder: Python blocks in this process as a
script (``__main__``), bash blocks in a shell with bytegraph and tests/ on PYTHONPATH, expected
to exit 0 unless the marker says ``exit N``.
"""
import os
import re
import runpy
import subprocess

import pytest

import bytegraph
import replay_fault

DOC = os.path.join(os.path.dirname(__file__), "..", "docs", "debugging.md")
MARKER = re.compile(r"<!-- example: (\w+)(?:, exit (\d+))? -->\n```(python|bash)\n(.*?)```", re.S)


def examples():
    found = {}
    for m in MARKER.finditer(open(DOC, encoding="utf-8").read()):
        found.setdefault(m.group(1), []).append((m.group(3), m.group(4), int(m.group(2) or 0)))
    return found


EXAMPLES = examples()


def test_every_tool_has_an_example():
    assert set(EXAMPLES) >= {"function_filter", "debug_dir", "minifier", "replay"}


@pytest.fixture
def settings():
    saved = bytegraph.config.as_dict()
    yield
    replay_fault.uninstall()
    for name, value in saved.items():
        setattr(bytegraph.config, name, value)


# The replay example shows what a user sees by default: an internal error runs the frame eagerly.
@pytest.mark.parametrize("name", [pytest.param(name, marks=[pytest.mark.suppress_errors] if name == "replay" else [])
                                  for name in sorted(EXAMPLES)])
def test_example(name, tmp_path, monkeypatch, settings):
    monkeypatch.chdir(tmp_path)
    tests = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(os.path.dirname(os.path.abspath(bytegraph.__file__)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([root, tests]))
    for k in [k for k in env if k.startswith("BYTEGRAPH_")]:
        del env[k]
    for i, (language, code, status) in enumerate(EXAMPLES[name]):
        if language == "python":
            path = tmp_path / f"example_{i}.py"
            path.write_text(code)
            runpy.run_path(str(path), run_name="__main__")
        else:
            out = subprocess.run(["bash", "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                                 timeout=120)
            assert out.returncode == status, out.stdout + out.stderr

"""BYTEGRAPH_DEBUG_DIR / config.debug_dir: one folder per compiled frame, and index.json."""
import json
import os
import subprocess
import sys

import pytest
import torch

import bytegraph
from bytegraph.errors import ConfigError


def scaled(y):
    return y.sin()


def breaks_once(x, n):
    y = torch.relu(x) + 1
    print("between graphs")
    return scaled(y) * n


RESUME = f"resume_in_breaks_once_at_line_{breaks_once.__code__.co_firstlineno + 2}"   # the print (the call resumes after it)


@pytest.fixture
def debug_dir(tmp_path):
    bytegraph.config.debug_dir = str(tmp_path)
    yield tmp_path
    bytegraph.config.debug_dir = ""


def only_run(root):
    runs = [d for d in os.listdir(root) if d.startswith("run_")]
    assert len(runs) == 1, runs
    return os.path.join(root, runs[0])


def test_a_frame_with_a_graph_break_and_a_recompile(debug_dir, capsys):
    compiled = bytegraph.compile(breaks_once, backend="aot_eager")
    for size in (3, 4):                     # the second size recompiles both frames
        x = torch.randn(size)
        torch.testing.assert_close(compiled(x, 2), breaks_once(x, 2))
    run = only_run(debug_dir)
    index = json.load(open(os.path.join(run, "index.json")))
    frames = index["frames"]
    assert [f["folder"] for f in frames] == ["001_breaks_once", f"002_{RESUME}", "003_breaks_once", f"004_{RESUME}"]
    first, resume, again = frames[0], frames[1], frames[2]
    # The frame that breaks: its graph, the break with the user's line, the resume function.
    assert first["outcome"] == "graph break"
    assert first["graphs"][0]["op_counts"] == {"relu": 1, "add": 1}
    assert first["break"]["reason"] == "print() cannot be put in a graph"
    assert first["break"]["stack"][-1]["line"] == 'print("between graphs")'
    assert [g["name"] for g in first["generated"]] == [RESUME]
    assert "x: TENSOR_MATCH" in "\n".join(first["guards"])
    assert set(first["timings"]) >= {"bytecode tracing", "backend compile", "guard building", "code generation"}
    folder = os.path.join(run, first["folder"])
    assert sorted(os.listdir(folder)) == sorted([
        "backend_1_aot_eager_forward_aten_graph.py", "frame.json", "graph_1.py", "graph_1_table.txt",
        "guard_function.py", "guards.txt", "original_bytecode.txt", f"{RESUME}.txt",
        "source.txt", "timings.json", "transformed_function.py"])
    assert "print(\"between graphs\")" in open(os.path.join(folder, "source.txt")).read()
    assert "LOAD_GLOBAL" in open(os.path.join(folder, "original_bytecode.txt")).read()
    assert "torch.relu(x)" in open(os.path.join(folder, "graph_1.py")).read()
    assert "call_function  relu" in open(os.path.join(folder, "graph_1_table.txt")).read()
    assert open(os.path.join(folder, "guard_function.py")).read().startswith("def guard_breaks_once")
    assert "__resolve" in open(os.path.join(folder, "transformed_function.py")).read()
    assert "aten.relu" in open(os.path.join(folder, "backend_1_aot_eager_forward_aten_graph.py")).read()
    # The resume function is a frame of its own (helper inlined), then the recompile.
    assert resume["resume_of"] == "breaks_once" and resume["graphs"][0]["op_counts"] == {".sin": 1, "mul": 1}
    assert again["recompile_reason"] == "size of x (dim 0): expected 3, got 4"
    assert again["cache_entry"] == 2
    assert open(os.path.join(run, again["folder"], "recompile_reason.txt")).read() == \
        "size of x (dim 0): expected 3, got 4\n"
    assert frames[3]["recompile_reason"] == "size of y (dim 0): expected 3, got 4"


def test_a_frame_that_runs_eagerly_is_listed_with_its_reason(debug_dir):
    def reads_locals(x):
        d = locals()
        return x + d["x"]

    x = torch.randn(3)
    torch.testing.assert_close(bytegraph.compile(reads_locals, backend="eager")(x), reads_locals(x))
    (frame,) = json.load(open(os.path.join(only_run(debug_dir), "index.json")))["frames"]
    assert frame["outcome"] == "eager" and frame["graphs"] == []
    assert "locals()" in frame["break"]["reason"]


def test_a_new_directory_starts_a_new_run(tmp_path):
    f = bytegraph.compile(lambda x: x + 1, backend="eager")
    try:
        for name in ("a", "b"):
            bytegraph.config.debug_dir = str(tmp_path / name)
            bytegraph.reset()
            f(torch.ones(2))
    finally:
        bytegraph.config.debug_dir = ""
    for name in ("a", "b"):
        frames = json.load(open(os.path.join(only_run(tmp_path / name), "index.json")))["frames"]
        assert len(frames) == 1


def test_an_unwritable_directory_is_a_config_error_naming_the_setting(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    with pytest.raises(ConfigError, match=r"bytegraph.config.debug_dir = .* cannot be written to: .* is not a directory"):
        bytegraph.config.debug_dir = str(blocker / "debug")
    assert bytegraph.config.debug_dir == ""
    env = dict(os.environ, BYTEGRAPH_DEBUG_DIR=str(blocker / "debug"))
    out = subprocess.run([sys.executable, "-c", "import bytegraph"], env=env, capture_output=True, text=True)
    assert out.returncode != 0
    assert "ConfigError: BYTEGRAPH_DEBUG_DIR=" in out.stderr and "cannot be written to" in out.stderr

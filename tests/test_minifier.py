"""The minifier (BYTEGRAPH_REPRO_AFTER / REPRO_LEVEL) with deliberately broken compilers.

A model of more than 20 ops; compilers that raise on relu (when compiling or when running) or
compute sigmoid wrongly, as bytegraph backends ('frontend') and as AOTAutograd inner compilers
('aot'). Each written repro.py is run: it exits 1 while the failure reproduces.
"""
import os
import runpy
import subprocess
import sys

import pytest
import torch

import bytegraph
import broken_backends
from bytegraph.testing import CompileCounter
from broken_backends import TwentyOps
from bytegraph.debug.repro import op_count, run_repro
from bytegraph.errors import AccuracyError, BackendError, ConfigError

CASES = [  # after, level, backend, error raised to the program
    ("frontend", 1, "relu_compile_error", BackendError),
    ("frontend", 2, "relu_compile_error", BackendError),
    ("frontend", 3, "relu_runtime_error", RuntimeError),
    ("frontend", 4, "wrong_sigmoid", AccuracyError),
    ("aot", 1, "aot_relu_compile_error", BackendError),
    ("aot", 2, "aot_relu_compile_error", BackendError),
    ("aot", 3, "aot_relu_runtime_error", RuntimeError),
    ("aot", 4, "aot_wrong_sigmoid", AccuracyError),
]


@pytest.fixture
def repro_dir(tmp_path):
    saved = (bytegraph.config.repro_after, bytegraph.config.repro_level, bytegraph.config.repro_dir)
    bytegraph.config.repro_dir = str(tmp_path)
    yield tmp_path
    bytegraph.config.repro_after, bytegraph.config.repro_level, bytegraph.config.repro_dir = saved


def run_file(path):
    """Run a repro.py in this process; its exit status."""
    with pytest.raises(SystemExit) as exit_:
        runpy.run_path(str(path), run_name="__main__")
    return exit_.value.code


def model_graph_ops():
    counter = CompileCounter()
    bytegraph.compile(TwentyOps(), backend=counter)(torch.randn(4, 16))
    return counter.op_count


@pytest.mark.parametrize("after, level, backend, error", CASES, ids=[f"{a}-{lv}-{b}" for a, lv, b, _ in CASES])
def test_minifier_levels(repro_dir, after, level, backend, error, capsys):
    bytegraph.config.repro_after = after
    bytegraph.config.repro_level = level
    model = bytegraph.compile(TwentyOps(), backend=getattr(broken_backends, backend))
    with pytest.raises(error) as raised:
        model(torch.randn(4, 16))
    repro = repro_dir / "repro.py"
    text = str(raised.value) + "".join(getattr(raised.value, "__notes__", []))
    assert str(repro) in text                            # the error says where the repro is
    namespace = runpy.run_path(str(repro))               # (not as __main__: just its definitions)
    graph = namespace["make_graph"]()
    if level == 1:
        assert op_count(graph) >= 20                     # written as captured
    else:
        assert op_count(graph) <= 3
        targets = {str(n.target) for n in graph.nodes if n.op == "call_function"}
        assert any(("relu" if "relu" in backend else "sigmoid") in t for t in targets)
    assert run_file(repro) == 1                          # reproduces
    # With a compiler that works, the same repro passes (exit 0).
    working = (lambda gm, inputs: gm.forward) if after == "frontend" else broken_backends.working_inner
    assert (namespace["AFTER"], namespace["KIND"]) == (after, {1: "compile", 2: "compile", 3: "run", 4: "accuracy"}[level])
    saved = namespace["SAVED"] and str(repro_dir / namespace["SAVED"])
    assert run_repro(graph, namespace["INPUTS"], working, after, namespace["KIND"], namespace["EXPECTED"], saved) == 0


def test_the_model_has_more_than_20_ops():
    assert model_graph_ops() >= 20


def test_repro_runs_in_a_fresh_process_with_only_torch_and_bytegraph(repro_dir):
    bytegraph.config.repro_after = "frontend"
    bytegraph.config.repro_level = 4
    model = bytegraph.compile(TwentyOps(), backend=broken_backends.wrong_sigmoid)
    with pytest.raises(AccuracyError, match="differ from eager"):
        model(torch.randn(4, 16))
    worktree = os.path.dirname(os.path.dirname(bytegraph.__file__))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "BYTEGRAPH_REPRO_AFTER")}
    env["PYTHONPATH"] = worktree
    out = subprocess.run([sys.executable, str(repro_dir / "repro.py")], cwd=str(repro_dir), env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "bytegraph repro: reproduces: output 0: max abs difference 0.5" in out.stdout


def test_a_working_backend_writes_nothing(repro_dir):
    bytegraph.config.repro_after = "frontend"
    bytegraph.config.repro_level = 4
    model = TwentyOps()
    x = torch.randn(4, 16)
    torch.testing.assert_close(bytegraph.compile(model, backend="eager")(x), model(x))
    assert list(repro_dir.iterdir()) == []


def test_bad_settings_name_the_setting():
    with pytest.raises(ConfigError, match=r"repro_after must be None or one of 'frontend', 'aot', got 'dynamo'"):
        bytegraph.config.repro_after = "dynamo"
    with pytest.raises(ConfigError, match="repro_level must be 1, 2, 3 or 4, got 5"):
        bytegraph.config.repro_level = 5
    env = dict(os.environ, BYTEGRAPH_REPRO_AFTER="dynamo")
    out = subprocess.run([sys.executable, "-c", "import bytegraph"], env=env, capture_output=True, text=True)
    assert out.returncode != 0
    assert "ConfigError: BYTEGRAPH_REPRO_AFTER='dynamo' is not a place to minify after; use one of frontend, aot" \
        in out.stderr

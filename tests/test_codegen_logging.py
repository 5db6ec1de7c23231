"""Generated code is readable and inspectable; logging topics go to bytegraph.* loggers."""
import inspect
import logging
import subprocess
import sys

import torch

import bytegraph
from bytegraph.testing import CompileCounter


def _entry(compiled):
    return compiled._bytegraph_cache.entries[0]


def test_transformed_and_guard_source_are_inspectable():
    def f(x, n):
        return {"out": x * n, "pair": (x + 1, n), "rows": [x[0]]}

    cf = bytegraph.compile(f, backend=CompileCounter())
    x = torch.randn(3, 2)
    res = cf(x, 3)
    assert set(res) == {"out", "pair", "rows"} and res["pair"][1] == 3
    entry = _entry(cf)
    src = inspect.getsource(entry.run)
    assert src == entry.transformed_source
    assert src.startswith("def transformed_f_")
    assert "__compiled_fn(x)" in src
    assert inspect.getsource(entry.guard).startswith("def guard_f_")
    assert "x.shape == (3, 2)" in entry.guard_source
    # The guard for the int argument is a value check.
    assert "n == " in entry.guard_source
    # It reads as a string: sliced, split, searched like one.
    assert entry.guard_source[:12] == "def guard_f_"
    assert entry.guard_source.splitlines()[0].startswith("def guard_f_")
    # sliced and changed like a str (the text is written on first use)
    assert str(entry.guard_source[:40]) == str(entry.guard_source)[:40]
    assert str(entry.guard_source.upper()) == str(entry.guard_source).upper()


def test_wrapper_keeps_name_and_doc():
    def my_function(x):
        """Docs."""
        return x + 1

    cf = bytegraph.compile(my_function, backend="eager")
    assert cf.__name__ == "my_function" and cf.__doc__ == "Docs."
    assert cf.__wrapped__ is my_function


def test_guard_explains_failures_in_user_terms():
    def f(x, scale):
        return x * scale

    cf = bytegraph.compile(f, backend="eager", dynamic=False)
    cf(torch.randn(4), 2)
    entry = _entry(cf)
    assert entry.explain(torch.randn(8), 2) == "size of x (dim 0): expected 4, got 8"
    assert entry.explain(torch.randn(4), 3) == "scale changed: 2 -> 3"
    assert "dtype of x changed" in entry.explain(torch.randn(4, dtype=torch.float64), 2)
    assert entry.explain(torch.randn(4), 2) is None


def test_log_topics_reach_bytegraph_loggers(caplog):
    def f(x):
        return torch.relu(x) * 2

    with bytegraph.config.patch(log_topics=["graph", "guards", "output_code"]):
        with caplog.at_level(logging.DEBUG, logger="bytegraph"):
            bytegraph.compile(f, backend="eager")(torch.randn(2))
    names = {r.name for r in caplog.records}
    assert {"bytegraph.graph", "bytegraph.guards", "bytegraph.output_code"} <= names
    text = caplog.text
    assert "relu" in text and "TENSOR_MATCH" in text and "def transformed_f_" in text


def test_nothing_printed_without_logs(capsys):
    bytegraph.compile(lambda x: x.sin(), backend="eager")(torch.randn(2))
    out, err = capsys.readouterr()
    assert out == "" and err == ""


def test_env_variable_turns_topics_on():
    code = ("import torch, bytegraph\n"
            "bytegraph.compile(lambda x: x.cos(), backend='eager')(torch.randn(2))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**__import__("os").environ, "BYTEGRAPH_LOGS": "graph"}, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == ""
    assert "[bytegraph.graph]" in proc.stderr and "cos" in proc.stderr

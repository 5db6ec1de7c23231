"""The progress line of long backend compiles: shown on a terminal only."""
import io
import sys
import time

import pytest
import torch

import bytegraph
from bytegraph.debug import progress


class Terminal(io.StringIO):
    def isatty(self):
        return True


def slow_backend(gm, example_inputs):
    time.sleep(0.35)
    return gm.forward


def two_graphs(x):
    y = torch.relu(x)
    print("between")
    return y + 1


@pytest.fixture
def fast_progress(monkeypatch):
    monkeypatch.setattr(progress, "AFTER_SECONDS", 0.1)
    monkeypatch.setattr(progress, "EVERY_SECONDS", 0.1)


def test_progress_on_a_terminal(fast_progress, monkeypatch, capsys):
    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    x = torch.randn(3)
    torch.testing.assert_close(bytegraph.compile(two_graphs, backend=slow_backend)(x), two_graphs(x))
    text = terminal.getvalue()
    assert "\rbytegraph: compiling graph 1 (two_graphs) with slow_backend: 0s [0/1 graphs done]" in text
    assert "compiling graph 2 (resume_in_two_graphs_at_line_" in text and "[1/2 graphs done]" in text
    finished = [line for line in text.split("\n") if "compiled graph" in line]
    assert len(finished) == 2 and finished[1].rstrip().endswith("[2/2 graphs done]")


def test_quiet_when_not_a_terminal(fast_progress, monkeypatch, capsys):
    pipe = io.StringIO()
    monkeypatch.setattr(sys, "stderr", pipe)
    bytegraph.compile(two_graphs, backend=slow_backend)(torch.randn(3))
    assert pipe.getvalue() == ""


def test_quiet_for_quick_compiles(monkeypatch, capsys):
    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    bytegraph.compile(two_graphs, backend="eager")(torch.randn(3))   # well under AFTER_SECONDS
    assert terminal.getvalue() == ""

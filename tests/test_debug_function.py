"""config.debug_function / BYTEGRAPH_DEBUG_FUNCTION: compile only frames of the named functions."""
import os
import subprocess
import sys

import pytest
import torch

import bytegraph
from bytegraph.testing import CompileCounter


def inner(x):
    return torch.sin(x) + 1


def outer(x):
    y = x * 2
    return inner(y) - 1


def breaking(x):
    y = torch.cos(x)
    print("between graphs")
    return y + 1


@pytest.fixture(autouse=True)
def _restore():
    saved = list(bytegraph.config.debug_function)
    bytegraph.reset()
    yield
    bytegraph.config.debug_function = saved
    bytegraph.reset()


@pytest.mark.parametrize("names, graphs, ops", [
    ([], 1, 4),                 # no filter: outer compiled, inner inlined
    (["outer"], 1, 4),          # outer selected: inner is part of its frame
    (["inner"], 1, 2),          # outer runs eagerly; inner, called through its globals, is compiled
    (["test_debug_function.inner"], 0, 0),   # a module path is not a qualified name
    (["nothing"], 0, 0),
])
def test_only_selected_frames_compile(names, graphs, ops):
    bytegraph.config.debug_function = names
    counter = CompileCounter()
    compiled = bytegraph.compile(outer, backend=counter)
    for _ in range(2):
        x = torch.randn(5)
        torch.testing.assert_close(compiled(x), outer(x))
    assert (counter.frame_count, counter.op_count) == (graphs, ops)


def test_resume_functions_of_a_selected_frame_compile(capsys):
    bytegraph.config.debug_function = ["breaking"]
    counter = CompileCounter()
    compiled = bytegraph.compile(breaking, backend=counter)
    x = torch.randn(3)
    torch.testing.assert_close(compiled(x), breaking(x))
    assert capsys.readouterr().out == "between graphs\n" * 2
    assert counter.frame_count == 2      # before and after the print


def test_qualified_names_select_methods():
    class Block(torch.nn.Module):
        def forward(self, x):
            return torch.relu(x) * 3

    bytegraph.config.debug_function = [Block.forward.__qualname__]
    counter = CompileCounter()
    block = Block()
    compiled = bytegraph.compile(block, backend=counter)
    x = torch.randn(4)
    torch.testing.assert_close(compiled(x), block(x))
    assert counter.frame_count == 1


def test_bad_names_are_a_config_error():
    with pytest.raises(bytegraph.ConfigError, match="debug_function"):
        bytegraph.config.debug_function = ["ok", 3]
    with pytest.raises(bytegraph.ConfigError, match="debug_function"):
        bytegraph.config.debug_function = "outer"


def test_environment_variable_sets_the_filter():
    code = "import bytegraph; print(bytegraph.config.debug_function)"
    env = dict(os.environ, BYTEGRAPH_DEBUG_FUNCTION="forward, step ,")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "['forward', 'step']"

"""warnings.warn in compiled code: shown after the graph, from the place eager shows it from, once
per place or every time as Python's filters say; a warning the filters make an error raises as
in eager (natively, at a graph break)."""
import warnings

import pytest
import torch

import bytegraph
from bytegraph.testing import CompileCounter
from helpers import assert_traced


def _shown(fn, *inputs, action="default"):
    """The results of ``fn`` on each of ``inputs`` in turn (a second call gets other values, so a
    graph answering every call alike fails the comparison) and the warnings shown meanwhile."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter(action)
        results = [fn(x) for x in inputs]
    return results, [(str(w.message), w.category, w.filename, w.lineno) for w in caught]


def _ones_then_other(n):
    return torch.ones(n), torch.arange(1.0, n + 1.0)


def deprecated_helper(x):
    warnings.warn("old helper", DeprecationWarning, stacklevel=2)
    return x * 2


def uses_helper(x):
    warnings.warn("checking")
    y = deprecated_helper(x) + 1
    warnings.warn(RuntimeWarning("as an instance"))
    return y


@pytest.mark.parametrize("action", ["default", "always", "once", "ignore", "module"])
def test_shown_as_eager(action):
    expected, expected_warnings = _shown(uses_helper, *_ones_then_other(3), action=action)
    cnt = CompileCounter()
    actual, actual_warnings = _shown(bytegraph.compile(uses_helper, backend=cnt, fullgraph=True),
                                     *_ones_then_other(3), action=action)
    assert len(actual) == 2 and all(torch.equal(e, a) for e, a in zip(expected, actual))
    assert actual_warnings == expected_warnings
    assert cnt.frame_count == 1


def test_stacklevel_names_the_callers_line():
    _, shown = _shown(uses_helper, torch.ones(1))
    assert [w[0] for w in shown] == ["checking", "old helper", "as an instance"]
    assert shown[1][3] == uses_helper.__code__.co_firstlineno + 2     # the line calling deprecated_helper


class Warns(torch.nn.Module):
    def forward(self, x):
        warnings.warn("from forward", stacklevel=2)     # names a frame of nn.Module.__call__
        return x + 1


def test_stacklevel_over_a_module_call_breaks():
    m = Warns()

    def fn(x):
        return m(x) * 3

    # (Where it then shows from natively is the compiled forward's caller: bytegraph's dispatch
    # wrapper, not nn.Module's __call__ as in eager.)
    expected, _ = _shown(fn, *_ones_then_other(2))
    actual, _ = _shown(bytegraph.compile(fn, backend="eager"), *_ones_then_other(2))
    assert_traced()     # broken at the module call, rather than the frame left to run unread
    assert len(actual) == 2 and all(torch.equal(e, a) for e, a in zip(expected, actual))
    with pytest.raises(bytegraph.errors.Unsupported, match="stacklevel"):
        bytegraph.compile(fn, backend="eager", fullgraph=True)(torch.ones(2))


def _breaks_at_error_warning(category):
    from bytegraph.debug import records
    return any(f"warnings.warn() of a {category.__name__} that the warning filters turn into an error"
               in (r.break_reason or "") for r in records.frames)


def test_warning_made_an_error_raises_as_eager():
    cnt = CompileCounter()
    compiled = bytegraph.compile(uses_helper, backend=cnt)
    compiled(torch.ones(2))     # compiled with the warning replayed
    assert cnt.frame_count == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(UserWarning, match="checking"):
            uses_helper(torch.ones(2))
        with pytest.raises(UserWarning, match="checking"):
            compiled(torch.ones(2))     # the filters' guard fails; the new trace breaks at the warning
        assert _breaks_at_error_warning(UserWarning)
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        with pytest.raises(DeprecationWarning, match="old helper"):
            compiled(torch.ones(2))
        assert _breaks_at_error_warning(DeprecationWarning)


def test_warning_in_a_loop_body_breaks():
    from torch._higher_order_ops import map as hop_map

    def fn(xs):
        def f(x):
            warnings.warn("inside")
            return x + 1
        return hop_map(f, xs)

    with pytest.raises(bytegraph.errors.Unsupported, match="changes Python state outside itself"):
        bytegraph.compile(fn, backend="eager", fullgraph=True)(torch.ones(2, 2))

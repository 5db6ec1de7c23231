"""Small helpers shared by the built-in backends.

Nothing here imports torch._inductor or AOTAutograd at module level, so that
``import bytegraph.backends.registry`` stays cheap.
"""
import contextlib
import functools
import warnings

from torch.utils import _pytree as pytree

from ..errors import BackendError


def flat_tuple_output(gm):
    """Make ``gm`` return a flat tuple, as AOTAutograd insists.

    Graphs from the bytegraph tracer already return a flat tuple or list and
    are left alone (the usual, free case). Otherwise (a bare tensor, a nested
    structure, a dict) the output node is rewritten in place to return the
    flattened leaves, and the returned ``restore`` function rebuilds the
    original structure from the flat list. ``restore`` is ``None`` when no
    rewrite was needed.
    """

    node = gm.graph.output_node()
    (result,) = node.args
    if isinstance(result, (tuple, list)) and not any(
            isinstance(r, (tuple, list, dict)) for r in result):
        return None
    leaves, spec = pytree.tree_flatten(result)
    node.args = (tuple(leaves),)
    gm.recompile()

    def restore(flat):
        return pytree.tree_unflatten(list(flat), spec)

    return restore


def with_restore(compiled, restore):
    """Wrap a positional-call ``compiled`` so that its flat outputs are regrouped."""
    if restore is None:
        return compiled

    @functools.wraps(compiled, assigned=("__doc__",), updated=())
    def call(*args):
        return restore(compiled(*args))

    return call


def compile_failed(backend_name, exc):
    """The BackendError raised when a backend's compiler throws."""
    err = BackendError(
        f"backend {backend_name!r} failed to compile a graph: {type(exc).__name__}: {exc}")
    err.backend = backend_name
    return err


def as_list(example_inputs):
    """The example inputs as a fresh list (backends may consume or reorder it)."""
    return list(example_inputs)



@contextlib.contextmanager
def quiet_torch_imports():
    """Hide the DeprecationWarnings torch.jit emits while TorchInductor is first imported.

    They concern torch's own modules, not the user's code.
    """
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=DeprecationWarning, module=r"torch\.jit")
        yield

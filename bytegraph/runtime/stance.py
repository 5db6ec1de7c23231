"""The compiler's stance: ``bytegraph.set_stance`` (and ``torch.compiler.set_stance`` under
``patch_torch_compile``), with the meaning torch.compile gives it.

- ``"default"``: compile on a miss, as usual.
- ``"force_eager"``: every compiled function runs its original code, compiled code unused.
- ``"eager_on_recompile"``: compiled code whose guards hold still runs; a miss runs eagerly
  instead of compiling (a function not compiled yet runs eagerly too).
- ``"fail_on_recompile"``: a miss raises ``RecompileError`` (a RuntimeError) instead of
  compiling, where the frame has anything torch would compile for (tensors, modules, arrays,
  torch or NumPy globals; a function handed to compile always).
- ``"eager_then_compile"``: a function's first miss runs eagerly; the next compiles, with the
  sizes and ints that differed between the two calls symbolic from the start.
  ``"aot_eager_then_compile"``: the same (the first call's AOT tracing for memory is not done;
  a warning says so once).
- ``skip_guard_eval_unsafe=True``: a call checks only the guards that tell a function's
  compiled entries apart, plus tensor metadata and global state (grad mode...); any miss
  raises. Unsafe as torch's: a changed global read as a constant goes unnoticed.
- ``force_backend=`` (with ``"default"``): misses compile with that backend, and only entries
  compiled with it run (entries of each backend are kept apart, as torch keeps them).

The per-call path pays nothing: a stance that changes what a hit does (``force_eager``,
``skip_guard_eval_unsafe``, ``force_backend``) rebuilds every cache's dispatch list when it is
set (``cache.CodeCache.refresh``); the others act on a miss only (``dispatch.Compiler.miss``).
"""
import functools
from dataclasses import dataclass

from ..config import warn_once
from ..errors import BytegraphError

STANCES = ("default", "force_eager", "eager_on_recompile", "fail_on_recompile", "eager_then_compile",
           "aot_eager_then_compile")


@dataclass(frozen=True)
class Stance:
    name: str = "default"
    skip_guard_eval_unsafe: bool = False
    force_backend: object = None      # a backend name or callable, with "default" only

    @property
    def changes_hits(self):
        """Does this stance change what a call that hits its cache runs?"""
        return self.name == "force_eager" or self.skip_guard_eval_unsafe or self.force_backend is not None


DEFAULT = Stance()
current = [DEFAULT]
_listeners = []     # fn(old, new), called when the stance changes


def on_change(fn):
    """Call ``fn(old, new)`` whenever the stance changes (the caches' dispatch lists; torch's
    own stance, kept the same under ``patch_torch_compile``)."""
    _listeners.append(fn)


def remove_listener(fn):
    if fn in _listeners:
        _listeners.remove(fn)


def apply(new):
    """Make ``new`` the stance; returns the one it replaces."""
    old = current[0]
    if new == DEFAULT:
        new = DEFAULT       # the miss path tells the default apart by identity
    if new == old:
        return old
    current[0] = new
    for fn in list(_listeners):
        fn(old, new)
    return old


def make(stance="default", skip_guard_eval_unsafe=False, force_backend=None):
    """A checked ``Stance``."""
    if stance not in STANCES:
        raise BytegraphError(f"set_stance: unknown stance {stance!r}; known stances: "
                             + ", ".join(repr(s) for s in STANCES))
    if not isinstance(skip_guard_eval_unsafe, bool):
        raise BytegraphError("set_stance: skip_guard_eval_unsafe must be True or False, "
                             f"got {skip_guard_eval_unsafe!r}")
    if force_backend is not None and stance != "default":
        raise BytegraphError(f"set_stance: force_backend is for the 'default' stance only, not {stance!r}")
    if stance == "aot_eager_then_compile":
        warn_once("aot_eager_then_compile",
                  "bytegraph: set_stance('aot_eager_then_compile') runs a function's first call eagerly "
                  "(not through AOT eager: no activation memory saving there), then compiles, as "
                  "'eager_then_compile'")
    return Stance(stance, skip_guard_eval_unsafe, force_backend)


class set_stance:
    """Set the compiler's stance (module docstring: what each one means), as a function
    (``set_stance("force_eager")`` ... ``set_stance("default")``), a ``with`` block, or a
    decorator. The stance is set when this is made; leaving the block (or the decorated call)
    gives back the stance there was when it was made (when the call began). Calling it inside a
    compiled function is an error, as under torch.compile."""

    _bytegraph_forbidden = True

    def __init__(self, stance="default", *, skip_guard_eval_unsafe=False, force_backend=None):
        self.stance = make(stance, skip_guard_eval_unsafe, force_backend)
        self.prev = apply(self.stance)

    def __enter__(self):
        apply(self.stance)

    def __exit__(self, *exc):
        apply(self.prev)
        return False

    def __call__(self, fn):
        apply(self.prev)
        stance = self.stance

        @functools.wraps(fn)
        def with_stance(*args, **kwargs):
            before = apply(stance)
            try:
                return fn(*args, **kwargs)
            finally:
                apply(before)

        with_stance._bytegraph_forbidden = True
        return with_stance

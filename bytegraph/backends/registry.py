"""Named graph compilers ("backends") and how a ``backend=`` argument is resolved.

A backend is any callable ``compiler_fn(gm, example_inputs) -> compiled``
where ``gm`` is a ``torch.fx.GraphModule`` captured by the tracer and
``example_inputs`` is the list of values its placeholders receive. The
built-in backends return a callable used as ``compiled(*inputs)`` that
returns a tuple or list of the graph's outputs in order.

This module is imported by ``import bytegraph``; it must stay cheap, so the
heavy pieces (AOTAutograd, TorchInductor) are only imported inside the
backend functions and inside ``lookup_backend`` when inductor settings have
to be checked.
"""
from __future__ import annotations

import difflib
import functools
import typing

import torch

from ..errors import BackendError

from ._common import quiet_torch_imports
from .aot import aot_eager
from .cudagraphs import cudagraphs
from .eager import eager
from .inductor import inductor

__all__ = ["register_backend", "lookup_backend", "list_backends", "replays_cuda_graphs", "CompilerFn"]

# A backend: (graph module, example inputs) -> the callable that runs the graph.
CompilerFn = typing.Callable[[torch.fx.GraphModule, list], typing.Callable[..., typing.Any]]

# name -> compiler function; name -> tags
_BACKENDS = {}
_TAGS = {}

# Values of ``mode`` with the same meaning as in torch.compile.
MODES = (None, "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


def register_backend(compiler_fn: CompilerFn | None = None, name: str | None = None,
                     tags: tuple | str = ()) -> CompilerFn | typing.Callable[[CompilerFn], CompilerFn]:
    """Register ``compiler_fn`` under ``name`` (default: its ``__name__``).

    Usable as ``@register_backend``, ``@register_backend(name="x")`` or
    ``register_backend(fn, name="x")``; returns ``compiler_fn`` unchanged.
    ``tags`` (e.g. ``("debug",)``) let ``list_backends`` hide a backend.
    Registering the same function again under its name is harmless;
    registering a different function under a taken name raises BackendError.
    """
    if compiler_fn is None:
        return functools.partial(register_backend, name=name, tags=tags)
    if not callable(compiler_fn):
        raise BackendError(
            f"register_backend: a backend must be callable, got {type(compiler_fn).__name__}")
    if name is None:
        name = getattr(compiler_fn, "__name__", None)
        if not isinstance(name, str):
            raise BackendError(
                f"register_backend: {type(compiler_fn).__name__} object has no __name__; pass name=")
    if not isinstance(name, str) or not name:
        raise BackendError(f"register_backend: name must be a non-empty str, got {name!r}")
    if isinstance(tags, str):
        tags = (tags,)
    existing = _BACKENDS.get(name)
    if existing is not None and existing is not compiler_fn and existing != compiler_fn:
        raise BackendError(
            f"backend {name!r} is already registered (to {_describe(existing)}); "
            "choose another name")
    _BACKENDS[name] = compiler_fn
    _TAGS[name] = tuple(tags)
    return compiler_fn


def list_backends(exclude_tags: tuple | None = ("debug", "experimental")) -> list[str]:
    """Sorted names of the registered backends, leaving out those with any of ``exclude_tags``.

    ``exclude_tags=None`` (or an empty tuple) lists every backend.
    """
    excluded = set(exclude_tags or ())
    return sorted(n for n in _BACKENDS if not excluded.intersection(_TAGS.get(n, ())))


def lookup_backend(backend: str | CompilerFn, mode: str | None = None, options: dict | None = None) -> CompilerFn:
    """Resolve ``backend`` to a compiler function ``(gm, example_inputs) -> callable``.

    ``backend`` is a registered name or any callable (returned as is).
    ``mode`` and ``options`` (a dict of ``torch._inductor.config`` settings)
    are meaningful for inductor only; for inductor they are checked here,
    once, and folded into the returned compiler function. Any misuse raises
    BackendError.
    """
    if mode not in MODES:
        raise BackendError(f"unknown mode {mode!r}; known modes: "
                           + ", ".join(repr(m) for m in MODES[1:]))
    if options is not None and not isinstance(options, dict):
        raise BackendError(f"options must be a dict, got {type(options).__name__}")

    if isinstance(backend, str):
        compiler_fn = _BACKENDS.get(backend)
        if compiler_fn is None:
            raise BackendError(f"unknown backend {backend!r}; known backends: "
                               + ", ".join(list_backends(exclude_tags=None)))
        label = repr(backend)
    elif callable(backend):
        compiler_fn = backend
        label = _describe(backend)
    else:
        raise BackendError(
            "backend must be the name of a registered backend (str) or a callable, "
            f"got {type(backend).__name__}")

    has_mode = mode not in (None, "default")
    has_options = bool(options)
    if compiler_fn is inductor:
        if not (has_mode or has_options):
            return compiler_fn
        patches = {}
        if has_mode:
            patches.update(_mode_options(mode))
        if has_options:
            patches.update(_checked_inductor_options(options))
        return functools.partial(inductor, config_patches=patches)
    if has_mode or has_options:
        given = " and ".join(w for w, on in (("mode", has_mode), ("options", has_options)) if on)
        raise BackendError(f"{given} only apply to the inductor backend, not to backend {label}")
    return compiler_fn


def replays_cuda_graphs(compiler_fn: CompilerFn) -> bool:
    """Does this compiler function replay CUDA graphs (``cudagraphs``, ``mode="reduce-overhead"``)?"""
    if compiler_fn is cudagraphs:
        return True
    patches = getattr(compiler_fn, "keywords", None) or {}
    return bool((patches.get("config_patches") or {}).get("triton.cudagraphs"))


def _mode_options(mode):
    """The inductor settings a ``mode`` stands for (as torch.compile maps them)."""
    with quiet_torch_imports():
        # Heavy (Inductor): imported only when a mode or options are given.
        from torch._inductor import list_mode_options

    return dict(list_mode_options(mode))


def _checked_inductor_options(options):
    """``options`` with each key checked against ``torch._inductor.config``.

    Keys may use ``-`` for ``_``; values must match the setting's declared
    type where that type is a plain class (an int is accepted for a float,
    a bool is not accepted for an int).
    """

    with quiet_torch_imports():
        # Heavy (Inductor): imported only when a mode or options are given.
        from torch._inductor import config as inductor_config

    known = inductor_config.get_config_copy()
    checked = {}
    for key, value in options.items():
        if not isinstance(key, str):
            raise BackendError(f"inductor option names must be str, got {key!r}")
        attr = key.replace("-", "_")
        if attr not in known:
            close = difflib.get_close_matches(attr, known, n=3)
            hint = f"; did you mean {', '.join(map(repr, close))}?" if close else ""
            raise BackendError(
                f"unknown inductor option {key!r} (not a setting of torch._inductor.config){hint}")
        expected = _declared_type(inductor_config, attr, known[attr])
        if expected is not None and typing.get_origin(expected) is None and isinstance(expected, type):
            if expected is bool:
                ok = isinstance(value, bool)
            elif expected is int:
                ok = isinstance(value, int) and not isinstance(value, bool)
            elif expected is float:
                ok = isinstance(value, (int, float)) and not isinstance(value, bool)
            else:
                ok = isinstance(value, expected)
            if not ok:
                raise BackendError(
                    f"inductor option {key!r} expects {expected.__name__}, "
                    f"got {type(value).__name__} {value!r}")
        checked[attr] = value
    return checked


def _declared_type(config_module, attr, default):
    get_type = getattr(config_module, "get_type", None)
    if get_type is not None:
        try:
            return get_type(attr)
        except Exception:
            pass
    return None if default is None else type(default)


def _describe(fn):
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None)
    if name is None:
        return f"a {type(fn).__name__} object"
    module = getattr(fn, "__module__", None)
    return f"{module}.{name}" if module else name


register_backend(eager)
register_backend(aot_eager)
register_backend(inductor)
register_backend(cudagraphs)

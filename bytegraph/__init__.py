"""bytegraph: a just-in-time compiler front end for PyTorch, written in Python.

Public API only; see docs/architecture.md for how the pieces fit.
"""
from .config import config
from .errors import AccuracyError, BytegraphError, Unsupported, BackendError, ConfigError, RecompileError
from .backends.registry import list_backends, register_backend
from .backends.tiers import wait_for_background_compiles
from .api import compile, reset, run, OptimizedModule, is_compiling
from .debug.profiler import CompileProfiler
from .debug.timing import compile_times
from .control import (allow_in_graph, disable, disallow_in_graph, graph_break, mark_dynamic, mark_static,
                      wrap_numpy)
from .api import explain, patch_torch_compile, replay, set_stance, unpatch_torch_compile

__version__ = "0.1.0"

__all__ = [
    "compile", "reset", "config", "list_backends", "register_backend", "OptimizedModule",
    "is_compiling", "BytegraphError", "Unsupported", "BackendError", "ConfigError",
    "disable", "allow_in_graph", "disallow_in_graph", "graph_break", "explain", "mark_dynamic",
    "mark_static", "run", "CompileProfiler", "compile_times", "replay", "AccuracyError", "wrap_numpy",
    "patch_torch_compile", "unpatch_torch_compile", "set_stance", "RecompileError",
    "wait_for_background_compiles",
]

if config.patch_torch_compile:   # BYTEGRAPH_PATCH_TORCH_COMPILE=1
    patch_torch_compile()

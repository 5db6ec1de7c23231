"""Graph compilers ("backends") and their registry; see ``registry``."""
from .aot import aot_autograd
from .registry import list_backends, lookup_backend, register_backend

__all__ = ["aot_autograd", "list_backends", "lookup_backend", "register_backend"]

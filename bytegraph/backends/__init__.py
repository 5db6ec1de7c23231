"""Graph compilers ("backends") and their registry; see ``registry``."""
from .registry import list_backends, lookup_backend, register_backend

__all__ = ["list_backends", "lookup_backend", "register_backend"]

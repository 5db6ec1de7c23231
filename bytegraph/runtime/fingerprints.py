"""Fingerprints of code for the persistent cache (``persist.py``): a hash of bytegraph's own
sources, of a source file (kept per path while its mtime and size hold), of what a code object
does, and the fingerprints of the code a trace ran, checked again before a saved entry is used."""
from __future__ import annotations

import hashlib
import os
import sys
import types

import torch


class NotPortable(Exception):
    """Something in a compiled frame cannot be carried to another process."""


_package_hash = [None]
_file_hashes = {}     # path -> (mtime_ns, size, sha256)


def bytegraph_hash():
    if _package_hash[0] is None:
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        h = hashlib.sha256()
        for dirpath, dirnames, filenames in sorted(os.walk(root)):
            dirnames.sort()
            for name in sorted(filenames):
                if name.endswith(".py"):
                    path = os.path.join(dirpath, name)
                    h.update(os.path.relpath(path, root).encode())
                    with open(path, "rb") as f:
                        h.update(f.read())
        _package_hash[0] = h.hexdigest()
    return _package_hash[0]


def _file_hash(path):
    try:
        st = os.stat(path)
    except OSError:
        return None
    known = _file_hashes.get(path)
    if known is not None and known[0] == st.st_mtime_ns and known[1] == st.st_size:
        return known[2]
    with open(path, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    _file_hashes[path] = (st.st_mtime_ns, st.st_size, digest)
    return digest


def code_hash(code):
    """A hash of what a code object does (marshal's bytes depend on reference counts)."""
    h = hashlib.sha256()
    _hash_code(code, h)
    return h.hexdigest()


def _hash_code(code, h):
    h.update(repr((code.co_argcount, code.co_posonlyargcount, code.co_kwonlyargcount, code.co_flags,
                   code.co_names, code.co_varnames, code.co_freevars, code.co_cellvars, code.co_qualname,
                   code.co_firstlineno)).encode())
    h.update(code.co_code)
    h.update(code.co_exceptiontable)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            _hash_code(const, h)
        else:
            h.update(type(const).__name__.encode())
            h.update(repr(const).encode())


_LIBRARY_DIRS = tuple(os.path.dirname(os.path.abspath(m.__file__)) + os.sep for m in (torch, os))


def code_fingerprints(codes):
    """[(filename, file hash, module, qualname, code hash)] for the code objects a trace ran
    (library code is covered by the versions in the key)."""
    out = []
    for code, module in codes.items():
        filename = code.co_filename
        if os.path.abspath(filename).startswith(_LIBRARY_DIRS):
            continue
        digest = _file_hash(filename)
        if digest is None:
            raise NotPortable(f"{code.co_qualname} has no source file ({filename})")
        out.append((filename, digest, module, code.co_qualname, code_hash(code)))
    return out


def _find_code(module, qualname):
    """The code of the function ``module.qualname`` names now, or None."""
    if module is None or "<" in qualname:
        return None
    obj = sys.modules.get(module)
    for part in qualname.split("."):
        if obj is None:
            return None
        obj = (obj.__dict__.get(part) if isinstance(obj, type) else getattr(obj, part, None))
    for attr in ("__func__", "fget"):
        obj = getattr(obj, attr, obj) if isinstance(obj, (staticmethod, classmethod, property)) else obj
    return getattr(obj, "__code__", None)


def fingerprints_hold(prints):
    for filename, digest, module, qualname, saved_hash in prints:
        if _file_hash(filename) != digest:
            return f"{filename} changed"
        code = _find_code(module, qualname)
        if code is not None and code.co_qualname == qualname and code.co_filename == filename \
                and code_hash(code) != saved_hash:
            return f"{module}.{qualname} is other code now"
    return None
